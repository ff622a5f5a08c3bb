"""Widgets the console's screens share."""

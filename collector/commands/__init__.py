"""Subcommands of the `collector` CLI, one module each (see collector/cli.py)."""

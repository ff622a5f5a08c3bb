"""Subcommands of the `verifierd` CLI, one module each (see verifierd/cli.py)."""

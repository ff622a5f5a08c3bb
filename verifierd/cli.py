"""The `verifierd` command line: one subcommand per module in `verifierd.commands`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from appliance.command_line import build_parser as build_command_parser
from appliance.command_line import run_command
from verifierd import commands


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or with ``argv`` of the one it runs (only that
    command's module is imported)."""
    return build_command_parser(
        "verifierd",
        "veritap verifier: recompute inference and keep signed verdicts",
        commands,
        argv,
    )


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser, argv)


if __name__ == "__main__":
    sys.exit(main())

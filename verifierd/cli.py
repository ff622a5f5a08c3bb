"""The `verifierd` command line: one subcommand per module in `verifierd.commands`.

Each module there defines `register(subparsers)`, which adds its parser and
sets `func` (a callable taking the parsed namespace and returning an exit
code). Adding a command is adding a file.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys
from collections.abc import Sequence

from appliance.journal import setup_logging
from verifierd import commands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="verifierd",
        description="veritap verifier: recompute inference and keep signed verdicts",
    )
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more logging (-vv: debug)"
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    setup_logging("verifierd", level)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())

"""The daemons' command lines: one subcommand per module of a `commands` package.

Each module there defines `register(subparsers)`, which adds its parser and
sets `func` (a callable taking the parsed namespace and returning an exit
code). Adding a command is adding a file. Logging goes to journald and stderr
(appliance.journal), at WARNING unless -v is given.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
from collections.abc import Sequence
from types import ModuleType

from appliance.journal import setup_logging


def build_parser(prog: str, description: str, commands: ModuleType) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more logging (-vv: debug)"
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        module.register(subparsers)
    return parser


def run_command(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    """Parse `argv`, set up logging under the parser's name, run the chosen command."""
    args = parser.parse_args(argv)
    setup_logging(parser.prog, logging.WARNING - 10 * min(args.verbose, 2))
    code: int = args.func(args)
    return code

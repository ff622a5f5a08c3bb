"""The daemons' command lines: one subcommand per module of a `commands` package.

Each module there defines `register(subparsers)`, which adds its parser and
sets `func` (a callable taking the parsed namespace and returning an exit
code). Adding a command is adding a file. Logging goes to journald and stderr
(appliance.journal), at WARNING unless -v is given; a daemon's `run` then applies its
config's `[log] level` (`apply_log_level`), so the units pass no -v.

Exit codes: 0 done, 1 the command's own failure, 2 a usage or runtime error, and
`EXIT_CONFIG` (78, sysexits' EX_CONFIG) for a configuration the daemon refuses: the units
list it in `RestartPreventExitStatus=`, since restarting cannot fix a bad file.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
from collections.abc import Sequence
from types import ModuleType

from veritap.version import package_version

from appliance.journal import setup_logging

#: A configuration error (sysexits.h EX_CONFIG): systemd does not restart on it.
EXIT_CONFIG = 78


def build_parser(prog: str, description: str, commands: ModuleType) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
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


def apply_log_level(args: argparse.Namespace, level: int) -> None:
    """A daemon's configured level; -v on the command line may only make it more verbose."""
    root = logging.getLogger()
    root.setLevel(level if args.verbose == 0 else min(level, root.level))

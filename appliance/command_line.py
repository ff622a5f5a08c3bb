"""The daemons' command lines: one subcommand per module of a `commands` package.

Each module there defines `register(subparsers)`, which adds its parser, named after the
module (`check_config` registers `check-config`), and sets `func` (a callable taking the
parsed namespace and returning an exit code). Adding a command is adding a file. A command
line imports only the module of the command it runs (its first argument that is not an
option), so `collector replay` or `verifierd check-config` pays for no other command's
imports and `--version` for none; help, a missing or an unknown command import them all,
so argparse lists every command as it would. Logging goes to journald and stderr
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
import re
import sys
from collections.abc import Callable, Sequence
from types import ModuleType

from veritap.version import package_version

from appliance.journal import setup_logging

#: A configuration error (sysexits.h EX_CONFIG): systemd does not restart on it.
EXIT_CONFIG = 78

#: The options before a command that need no command's parser: -v, -vv, ..., --verbose.
_VERBOSE = re.compile(r"-v+|--verbose")


def build_parser(
    prog: str, description: str, commands: ModuleType, argv: Sequence[str] | None = None
) -> argparse.ArgumentParser:
    """The parser of every command in `commands`; with `argv`, of only the commands that
    parsing it needs (:func:`modules_for`)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more logging (-vv: debug)"
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules = command_modules(commands)
    for name in modules.values() if argv is None else modules_for(argv, modules):
        module = importlib.import_module(f"{commands.__name__}.{name}")
        module.register(subparsers)
    return parser


def command_modules(commands: ModuleType) -> dict[str, str]:
    """Each command of the package `commands` by name: command name -> module name."""
    names = sorted(info.name for info in pkgutil.iter_modules(commands.__path__))
    return {name.replace("_", "-"): name for name in names}


def modules_for(argv: Sequence[str], modules: dict[str, str]) -> list[str]:
    """The command modules that parsing `argv` needs, of `modules` (command -> module).

    Only the options before the command are read, in argparse's order: `-v`s go on,
    `--version` ends the parse before any command is needed (none), and anything else
    (`-h`, an abbreviation, an unknown option, `--`) may need every command listed, as may
    a missing or an unknown command (all)."""
    for arg in argv:
        if arg == "--version":
            return []
        if not arg.startswith("-"):
            chosen = modules.get(arg)
            return list(modules.values()) if chosen is None else [chosen]
        if not _VERBOSE.fullmatch(arg):
            break
    return list(modules.values())


def run_command(
    build: Callable[[Sequence[str]], argparse.ArgumentParser], argv: Sequence[str] | None
) -> int:
    """Parse `argv` (default: the process's arguments) with the parser `build` makes for
    it, set up logging under the parser's name, run the chosen command."""
    arguments = sys.argv[1:] if argv is None else list(argv)
    parser = build(arguments)
    args = parser.parse_args(arguments)
    setup_logging(parser.prog, logging.WARNING - 10 * min(args.verbose, 2))
    code: int = args.func(args)
    return code


def apply_log_level(args: argparse.Namespace, level: int) -> None:
    """A daemon's configured level; -v on the command line may only make it more verbose."""
    root = logging.getLogger()
    root.setLevel(level if args.verbose == 0 else min(level, root.level))

"""`verifierd run --config FILE`: the daemon (store, scheduler, engines, services)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from veritap.config_schema import ConfigError
from veritap.signing import SigningError

from appliance.command_line import EXIT_CONFIG, apply_log_level
from verifierd.config import load_config
from verifierd.errors import VerifierdError


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "run", help="run the verifier daemon until SIGTERM"
    )
    parser.add_argument("--config", type=Path, help="verifierd TOML file (default: defaults)")
    parser.add_argument(
        "--reverify",
        action="store_true",
        help="hash every committed file before its first use instead of trusting the stamps",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        sys.stderr.write(f"verifierd run: {exc}\n")
        return EXIT_CONFIG
    apply_log_level(args, config.log.level.number)
    # Imported here: the daemon brings torch, which the other subcommands do without.
    from verifierd.daemon import Daemon

    try:
        return asyncio.run(Daemon(config, reverify=args.reverify).run())
    except (VerifierdError, SigningError, OSError) as exc:
        sys.stderr.write(f"verifierd run: {exc}\n")
        return 2

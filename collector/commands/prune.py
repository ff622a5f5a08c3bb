"""`collector prune-log --before SEQ`: drop old entries, never one a verifier has not stored.

Every verifier listed in `ledger.verifiers` must have acknowledged seq `BEFORE - 1` (as
recorded in the acknowledgement file the LedgerService keeps); otherwise nothing is
deleted and the command names the verifier holding the prune back. The log is opened for
writing, so the daemon appending to it must not be running.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from veritap.toml_section import ConfigError

from collector.config import load_config
from collector.ledger.config import LedgerConfig
from collector.ledger.errors import LedgerError
from collector.ledger.retention import AckBook, check_prune
from collector.log import Log, LogError


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "prune-log", help="delete entries below a seq that every verifier has acknowledged"
    )
    parser.add_argument("--config", type=Path, help="collector TOML file")
    parser.add_argument("--log", type=Path, help="the log directory, overriding log.path")
    parser.add_argument("--origin", help="the log's origin, overriding collector.origin")
    parser.add_argument(
        "--before", type=int, required=True, metavar="SEQ", help="new retention floor"
    )
    parser.set_defaults(func=run)


def prune_log(log_dir: Path, origin: str, config: LedgerConfig, before_seq: int) -> tuple[int, int]:
    """Prune after checking the acknowledgements; returns (entries deleted, retention floor)."""
    book = AckBook.load(config.acks_path(log_dir))
    check_prune(book, config.verifiers, before_seq)
    with Log.open(log_dir, origin=origin) as log:
        deleted = log.prune(before_seq)
        return deleted, log.retention_floor


def run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
        deleted, floor = prune_log(
            args.log or config.log.path, args.origin or config.origin, config.ledger, args.before
        )
    except (ConfigError, LedgerError, LogError) as exc:
        sys.stderr.write(f"collector prune-log: {exc}\n")
        return 1
    sys.stdout.write(f"pruned {deleted} entries; the retention floor is {floor}\n")
    return 0

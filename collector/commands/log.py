"""`collector log`: check, export, describe and prune a log directory.

`collector log prune [DIR] --config F --before SEQ` drops the entries below SEQ, never one
a verifier has not stored: every verifier listed in the config's `ledger.verifiers` must
have acknowledged seq `SEQ - 1` (as recorded in the acknowledgement file the
LedgerService keeps); otherwise nothing is deleted and the command names the verifier
holding the prune back. The config is required because it names those verifiers. The log
is opened for writing, so the daemon appending to it must not be running.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from veritap.config_schema import ConfigError
from veritap.envelope import EnvelopeError
from veritap.signing import KeyFormatError, Verifier

from collector.config import load_config
from collector.ledger.config import LedgerConfig
from collector.ledger.errors import LedgerError
from collector.ledger.retention import AckBook, check_prune
from collector.log import Log, LogError
from collector.log.audit import audit_log
from collector.log.export import jsonl_lines


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("log", help="check, export, describe or prune a log")
    actions = parser.add_subparsers(dest="log_command", required=True, metavar="ACTION")

    verify = actions.add_parser(
        "verify",
        help="check the whole log: chain, hashes, checkpoint signatures and roots",
        description=(
            "Walk every entry and checkpoint of the log in DIR. Prints a summary and exits 0 "
            "when all is well; otherwise names the first bad entry (seq and what is wrong) on "
            "stderr and exits 1."
        ),
    )
    verify.add_argument("dir", type=Path)
    verify.add_argument(
        "--pubkey", required=True, type=Path, help="file holding the C2SP verifier key"
    )
    verify.set_defaults(func=run_verify)

    export = actions.add_parser(
        "export",
        help="print one JSON object per record (see collector/log/export.py for the keys)",
    )
    export.add_argument("dir", type=Path)
    export.add_argument("--format", choices=["jsonl"], default="jsonl")
    export.add_argument("--from", dest="from_seq", type=int, default=None, metavar="SEQ")
    export.add_argument(
        "--with-bodies",
        action="store_true",
        help="add each record's request and response bodies (request_body, response_body)",
    )
    export.set_defaults(func=run_export)

    info = actions.add_parser("info", help="print the log's origin, head, floor and checkpoints")
    info.add_argument("dir", type=Path)
    info.set_defaults(func=run_info)

    prune = actions.add_parser(
        "prune",
        help="delete entries below a seq that every configured verifier has acknowledged",
        description=(
            "Delete the entries below SEQ and raise the retention floor to SEQ, only when "
            "every verifier in the config's ledger.verifiers has acknowledged SEQ - 1; "
            "otherwise delete nothing, name the verifier holding it back and exit 1. "
            "Stop the collector first: the log is opened for writing."
        ),
    )
    prune.add_argument(
        "dir", type=Path, nargs="?", default=None, help="the log directory (default: log.path)"
    )
    prune.add_argument(
        "--config", type=Path, required=True, help="collector TOML file (names the verifiers)"
    )
    prune.add_argument("--origin", help="the log's origin, overriding collector.origin")
    prune.add_argument(
        "--before", type=int, required=True, metavar="SEQ", help="the new retention floor"
    )
    prune.set_defaults(func=run_prune)


def run_verify(args: argparse.Namespace) -> int:
    try:
        key = Verifier.load(args.pubkey)
    except KeyFormatError as exc:
        print(f"collector log verify: {exc}", file=sys.stderr)
        return 2
    report = audit_log(args.dir, key)
    if report.problem is not None:
        print(f"collector log verify: {args.dir}: FAIL {report.problem}", file=sys.stderr)
        return 1
    print(
        f"{args.dir}: ok: origin {report.origin}, entries {report.floor}..{report.head_seq} "
        f"({report.entries} checked), {report.checkpoints} checkpoints verified"
    )
    return 0


def run_export(args: argparse.Namespace) -> int:
    try:
        with Log.open_readonly(args.dir) as log:
            start = args.from_seq if args.from_seq is not None else log.retention_floor
            for line in jsonl_lines(log.iter_entries(start), with_bodies=args.with_bodies):
                sys.stdout.write(line)
    except (LogError, EnvelopeError) as exc:
        print(f"collector log export: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
    return 0


def run_info(args: argparse.Namespace) -> int:
    try:
        with Log.open_readonly(args.dir) as log:
            stats = log.stats()
            head = log.head()
            checkpoint = log.latest_checkpoint()
            origin, key_id = log.origin, log.key_id
    except LogError as exc:
        print(f"collector log info: {exc}", file=sys.stderr)
        return 1
    print(f"origin          {origin}")
    print(f"key id          {key_id.hex() or '(none)'}")
    print(f"head            seq {head.seq} hash {head.hash.hex()}")
    print(f"retention floor {stats.retention_floor}")
    print(f"checkpoints     {stats.checkpoints} (latest tree size {stats.last_checkpoint_size})")
    if checkpoint is not None:
        print(f"latest root     {checkpoint.root_hash.hex()}")
    print(f"map size        {stats.map_size}")
    return 0


def prune_log(log_dir: Path, origin: str, config: LedgerConfig, before_seq: int) -> tuple[int, int]:
    """Prune after checking the acknowledgements; returns (entries deleted, retention floor)."""
    book = AckBook.load(config.acks_path(log_dir))
    check_prune(book, config.verifiers, before_seq)
    with Log.open(log_dir, origin=origin) as log:
        deleted = log.prune(before_seq)
        return deleted, log.retention_floor


def run_prune(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
        deleted, floor = prune_log(
            args.dir or config.log.path, args.origin or config.origin, config.ledger, args.before
        )
    except (ConfigError, LedgerError, LogError) as exc:
        print(f"collector log prune: {exc}", file=sys.stderr)
        return 1
    print(f"pruned {deleted} entries; the retention floor is {floor}")
    return 0

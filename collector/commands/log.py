"""`collector log`: check, export and describe a log directory."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from veritap.envelope import EnvelopeError
from veritap.signing import KeyFormatError, Verifier

from collector.log import Log, LogError
from collector.log.audit import audit_log
from collector.log.export import jsonl_lines


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("log", help="check, export or describe a log")
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
    export.set_defaults(func=run_export)

    info = actions.add_parser("info", help="print the log's origin, head, floor and checkpoints")
    info.add_argument("dir", type=Path)
    info.set_defaults(func=run_info)


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
            for line in jsonl_lines(log.iter_entries(start)):
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

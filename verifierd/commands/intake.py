"""`verifierd intake`: run the intake alone, or inspect and clear intake alerts.

`verifierd intake --config F` runs only the intake (collectors -> verified store entries).
`verifierd run` starts the intake together with the scheduler and the gRPC service; this
command runs it alone, for operations (catching up a store) and for the crash tests.
SIGTERM or SIGINT stops it; an alert on every collector ends it with exit code 3.

When a collector's log contradicts what was verified (fork, rollback, gap, bad
signature), intake from it stops and the evidence is kept. Two actions talk to the
running daemon's VerifierService (connection options as in `verifierd verdicts`):

`verifierd intake alerts [--cleared] [--json]` lists the alerts in force with a summary
of their evidence (with --cleared, also the cleared ones: who, when, why).

`verifierd intake clear ORIGIN --reason TEXT` (admin certificate) resumes intake from
that collector, but only when its log agrees again with what this verifier stored (e.g.
the alert was transient, or the collector's log was restored from a backup); otherwise it
prints why not and exits 1. The alert and its evidence stay in the store, marked
cleared, and the audit log records who cleared it, when and why.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
from veritap.signing import SigningError
from veritap.tls import TlsConfigError
from veritap.v1 import verifier_pb2, verifier_pb2_grpc

from verifierd.client_options import connection_parser, open_channel
from verifierd.commands.verdicts import json_line
from verifierd.config import Config, load_config
from verifierd.errors import VerifierdError
from verifierd.intake import Intake
from verifierd.store import Store


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "intake",
        help="run the intake alone; list or clear intake alerts",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", type=Path, help="verifierd TOML file")
    parser.set_defaults(func=run)
    actions = parser.add_subparsers(dest="intake_action", metavar="[ACTION]")
    connection = connection_parser(timeout_s=30.0)

    alerts = actions.add_parser(
        "alerts", parents=[connection], help="intake alerts with a summary of their evidence"
    )
    alerts.add_argument("--cleared", action="store_true", help="the cleared ones too")
    alerts.add_argument("--json", action="store_true", help="JSON lines, evidence in full")
    alerts.set_defaults(func=lambda args: _call(args, _alerts))

    clear = actions.add_parser(
        "clear",
        parents=[connection],
        help="resume intake from a collector after an alert (admin; audited)",
    )
    clear.add_argument("origin", help="the collector's origin")
    clear.add_argument("--reason", required=True, help="why (kept in the audit log)")
    clear.set_defaults(func=lambda args: _call(args, _clear))


async def run_intake(config: Config) -> int:
    store = Store.open(config.store_dir, map_size=int(config.store.map_size_gib * (1 << 30)))
    try:
        intake = Intake(store, config)
        await intake.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        waiter = asyncio.create_task(stop.wait())
        links = asyncio.create_task(intake.wait())
        await asyncio.wait({waiter, links}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        await intake.stop()
        alerted = all(link.alert_reason for link in intake.links)
        return 3 if alerted and intake.links else 0
    finally:
        store.close()


def run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
        return asyncio.run(run_intake(config))
    except (VerifierdError, SigningError, OSError, ValueError) as exc:
        sys.stderr.write(f"verifierd intake: {exc}\n")
        return 2


# -- alerts over gRPC -------------------------------------------------------------------

_Action = Callable[
    ["verifier_pb2_grpc.VerifierServiceAsyncStub", argparse.Namespace], Awaitable[int]
]


def _call(args: argparse.Namespace, action: _Action) -> int:
    async def main() -> int:
        async with open_channel(args) as channel:
            return await action(verifier_pb2_grpc.VerifierServiceStub(channel), args)

    name = f"verifierd intake {args.intake_action}"
    try:
        return asyncio.run(main())
    except TlsConfigError as exc:
        sys.stderr.write(f"{name}: {exc}\n")
        return 2
    except grpc.aio.AioRpcError as exc:
        sys.stderr.write(f"{name}: {exc.code().name}: {exc.details()}\n")
        return 1


async def _alerts(
    stub: verifier_pb2_grpc.VerifierServiceAsyncStub, args: argparse.Namespace
) -> int:
    request = verifier_pb2.ListIntakeAlertsRequest(include_cleared=args.cleared)
    response = await stub.ListIntakeAlerts(request, timeout=args.timeout)
    for alert in response.alerts:
        sys.stdout.write(json_line(alert) + "\n" if args.json else alert_summary(alert))
    if not response.alerts and not args.json:
        sys.stdout.write("no intake alerts\n")
    return 0


async def _clear(stub: verifier_pb2_grpc.VerifierServiceAsyncStub, args: argparse.Namespace) -> int:
    request = verifier_pb2.ClearIntakeAlertRequest(origin=args.origin, reason=args.reason)
    response = await stub.ClearIntakeAlert(request, timeout=args.timeout)
    cleared = response.cleared
    sys.stdout.write(
        f"cleared the {cleared.reason} alert of {cleared.origin}; intake resumes\n"
        f"  check: {cleared.clear_check}\n"
    )
    return 0


def _utc(ns: int) -> str:
    when = datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.UTC)
    return when.strftime("%Y-%m-%d %H:%M:%SZ")


def _short(digest: bytes) -> str:
    return digest.hex()[:16] + "…" if digest else "-"


def alert_summary(alert: verifier_pb2.IntakeAlert) -> str:
    """A few lines a person can read: what stopped intake, and the evidence kept."""
    evidence = alert.evidence
    state = "CLEARED" if alert.cleared_at_ns else "IN FORCE"
    lines = [
        f"{alert.origin}  {alert.reason}  {state}  detected {_utc(alert.detected_at_ns)}",
        f"  detail: {evidence.detail or '-'}",
        f"  stored up to seq {evidence.cursor_seq} (entry hash {_short(evidence.cursor_hash)})"
        + (
            f"; the collector's entry there: {_short(evidence.remote_hash)}"
            if evidence.remote_hash
            else ""
        ),
    ]
    for checkpoint in evidence.checkpoints:
        lines.append(
            f"  signed checkpoint: size {checkpoint.tree_size} root {_short(checkpoint.root_hash)}"
        )
    if evidence.entries:
        seqs = [entry.seq for entry in evidence.entries]
        lines.append(f"  entries kept: {len(seqs)} (seq {min(seqs)}..{max(seqs)})")
    if alert.cleared_at_ns:
        lines.append(
            f"  cleared {_utc(alert.cleared_at_ns)} by {alert.cleared_by}: {alert.clear_reason}"
        )
        lines.append(f"  check: {alert.clear_check}")
    return "\n".join(lines) + "\n"

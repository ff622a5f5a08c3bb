"""`verifierd provers`: the provers this verifier judges, their statistics and alarms.

A prover is one server address and port as one collector sees it. Both actions ask the
running daemon's VerifierService (connection options as in `verifierd verdicts`):

`verifierd provers list [--alarmed] [--json]`: one line per prover: its name
(ORIGIN/ADDRESS:PORT), the alarms in force, the sequential test's statistic against
its bound, the tokens it pooled, and its verdicts and unverifiable share over the
shortest window.

`verifierd provers show PROVER [--json]`: one prover in full: every window's counts by
status and reason, the share of its sampled verdicts (temperature above 0; greedy
requests need no seed) that came without a seed (UNVERIFIABLE no_seed: what a site's
seed gateway leaves unseeded, or traffic around it), its alarms
(in force and cleared) with the records that drove them, and its latest test statistic;
and per commitment its test's number among the prover's tests and its share of the
prover's false-alarm probability (the bound holds per prover, across its commitments).

Captured strings are printed with control characters escaped; --json prints protobuf's
JSON mapping (`.proto` field names), one object per line.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from veritap.control_chars import escape_controls
from veritap.tls import TlsConfigError
from veritap.v1 import verifier_pb2, verifier_pb2_grpc

from verifierd.client_options import connection_parser, open_channel
from verifierd.commands.verdicts import json_line
from verifierd.provers.identity import ProverKey, ProverKeyError

# The async stub class exists for type checkers only.
Action = Callable[
    ["verifier_pb2_grpc.VerifierServiceAsyncStub", argparse.Namespace], Awaitable[int]
]


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "provers",
        help="the provers judged: statistics, test statistic, alarms",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="provers_action", metavar="ACTION", required=True)
    connection = connection_parser(timeout_s=30.0)
    listing = actions.add_parser("list", parents=[connection], help="one line per prover")
    listing.add_argument("--alarmed", action="store_true", help="only those with an alarm")
    listing.add_argument("--json", action="store_true", help="JSON lines")
    listing.set_defaults(func=lambda args: call_verifier(args, "verifierd provers list", _list))
    show = actions.add_parser("show", parents=[connection], help="one prover in full")
    show.add_argument("prover", help="ORIGIN/ADDRESS:PORT (as `provers list` names it)")
    show.add_argument("--json", action="store_true", help="one JSON object")
    show.set_defaults(func=lambda args: call_verifier(args, "verifierd provers show", _show))


def call_verifier(args: argparse.Namespace, name: str, action: Action) -> int:
    """Run ``action`` against the VerifierService: exit 1 when the call is refused or
    fails (the gRPC status on stderr), 2 on a bad TLS setting or argument."""

    async def main() -> int:
        async with open_channel(args) as channel:
            return await action(verifier_pb2_grpc.VerifierServiceStub(channel), args)

    try:
        return asyncio.run(main())
    except (TlsConfigError, ProverKeyError) as exc:
        sys.stderr.write(f"{name}: {exc}\n")
        return 2
    except grpc.aio.AioRpcError as exc:
        sys.stderr.write(f"{name}: {exc.code().name}: {exc.details()}\n")
        return 1


async def _list(stub: verifier_pb2_grpc.VerifierServiceAsyncStub, args: argparse.Namespace) -> int:
    request = verifier_pb2.ListProversRequest(alarmed_only=args.alarmed)
    response = await stub.ListProvers(request, timeout=args.timeout)
    for prover in response.provers:
        sys.stdout.write(json_line(prover) + "\n" if args.json else prover_line(prover))
    if not response.provers and not args.json:
        sys.stdout.write("no provers\n")
    return 0


async def _show(stub: verifier_pb2_grpc.VerifierServiceAsyncStub, args: argparse.Namespace) -> int:
    request = verifier_pb2.GetProverRequest(id=ProverKey.parse(args.prover).to_proto())
    response = await stub.GetProver(request, timeout=args.timeout)
    sys.stdout.write(json_line(response) + "\n" if args.json else prover_details(response))
    return 0


def utc(ns: int) -> str:
    when = datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.UTC)
    return when.strftime("%Y-%m-%d %H:%M:%SZ")


def _name(prover: verifier_pb2.Prover) -> str:
    return escape_controls(ProverKey.of_proto(prover.id).label)


def _kind(kind: int) -> str:
    return verifier_pb2.AlarmKind.Name(kind).removeprefix("ALARM_KIND_")  # type: ignore[arg-type]


def _state(prover: verifier_pb2.Prover) -> str:
    kinds = sorted(
        {
            verifier_pb2.AlarmKind.Name(a.alarm.kind).removeprefix("ALARM_KIND_")
            for a in prover.alarms
        }
    )
    return "ALARM " + ",".join(kinds) if kinds else "ok"


def _evidence(prover: verifier_pb2.Prover) -> str:
    if not prover.evidence_bound:
        return "no test (no honest tails)"
    return (
        f"ln E {prover.evidence:.2f} / bound {prover.evidence_bound:.2f} "
        f"over {prover.pooled_tokens} tokens"
    )


def prover_line(prover: verifier_pb2.Prover) -> str:
    window = prover.windows[0]
    return (
        f"{_name(prover)}  {_state(prover)}  {_evidence(prover)}  "
        f"{window.verdicts} verdicts in {window.window_s} s, "
        f"{window.unverifiable_ratio:.1%} unverifiable\n"
    )


def alarm_lines(state: verifier_pb2.AlarmState) -> list[str]:
    alarm = state.alarm
    kind = _kind(alarm.kind)
    reason = f" ({escape_controls(alarm.reason)})" if alarm.reason else ""
    lines = [
        f"  alarm {alarm.alarm_id}  {kind}{reason}  raised {utc(alarm.raised_at_ns)}  "
        + ("CLEARED" if state.cleared_at_ns else "IN FORCE"),
        f"    {escape_controls(alarm.detail)}",
        f"    records: {escape_controls(' '.join(alarm.record_ids)) or '-'}",
    ]
    if state.cleared_at_ns:
        lines.append(
            f"    cleared {utc(state.cleared_at_ns)} by {escape_controls(state.cleared_by)}: "
            f"{escape_controls(state.clear_reason)}"
        )
    return lines


def prover_details(response: verifier_pb2.GetProverResponse) -> str:
    prover = response.prover
    lines = [
        f"{_name(prover)}  {_state(prover)}",
        f"  seen {utc(prover.first_seen_ns)} .. {utc(prover.last_seen_ns)}",
        f"  commitments: {' '.join(prover.commitment_ids) or '-'}",
        f"  test: {_evidence(prover)}",
    ]
    lines += [
        f"    test {t.number} ({escape_controls(t.commitment_id)}): share {t.alpha_share:.3g} of "
        f"the prover's false-alarm probability, {t.false_alarm_per_day:.3g} per day; "
        f"ln E {t.evidence:.2f} / bound {t.evidence_bound:.2f} over {t.pooled_tokens} tokens"
        for t in prover.tests
    ]
    for window in prover.windows:
        span = f"last {window.window_s} s" if window.window_s else "since first seen"
        lines.append(
            f"  {span}: {window.verdicts} verdicts, {window.tokens_scored} tokens scored "
            f"({window.inexact_tokens} not exact), {window.unverifiable_ratio:.1%} unverifiable"
        )
        lines.append(
            f"    sampled without a seed: {window.unseeded_share:.1%} of "
            f"{window.needs_seed_verdicts} sampled verdicts"
        )
        for count in window.counts:
            status = verifier_pb2.VerdictStatus.Name(count.status).removeprefix("VERDICT_STATUS_")
            reason = f" {escape_controls(count.reason)}" if count.reason else ""
            lines.append(f"    {status}{reason}: {count.count}")
    for state in response.alarms:
        lines += alarm_lines(state)
    return "\n".join(lines) + "\n"

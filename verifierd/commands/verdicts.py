"""`verifierd verdicts list|get|watch`: query a running verifierd's VerifierService.

Each prints JSON lines (one message per line, protobuf's JSON mapping with the .proto
field names), so scripts can pipe them into `jq`; a verdict's checkpoint root hash (the
signed Merkle root that authenticated its entry) is written in hex, as the collector's
checkpoints print it, not in the mapping's base64. The prover's text in them (model names,
details) keeps its characters, but those a terminal acts on (controls, bidi overrides)
are written as JSON \\u escapes, so printing a line never drives the terminal.

Connection: --address (default the service's default listen address), and for TLS --ca
(the CA that issued verifierd's certificate) with --cert/--key (this client's
certificate for mutual TLS).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message
from veritap.control_chars import json_text
from veritap.tls import TlsConfigError
from veritap.v1 import verifier_pb2, verifier_pb2_grpc

from verifierd.client_options import connection_parser, open_channel

_STATUS_PREFIX = "VERDICT_STATUS_"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "verdicts",
        help="list, get or watch verdicts over gRPC (JSON lines)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    connection = connection_parser(timeout_s=10.0)

    listing = actions.add_parser(
        "list", parents=[connection], help="verdicts, oldest first (or the newest N)"
    )
    listing.add_argument("--commitment", default="", help="commitment id")
    listing.add_argument("--model", default="", help="served model name")
    listing.add_argument(
        "--status", action="append", type=parse_status, default=[], help="PASS, FAIL, ..."
    )
    listing.add_argument(
        "--from", dest="from_ns", type=parse_time, default=0, help="ISO time or ns"
    )
    listing.add_argument("--to", dest="to_ns", type=parse_time, default=0, help="ISO time or ns")
    listing.add_argument("--min-score", type=float)
    listing.add_argument("--max-score", type=float)
    listing.add_argument("--page-size", type=int, default=500)
    listing.add_argument("--limit", type=int, default=0, help="stop after this many (0: all)")
    listing.add_argument(
        "--newest", type=int, default=0, metavar="N", help="the newest N (<= 1000), newest first"
    )
    listing.set_defaults(func=lambda args: _run(args, _list))

    getting = actions.add_parser("get", parents=[connection], help="one record's verdict")
    getting.add_argument("record_id")
    getting.add_argument("--origin", default="", help="collector origin, when ids collide")
    getting.add_argument(
        "--record", action="store_true", help="the record with its per-token margins instead"
    )
    getting.set_defaults(func=lambda args: _run(args, _get))

    watching = actions.add_parser("watch", parents=[connection], help="new verdicts as decided")
    watching.add_argument("--commitment", default="", help="commitment id")
    watching.add_argument("--status", action="append", type=parse_status, default=[])
    watching.add_argument("--count", type=int, default=0, help="exit after this many (0: never)")
    watching.set_defaults(func=lambda args: _run(args, _watch))


def parse_status(text: str) -> int:
    name = text.strip().upper()
    if not name.startswith(_STATUS_PREFIX):
        name = _STATUS_PREFIX + name
    try:
        return verifier_pb2.VerdictStatus.Value(name)
    except ValueError:
        names = verifier_pb2.VerdictStatus.keys()
        choices = ", ".join(n[len(_STATUS_PREFIX) :] for n in names)
        raise argparse.ArgumentTypeError(f"unknown status {text!r} (one of {choices})") from None


def parse_time(text: str) -> int:
    """ns since the epoch: an integer, or an ISO 8601 time (UTC when it names no zone)."""
    if text.isdigit():
        return int(text)
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time or ns: {text!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    seconds = int(when.timestamp())
    return seconds * 1_000_000_000 + when.microsecond * 1000


def json_line(message: Message) -> str:
    data = json_format.MessageToDict(message, preserving_proto_field_name=True)
    _hex_checkpoint_roots(message, data)
    return json_text(data, sort_keys=True)


def _hex_checkpoint_roots(message: Message, data: dict[str, Any]) -> None:
    """Rewrite, in ``message``'s JSON ``data``, each Verdict's checkpoint root in hex (the
    Verdict itself, or one held in a message field at any depth)."""
    if isinstance(message, verifier_pb2.Verdict) and message.checkpoint_root_hash:
        data["checkpoint_root_hash"] = message.checkpoint_root_hash.hex()
    for field, value in message.ListFields():
        if field.message_type is not None and not field.is_repeated:
            _hex_checkpoint_roots(value, data[field.name])


# The async stub class exists for type checkers only.
_Action = Callable[
    ["verifier_pb2_grpc.VerifierServiceAsyncStub", argparse.Namespace], AsyncIterator[Message]
]


def _run(args: argparse.Namespace, action: _Action) -> int:
    async def main() -> None:
        async with open_channel(args) as channel:
            stub = verifier_pb2_grpc.VerifierServiceStub(channel)
            async for message in action(stub, args):
                sys.stdout.write(json_line(message) + "\n")
                sys.stdout.flush()

    try:
        asyncio.run(main())
    except TlsConfigError as exc:
        print(f"verifierd verdicts: {exc}", file=sys.stderr)
        return 2
    except grpc.aio.AioRpcError as exc:
        print(f"verifierd verdicts: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


async def _list(
    stub: verifier_pb2_grpc.VerifierServiceAsyncStub, args: argparse.Namespace
) -> AsyncIterator[Message]:
    request = verifier_pb2.ListVerdictsRequest(
        commitment_id=args.commitment,
        model=args.model,
        statuses=args.status,
        from_ns=args.from_ns,
        to_ns=args.to_ns,
        page_size=args.page_size,
    )
    if args.min_score is not None:
        request.min_score = args.min_score
    if args.max_score is not None:
        request.max_score = args.max_score
    if args.newest:
        request.newest_first = True
        request.page_size = args.newest
    sent = 0
    while True:
        response = await stub.ListVerdicts(request, timeout=args.timeout)
        for verdict in response.verdicts:
            yield verdict
            sent += 1
            if sent == args.limit:
                return
        if not response.next_page_token:
            return
        request.page_token = response.next_page_token


async def _get(
    stub: verifier_pb2_grpc.VerifierServiceAsyncStub, args: argparse.Namespace
) -> AsyncIterator[Message]:
    if args.record:
        yield await stub.GetRecord(
            verifier_pb2.GetRecordRequest(record_id=args.record_id, origin=args.origin),
            timeout=args.timeout,
        )
    else:
        yield await stub.GetVerdict(
            verifier_pb2.GetVerdictRequest(record_id=args.record_id, origin=args.origin),
            timeout=args.timeout,
        )


async def _watch(
    stub: verifier_pb2_grpc.VerifierServiceAsyncStub, args: argparse.Namespace
) -> AsyncIterator[Message]:
    call = stub.WatchVerdicts(
        verifier_pb2.WatchVerdictsRequest(commitment_id=args.commitment, statuses=args.status)
    )
    sent = 0
    try:
        async for response in call:
            yield response.verdict
            sent += 1
            if sent == args.count:
                return
    finally:
        call.cancel()

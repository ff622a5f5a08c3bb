"""Pipelined requests with lost messages, end to end: crafted pcaps through `collector
replay` + `collector log export`.

A client sends six requests back to back on one connection before the server answers
any (pipelining); the server answers in order. One message is lost in the tap: a
response's head, a request, or a whole exchange. Every request the tap saw must be in
exactly one record, and so must every response it saw whole; a record holding both must
hold a request and the response that answers it (never shifted); and a response whose
request cannot be told is recorded alone, saying so (`request_unknown` in its reason),
as is each request it may have answered (`response_unknown`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.collector.pairing_calls import body_of, call, replay
from tests.openai_traffic import Call
from tests.pcapgen import CLIENT, SERVER, Conversation, Packet, write_pcap

PIPELINED = 6
LOST = 2


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pipelined(stream: bool, lose: str) -> tuple[Conversation, list[Packet], list[Call]]:
    """The connection, its packets less the lost ones, and the calls made on it."""
    conv = Conversation().handshake()
    calls = [call(i, stream=stream) for i in range(PIPELINED)]
    dropped: list[Packet] = []
    for i, c in enumerate(calls):
        (sent,) = conv.send(CLIENT, c.request(), sizes=[len(c.request())], ack=False)
        if i == LOST and lose in ("request", "exchange"):
            dropped.append(sent)
    for i, c in enumerate(calls):
        data = c.response()
        head = data.index(b"\r\n\r\n") + 4
        sent_head, *rest = conv.send(SERVER, data, sizes=[head, len(data) - head])
        if i == LOST and lose == "head":
            dropped.append(sent_head)
        if i == LOST and lose == "exchange":
            dropped += [sent_head, *rest]
    conv.close()
    return conv, [p for p in conv.packets if p not in dropped], calls


@pytest.mark.parametrize("lose", ["head", "request", "exchange"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_pipelined_requests_with_a_lost_message_are_each_one_record_never_shifted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], stream: bool, lose: str
) -> None:
    conv, packets, calls = pipelined(stream, lose)
    records = replay(capsys, write_pcap(tmp_path / "lost.pcap", conv, packets), tmp_path / "log")
    requests = [sha(c.request_json()) for c in calls]
    responses = [sha(body_of(c)) for c in calls]
    # (request number or None, response number or None, quality, reason) of each record
    got = [
        (
            _number(requests, r["request_body_sha256"]),
            _number(responses, r["response_body_sha256"]),
            r["quality"],
            str(r["quality_reason"]),
        )
        for r in records
    ]
    seen_requests = [i for i in range(PIPELINED) if i != LOST or lose == "head"]
    seen_responses = [i for i in range(PIPELINED) if i != LOST or lose == "request"]
    assert sorted(q for q, _, _, _ in got if q is not None) == seen_requests
    assert sorted(s for _, s, _, _ in got if s is not None) == seen_responses
    assert all(q == s for q, s, _, _ in got if q is not None and s is not None), got
    assert [(i, i, "complete", "") for i in range(LOST)] == got[:LOST]
    for q, s, quality, reason in got:
        if s is None:
            assert quality == "response_gap"
            assert _RESPONSE_UNKNOWN in reason or "response was lost" in reason
        elif q is None:
            assert quality == "request_gap"
            assert _REQUEST_UNKNOWN in reason or "request was lost" in reason
    unknown = [s for q, s, _, reason in got if q is None and _REQUEST_UNKNOWN in reason]
    assert unknown, "after the loss, pipelined responses cannot all be paired: said so"


_EMPTY = sha(b"")
# How records word the pairing they cannot know (ProblemKind.REQUEST_UNKNOWN, RESPONSE_UNKNOWN).
_REQUEST_UNKNOWN = "after lost messages this answers one of"
_RESPONSE_UNKNOWN = "could not be paired after lost messages"


def _number(hashes: list[str], value: object) -> int | None:
    """Which call's body `value` hashes (None: the record has no such message)."""
    if value == _EMPTY:
        return None
    return hashes.index(str(value))

"""Pairing after loss, end to end: crafted pcaps through `collector replay` + `log export`.

The zeek capture `1000-requests-one-dropped-response` rebuilt with pcapgen on the
OpenAI API paths: 1000 keep-alive exchanges on one connection, the segment holding
one response's head dropped. Every record that says `complete` must hold a request
and the response that answers it; the TAP skew case must pair cleanly.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import pytest

from tests.collector.pairing_calls import body_of, call, replay
from tests.openai_traffic import Call
from tests.pcapgen import CLIENT, SERVER, Conversation, Packet, write_pcap

EXCHANGES = 1000
DROPPED = 500


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def keep_alive_with_a_dropped_head(stream: bool) -> tuple[Conversation, list[Packet], list[Call]]:
    conv = Conversation().handshake()
    calls = [call(i, stream=stream) for i in range(EXCHANGES)]
    dropped: Packet | None = None
    for i, c in enumerate(calls):
        conv.send(CLIENT, c.request())
        data = c.response()
        head = data.index(b"\r\n\r\n") + 4
        sent = conv.send(SERVER, data, sizes=[head])
        if i == DROPPED:
            dropped = sent[0]
    conv.close()
    return conv, [p for p in conv.packets if p is not dropped], calls


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_one_dropped_response_head_in_1000_keep_alive_exchanges_shifts_no_pair(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], stream: bool
) -> None:
    conv, packets, calls = keep_alive_with_a_dropped_head(stream)
    records = replay(capsys, write_pcap(tmp_path / "dropped.pcap", conv, packets), tmp_path / "log")
    pairs = {sha(c.request_json()): sha(body_of(c)) for c in calls}
    complete = [r for r in records if r["quality"] == "complete"]
    shifted = [
        r for r in complete if pairs.get(str(r["request_body_sha256"])) != r["response_body_sha256"]
    ]
    assert not shifted
    assert len(complete) == EXCHANGES - 1
    (lost,) = [r for r in records if r["quality"] != "complete"]
    assert lost["request_body_sha256"] == sha(calls[DROPPED].request_json())
    assert lost["quality"] == "response_gap"


def test_response_captured_just_before_its_requests_last_segment_pairs_cleanly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    c = call(7, stream=True)
    conv = Conversation().handshake()
    request = conv.send(CLIENT, c.request(), ack=False)
    assert len(request) == 1
    response = conv.send(SERVER, c.response(), sizes=[200] * 50)
    conv.close()
    # A TAP merges the two directions with skew: the response's first segment is captured
    # just before the request's last (here only) one.
    last, first = request[-1], response[0]
    packets = [p for p in conv.packets if p is not last]
    packets.insert(packets.index(first) + 1, replace(last, ts=first.ts + 0.0005))
    records = replay(capsys, write_pcap(tmp_path / "skew.pcap", conv, packets), tmp_path / "log")
    (rec,) = records
    assert rec["quality"] == "complete", rec["quality_reason"]
    assert rec["request_body_sha256"] == sha(c.request_json())
    assert rec["response_body_sha256"] == sha(body_of(c))

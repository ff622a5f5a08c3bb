"""Crafted captures of an active prover through `collector replay` and `collector log export`.

Each scenario is a connection whose packets only the tap would accept (bad
checksum, short TTL), or that carries copies the tap cannot choose between,
or that hides its answer in IP fragments; the record must hold what the
client received, and never claim `complete` for bytes it may not have.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import replace
from pathlib import Path

import pytest
from veritap.v1 import record_pb2

from collector.cli import main
from collector.config import CollectorConfig
from collector.pipeline import CapturePipeline
from tests.collector.capture.fragment_frames import v4_fragment
from tests.collector.capture_scenarios import Capture, by_model, chat, sha
from tests.collector.late_copies import forged, late_copy_of_a_written_answer
from tests.pcapgen import (
    ACK,
    CLIENT,
    FIN,
    RST,
    SERVER,
    Conversation,
    Packet,
    frame,
    tcp_ip_bytes,
    write_frames,
)

ETH = 14


def _ipv4_checksum(data: bytearray) -> None:
    struct.pack_into("!H", data, ETH + 10, 0)
    total = sum(struct.unpack_from("!10H", data, ETH))
    while total > 0xFFFF:
        total = (total & 0xFFFF) + (total >> 16)
    struct.pack_into("!H", data, ETH + 10, ~total & 0xFFFF)


def with_ttl(conv: Conversation, packet: Packet, ttl: int) -> bytes:
    data = bytearray(frame(conv, packet))
    data[ETH + 8] = ttl
    _ipv4_checksum(data)
    return bytes(data)


def with_bad_checksum(conv: Conversation, packet: Packet) -> bytes:
    data = bytearray(frame(conv, packet))
    data[ETH + 20 + 16] ^= 0xFF
    return bytes(data)


def fragmented(conv: Conversation, packet: Packet, size: int = 400) -> list[bytes]:
    link = frame(conv, packet)[:ETH]
    ip = tcp_ip_bytes(conv, packet)
    body = ip[20:]
    cuts = range(0, len(body), size)
    return [link + v4_fragment(ip, at, body[at : at + size], at + size < len(body)) for at in cuts]


class HostileCapture(Capture):
    """A `Capture` whose connections may carry ready-made frames beside their packets."""

    def __init__(self) -> None:
        super().__init__()
        self.extra: list[tuple[float, bytes]] = []

    def write(self, path: Path) -> Path:
        frames = [
            (p.ts, frame(conv, p, vlans=vlans))
            for conv, packets, vlans in self.parts
            for p in packets
        ]
        frames += self.extra
        frames.sort(key=lambda item: item[0])
        return write_frames(path, frames)


def close_delimited_sse(call_events: list[bytes]) -> tuple[bytes, bytes]:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"
    return head, b"".join(call_events)


def test_what_the_client_received_is_what_the_record_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cap = HostileCapture()
    expected: dict[str, str] = {}

    # A forged copy of the answer with a bad TCP checksum arrives first: the client drops it.
    c = chat("bad-checksum", 20)
    conv = cap.conversation().handshake()
    conv.send(CLIENT, c.request())
    (answer,) = conv.send(SERVER, c.response(), sizes=[100_000], ack=False)
    conv.close()
    cap.extra.append((answer.ts - 0.00001, with_bad_checksum(conv, forged(answer))))
    cap.add(conv)
    expected["bad-checksum"] = "complete"

    # A forged copy whose TTL expires before the client arrives first.
    c = chat("short-ttl", 20)
    conv = cap.conversation().handshake()
    conv.send(CLIENT, c.request())
    (answer,) = conv.send(SERVER, c.response(), sizes=[100_000], ack=False)
    conv.close()
    cap.extra.append((answer.ts - 0.00001, with_ttl(conv, forged(answer), 3)))
    cap.add(conv)
    expected["short-ttl"] = "complete"

    # A valid retransmission whose bytes differ: the tap cannot know which the client kept.
    c = chat("two-versions", 60, stream=True)
    conv = cap.conversation().handshake()
    conv.send(CLIENT, c.request())
    segments = conv.send(SERVER, c.response(), sizes=[200] * 100)
    conv.close()
    middle = segments[len(segments) // 2]
    packets = list(conv.packets)
    packets.insert(packets.index(middle) + 1, replace(forged(middle), ts=middle.ts + 0.00001))
    cap.add(conv, packets)
    expected["two-versions"] = "ambiguous"

    # An out-of-window RST between two keep-alive exchanges: Linux ignores it, so do we.
    first, second = chat("rst-first"), chat("rst-second")
    conv = cap.conversation().handshake()
    conv.exchange(first.request(), first.response())
    conv.packets.append(
        Packet(conv.ts, SERVER, (conv.next_seq[SERVER] + 70_000) & 0xFFFFFFFF, 0, RST)
    )
    conv.exchange(second.request(), second.response())
    cap.add(conv.close())
    expected["rst-first"] = expected["rst-second"] = "complete"

    # A forged FIN inside a close-delimited SSE answer; the honest server goes on.
    c = chat("forged-fin", 40, stream=True)
    head, body = close_delimited_sse(c.sse_events())
    conv = cap.conversation().handshake()
    conv.send(CLIENT, c.request())
    conv.send(SERVER, head + body[: len(body) // 2], sizes=[150] * 100)
    conv.packets.append(
        Packet(
            conv.ts, SERVER, conv.next_seq[SERVER] & 0xFFFFFFFF, conv.next_seq[CLIENT], FIN | ACK
        )
    )
    conv.send(SERVER, body[len(body) // 2 :], sizes=[150] * 100)
    cap.add(conv.close())
    expected["forged-fin"] = "ambiguous"

    # The whole answer in IP fragments.
    c = chat("fragments", 30)
    conv = cap.conversation().handshake()
    conv.send(CLIENT, c.request())
    (answer,) = conv.send(SERVER, c.response(), sizes=[100_000])
    conv.close()
    cap.extra += [(answer.ts + i * 1e-6, f) for i, f in enumerate(fragmented(conv, answer))]
    cap.add(conv, [p for p in conv.packets if p is not answer])
    expected["fragments"] = "complete"

    pcap, log = cap.write(tmp_path / "hostile.pcap"), tmp_path / "log"
    assert main(["replay", str(pcap), "--log", str(log), "--origin", "test.local/c"]) == 0
    summary = capsys.readouterr().out
    assert "bad checksums 1, bad IP lengths 0, TTL changes 1, ignored RST 1" in summary
    assert main(["log", "export", str(log), "--format", "jsonl"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    got = by_model(records)
    assert sorted(got) == sorted(expected)
    for model, quality in expected.items():
        (rec,) = got[model]
        assert rec["quality"] == quality, (model, rec["quality_reason"])
    for model in ("bad-checksum", "short-ttl", "fragments"):
        call = chat(model, {"bad-checksum": 20, "short-ttl": 20, "fragments": 30}[model])
        assert got[model][0]["response_body_sha256"] == sha(call.response_json()), model
    assert "versions" in str(got["two-versions"][0]["quality_reason"])
    assert "versions" in str(got["forged-fin"][0]["quality_reason"])


def test_an_ambiguous_record_holds_the_hash_of_each_version() -> None:
    c = chat("versions", 30)
    conv = Conversation().handshake()
    conv.send(CLIENT, c.request())
    response = c.response()
    first, last = conv.send(SERVER, response, sizes=[300, len(response)], ack=False)
    # A differing copy of the first segment arrives before the answer is complete.
    retransmission = replace(forged(first), ts=first.ts + 0.00001)
    conv.close()
    packets = sorted([*conv.packets, retransmission], key=lambda p: p.ts)
    records: list[record_pb2.InferenceRecord] = []
    pipeline = CapturePipeline(CollectorConfig(origin="test.local/c"), records.append)
    for packet in packets:
        pipeline.frame(int(packet.ts * 1e9), 1, frame(conv, packet))
    pipeline.finish()
    (record,) = records
    assert record.quality == record_pb2.CAPTURE_QUALITY_AMBIGUOUS
    assert last.ts > retransmission.ts
    (ambiguity,) = record.ambiguities
    assert not ambiguity.from_client
    assert (ambiguity.stream_offset, ambiguity.length) == (0, 300)
    assert list(ambiguity.variant_sha256) == [
        hashlib.sha256(first.payload).digest(),
        hashlib.sha256(retransmission.payload).digest(),
    ]


def _records_of(
    conv: Conversation, packets: list[Packet], *, late: int = 0
) -> list[record_pb2.InferenceRecord]:
    """The records of `packets` (one differing copy among them; `late`: how many copies came
    after their message's record was emitted)."""
    records: list[record_pb2.InferenceRecord] = []
    pipeline = CapturePipeline(CollectorConfig(origin="test.local/c"), records.append)
    for packet in sorted(packets, key=lambda p: p.ts):
        pipeline.frame(int(packet.ts * 1e9), 1, frame(conv, packet))
    pipeline.finish()
    assert pipeline.summary().reassembly.overlap_conflicts == 1
    assert pipeline.http_stats.late_ambiguities == late
    return records


def test_a_late_differing_copy_of_a_request_marks_that_request_not_the_next() -> None:
    first, second = chat("first", 30), chat("second", 30)
    conv = Conversation().handshake()
    (request,) = conv.send(CLIENT, first.request())
    response = first.response()
    head, *_rest = conv.send(SERVER, response, sizes=[300, len(response)])
    conv.send(CLIENT, second.request())
    conv.send(SERVER, second.response())
    conv.close()
    # The request was read whole; a copy with other bytes arrives while its answer streams.
    late = replace(forged(request), ts=head.ts + 0.00001)
    one, two = _records_of(conv, [*conv.packets, late])
    assert one.quality == record_pb2.CAPTURE_QUALITY_AMBIGUOUS
    (ambiguity,) = one.ambiguities
    assert ambiguity.from_client and ambiguity.stream_offset == 0
    assert ambiguity.length == len(request.payload)
    assert two.quality == record_pb2.CAPTURE_QUALITY_COMPLETE and not two.ambiguities


def test_a_differing_copy_after_its_record_was_written_is_an_amendment_naming_it() -> None:
    conv, packets, answer, late = late_copy_of_a_written_answer()
    one, amendment, two = _records_of(conv, packets, late=1)
    assert one.quality == two.quality == record_pb2.CAPTURE_QUALITY_COMPLETE
    assert amendment.quality == record_pb2.CAPTURE_QUALITY_AMBIGUOUS
    assert f"of record {one.record_id} arrived in 2 versions" in amendment.quality_reason
    assert list(amendment.amends_record_ids) == [one.record_id]
    assert not one.amends_record_ids and not two.amends_record_ids
    assert not amendment.HasField("request") and not amendment.HasField("response")
    assert amendment.flow == one.flow
    (ambiguity,) = amendment.ambiguities
    assert not ambiguity.from_client
    assert (ambiguity.stream_offset, ambiguity.length) == (0, len(answer.payload))
    assert list(ambiguity.variant_sha256) == [
        hashlib.sha256(answer.payload).digest(),
        hashlib.sha256(late.payload).digest(),
    ]


def test_a_late_differing_copy_is_visible_in_the_replay_summary_and_the_exported_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conv, packets, answer, _late = late_copy_of_a_written_answer()
    pcap = write_frames(tmp_path / "late.pcap", [(p.ts, frame(conv, p)) for p in packets])
    log = tmp_path / "log"
    assert main(["replay", str(pcap), "--log", str(log), "--origin", "test.local/c"]) == 0
    summary = capsys.readouterr().out
    assert "conflicting overlaps 1 (1 after their record)" in summary
    assert "records         3 (ambiguous 1, complete 2)" in summary
    assert main(["log", "export", str(log), "--format", "jsonl"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    amended, amendment, _second = records
    assert amended["quality"] == "complete"
    assert amendment["quality"] == "ambiguous"
    assert f"late ambiguity: response stream bytes 0..{len(answer.payload)} of record " in str(
        amendment["quality_reason"]
    )
    assert str(amended["record_id"]) in str(amendment["quality_reason"])
    assert amendment["amends_record_ids"] == [amended["record_id"]]
    assert amended["amends_record_ids"] == []

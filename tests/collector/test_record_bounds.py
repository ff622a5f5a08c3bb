"""Records stay below the ledger's message limit whatever the bodies hold (record_bounds)."""

from __future__ import annotations

import hashlib
import json

import pytest
from veritap.tls import MAX_STREAM_MESSAGE_BYTES
from veritap.v1 import record_pb2

from collector import record_bounds, records
from collector.http.messages import Exchange, ResponseMessage
from collector.http.sse import SseEvent
from collector.record_bounds import RECORD_BYTES, STORED_BODY_BYTES
from tests.collector.dialects.dialect_records import MESSAGES, REGISTRY, sse_response
from tests.collector.dialects.dialect_records import records as build_records
from tests.collector.http.http_wire import FLOW
from tests.openai_traffic import Call, words

Q = record_pb2.CaptureQuality


def post(body: bytes) -> bytes:
    return b"POST /v1/chat/completions HTTP/1.1\r\ncontent-length: %d\r\n\r\n" % len(body) + body


def test_the_record_limit_leaves_room_for_the_envelope() -> None:
    assert RECORD_BYTES + record_bounds.ENVELOPE_ALLOWANCE == MAX_STREAM_MESSAGE_BYTES


def test_a_body_over_the_cap_is_cut_and_keeps_its_whole_hash() -> None:
    text = "y" * (STORED_BODY_BYTES + 1000)
    call = Call("/v1/chat/completions", "m", MESSAGES, {}, [words(1)])
    body = call.response_json().replace(words(1).text.encode(), text.encode())
    response = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body
    (rec,) = build_records((call.request(), response))
    assert rec.quality == Q.CAPTURE_QUALITY_TRUNCATED
    assert f"response: body cut at {STORED_BODY_BYTES} of {len(body)} bytes" in rec.quality_reason
    assert rec.response.body == body[:STORED_BODY_BYTES]
    assert rec.response.body_sha256 == hashlib.sha256(body).digest()
    assert rec.response.body_length == len(body)
    assert rec.api.choices[0].text == text  # read from the whole body
    assert rec.ByteSize() <= RECORD_BYTES


def test_a_record_over_the_limit_keeps_its_skeleton() -> None:
    # A request parameter the view must hold whole: 16 MiB of params_json.
    tools = "t" * MAX_STREAM_MESSAGE_BYTES
    body = json.dumps({"model": "m", "messages": MESSAGES, "tools": tools}).encode()
    call = Call("/v1/chat/completions", "m", MESSAGES, {}, [words(2)])
    (rec,) = build_records((post(body), call.response()))
    assert rec.ByteSize() <= RECORD_BYTES
    assert rec.quality == Q.CAPTURE_QUALITY_TRUNCATED
    assert rec.quality_reason.startswith("record: ")
    assert "only its skeleton is kept" in rec.quality_reason
    assert rec.request.method == "POST" and rec.request.target == "/v1/chat/completions"
    assert rec.request.body_sha256 == hashlib.sha256(body).digest()
    assert rec.request.body_length == len(body)
    assert rec.response.status == 200
    assert rec.response.body_sha256 == hashlib.sha256(call.response_json()).digest()
    assert rec.api.dialect == "openai-chat" and not rec.api.choices
    assert rec.flow.server_port == 8000 and rec.record_id


def test_a_skeleton_keeps_an_earlier_quality_and_the_first_ambiguities() -> None:
    record = record_pb2.InferenceRecord(quality=Q.CAPTURE_QUALITY_REQUEST_GAP)
    record.request.target = "/x" * 10_000
    for offset in range(100):
        record.ambiguities.add(stream_offset=offset, length=1, variant_sha256=[b"a" * 32] * 2)
    out = record_bounds.skeleton(record, Q.CAPTURE_QUALITY_REQUEST_GAP)
    assert out.quality == Q.CAPTURE_QUALITY_REQUEST_GAP
    assert len(out.request.target) == record_bounds.SKELETON_TEXT_CHARS
    kept = record_bounds.SKELETON_AMBIGUITIES
    assert [a.stream_offset for a in out.ambiguities] == list(range(kept))


def test_arrival_times_beyond_the_cap_are_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(records, "STORED_SSE_EVENTS", 4)
    call = Call("/v1/chat/completions", "m", MESSAGES, {"stream": True}, [words(6)])
    events = call.sse_events()
    (rec,) = build_records((call.request(), sse_response(events)))
    assert list(rec.response.sse_arrival_offsets_ns) == [0, 0, 0, 0]
    assert rec.quality == Q.CAPTURE_QUALITY_TRUNCATED
    assert f"arrival times kept for 4 of {len(events)} SSE events" in rec.quality_reason
    assert rec.api.choices[0].text == words(6).text


def test_a_request_the_view_cannot_hold_keeps_its_body() -> None:
    body = b'{"model":"m","messages":[' + b"1," * 10 + b"]}"  # not JSON
    call = Call("/v1/chat/completions", "m", MESSAGES, {}, [words(2)])
    (rec,) = build_records((post(body), call.response()))
    assert rec.request.body == body and rec.request.body_length == len(body)
    assert rec.quality == Q.CAPTURE_QUALITY_PARSE_ERROR


def test_an_event_captured_before_the_first_byte_arrives_at_offset_zero() -> None:
    """Reassembly delivers a reordered segment with its own (earlier) capture time."""
    events = (SseEvent(5, "", "{}", ""), SseEvent(30, "", "[DONE]", ""))
    response = ResponseMessage(
        200, "OK", "1.1", (), (), b"", "", 0, 10, 40, (), (), events, is_sse=True
    )
    builder = records.RecordBuilder("test.local/c", REGISTRY)
    rec = builder.build(Exchange(FLOW, None, response, ()))
    assert list(rec.response.sse_arrival_offsets_ns) == [0, 20]

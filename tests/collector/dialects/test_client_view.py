"""The record is what the client's SDK shows: [DONE], falsy errors, the request's model, routing."""

from __future__ import annotations

import hashlib
import json
from urllib.parse import unquote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from veritap.v1 import record_pb2

from collector.dialects import DialectRegistry
from collector.dialects.targets import route_path
from tests.collector.dialects.dialect_records import MESSAGES, records, sse_response
from tests.openai_traffic import Call, words

REGISTRY = DialectRegistry(["openai-chat", "openai-completions"])


def streamed(model: str = "m") -> Call:
    return Call("/v1/chat/completions", model, MESSAGES, {"stream": True}, [words(3)])


def content_event(text: str) -> bytes:
    chunk = {"id": "x", "object": "chat.completion.chunk", "model": "m"}
    chunk["choices"] = [{"index": 0, "delta": {"content": text}}]  # type: ignore[assignment]
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


@pytest.mark.parametrize("done", [b"data: [DONE]\n\n", b"data: [DONE] and more\n\n"])
def test_events_after_done_are_counted_and_hashed_not_read(done: bytes) -> None:
    call = streamed()
    events = [*call.sse_events()[:-1], done]
    late = [content_event(" EXTRA"), b"data: not json\n\n"]
    (rec,) = records((call.request(), sse_response([*events, *late])))
    assert rec.quality == record_pb2.CAPTURE_QUALITY_COMPLETE, rec.quality_reason
    assert rec.api.choices[0].text == words(3).text
    assert rec.api.events_after_end == 2
    datas = [e.removeprefix(b"data: ").removesuffix(b"\n\n") for e in late]
    expected = hashlib.sha256(b"".join(d + b"\n\n" for d in datas)).digest()
    assert rec.api.events_after_end_sha256 == expected
    # The raw stream stays in the body, with every event's arrival time.
    assert rec.response.body == b"".join(events + late)
    assert len(rec.response.sse_arrival_offsets_ns) == len(events) + len(late)


@pytest.mark.parametrize("falsy", ["null", "false", '""', "{}", "0"])
def test_a_falsy_error_in_a_chunk_is_no_error(falsy: str) -> None:
    call = streamed()
    events = call.sse_events()
    error = b'"error":' + falsy.encode() + b',"choices":'
    marked = [e.replace(b'"choices":', error) for e in events]
    (rec,) = records((call.request(), sse_response(marked)))
    assert rec.api.error == ""
    assert rec.api.choices[0].text == words(3).text
    assert rec.quality == record_pb2.CAPTURE_QUALITY_COMPLETE, rec.quality_reason


def test_a_falsy_error_in_a_document_is_no_error() -> None:
    call = Call("/v1/chat/completions", "m", MESSAGES, {}, [words(2)])
    body = call.response_json().replace(b'"choices":', b'"error":null,"choices":')
    response = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body
    (rec,) = records((call.request(), response))
    assert rec.api.error == "" and rec.api.choices[0].text == words(2).text


def test_an_event_stream_with_an_error_status_is_an_error_without_text() -> None:
    call = streamed()
    response = call.response().replace(b"HTTP/1.1 200 OK", b"HTTP/1.1 503 Busy", 1)
    (rec,) = records((call.request(), response))
    assert rec.api.error.startswith("data: ") and not rec.api.choices


def test_an_error_in_a_2xx_document_is_no_error() -> None:
    # The SDK reads a 2xx body's choices whatever `error` it holds: a prover cannot make
    # a completion the client received look like an (unverifiable) error.
    call = Call("/v1/chat/completions", "m", MESSAGES, {}, [words(2)])
    body = call.response_json().replace(b'"choices":', b'"error":{"message":"x"},"choices":')
    response = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body
    (rec,) = records((call.request(), response))
    assert rec.api.error == "" and rec.api.choices[0].text == words(2).text
    assert rec.quality == record_pb2.CAPTURE_QUALITY_COMPLETE, rec.quality_reason


@pytest.mark.parametrize("stream", [False, True])
def test_the_model_comes_from_the_request_alone(stream: bool) -> None:
    call = Call("/v1/chat/completions", "prover-choice", MESSAGES, {"stream": stream}, [words(2)])
    body = json.dumps({"messages": MESSAGES, "stream": stream}).encode()
    request = b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body)
    (rec,) = records((request + body, call.response()))
    assert rec.api.model == ""
    assert rec.api.choices[0].text == words(2).text


@pytest.mark.parametrize(
    ("target", "path"),
    [
        ("/v1/chat/completions", "/v1/chat/completions"),
        ("/v1/%63hat/completions", "/v1/chat/completions"),
        ("/v1%2Fchat%2Fcompletions", "/v1/chat/completions"),
        ("http://prover:8000/v1/chat/completions?x=1", "/v1/chat/completions"),
        ("HTTPS://prover/v1/completions", "/v1/completions"),
        ("/v1/completions?a=%2F#frag", "/v1/completions"),
        ("/v1/completions#x?y", "/v1/completions"),
        ("/v1/chat/completions%3Fx", "/v1/chat/completions?x"),
        ("/v1/%2563hat/completions", "/v1/%63hat/completions"),
        ("http://prover", ""),
        ("*", "*"),
    ],
)
def test_targets_route_as_uvicorn_hands_them_to_starlette(target: str, path: str) -> None:
    assert route_path(target) == path


TARGET_PIECES = ["/", "v1", "chat", "completions", "%63", "%2F", "%3F", "%", "%zz", "?", "#"]
TARGET_PIECES += ["http://", "HTTPS://", "h:80", "//", ":", "@", "a=b", "&", ";", "*", "x"]


@settings(max_examples=2000, deadline=None)
@given(st.lists(st.sampled_from(TARGET_PIECES), max_size=12).map("".join))
def test_targets_route_as_httptools_parses_them(target: str) -> None:
    """uvicorn's own parser is the reference: its path, percent-decoded when it holds `%`."""
    httptools = pytest.importorskip("httptools")
    try:
        parsed = httptools.parse_url(target.encode())
    except httptools.HttpParserInvalidURLError:
        return
    path = parsed.path.decode("ascii") if parsed.path is not None else ""
    assert route_path(target) == (unquote(path) if "%" in path else path)


@pytest.mark.parametrize(
    ("target", "dialect"),
    [
        ("/v1/%63hat/completions", "openai-chat"),
        ("http://host/v1/chat/completions", "openai-chat"),
        ("/v1/completions/?stream=1", "openai-completions"),
        ("/v1/%2563hat/completions", None),
        ("/v1/chat/completions%3F", None),
    ],
)
def test_dialects_match_the_routed_path(target: str, dialect: str | None) -> None:
    found = REGISTRY.for_target(target)
    assert (found.name if found else None) == dialect
    assert REGISTRY.records("POST", target) is (dialect is not None)


def with_events(call: Call, position: int, *raw: bytes) -> bytes:
    """`call`'s SSE response with `raw` bytes inserted before its event `position`."""
    events = call.sse_events()
    return sse_response([*events[:position], b"".join(raw), *events[position:]])


def test_a_byte_order_mark_hides_the_first_event_from_the_sdk() -> None:
    call = streamed()
    events = call.sse_events()
    response = sse_response([b"\xef\xbb\xbf" + content_event("hidden"), *events])
    (rec,) = records((call.request(), response))
    assert rec.api.choices[0].text == words(3).text
    assert rec.quality == record_pb2.CAPTURE_QUALITY_COMPLETE, rec.quality_reason


def test_thread_events_carry_no_text() -> None:
    call = streamed()
    response = with_events(call, 2, b"event: thread.message\n", content_event(" hidden"))
    (rec,) = records((call.request(), response))
    assert rec.api.choices[0].text == words(3).text


def test_the_text_ends_where_the_body_stops_being_utf8() -> None:
    call = streamed()
    (rec,) = records((call.request(), with_events(call, 2, b"data: \xff\n\n")))
    assert rec.api.choices[0].text == words(3).tokens[0]
    assert "SSE body is not UTF-8 at byte" in rec.quality_reason
    assert rec.api.events_after_end == 0  # the SDK reads no event past it


def test_an_id_then_a_blank_line_ends_the_text() -> None:
    # After an id, every blank line dispatches: an empty event the SDK cannot decode.
    call = streamed()
    (rec,) = records((call.request(), with_events(call, 2, b"id: 1\n\n")))
    assert rec.api.choices[0].text == words(3).tokens[0]
    assert "SSE event 3 is not JSON (the SDK raises there)" in rec.quality_reason


def test_the_request_decides_whether_the_response_is_a_stream() -> None:
    call = streamed()
    as_json = call.response().replace(b"text/event-stream", b"application/json")
    (rec,) = records((call.request(), as_json))
    assert rec.api.choices[0].text == words(3).text
    assert rec.quality == record_pb2.CAPTURE_QUALITY_COMPLETE, rec.quality_reason
    document = Call("/v1/chat/completions", "m", MESSAGES, {"stream": False}, [words(2)])
    body = document.response_json()
    as_sse = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n"
    (rec,) = records((document.request(), as_sse % len(body) + body))
    assert rec.api.choices[0].text == words(2).text
    assert rec.quality == record_pb2.CAPTURE_QUALITY_COMPLETE, rec.quality_reason

"""`sdk_events` yields what openai-python's own SSEDecoder yields, however the body is split."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.dialects.sdk_sse import SdkEvent, SdkStream, sdk_events, simple_stream
from collector.http.messages import ResponseMessage
from collector.http.sse import SseParser
from tests.cpu_bound import budget, cpu_bound

streaming = pytest.importorskip("openai._streaming")

PIECES = [
    b"data: ", b"data:", b"data", b"event: ", b"event:", b"thread.run", b"id: 7", b"id:", b"id: \0",
    b"retry: 5", b"retry: x", b":c", b"\n", b"\n", b"\r", b"\r\n", b"\xef\xbb\xbf", b"\xff",
    b"\xc3", b"\xc3\xa9", b"{}", b"[DONE]", b" ", b"foo: bar", b'{"a":1}', b"x",
]  # fmt: skip


def reference(chunks: list[bytes]) -> SdkStream:
    """The SDK's decoder over `chunks`, and where (in bytes) it raised."""
    events: list[SdkEvent] = []
    try:
        for sse in streaming.SSEDecoder().iter_bytes(iter(chunks)):
            events.append(SdkEvent(sse.event, sse.data))
    except UnicodeDecodeError:
        body = b"".join(chunks)
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as exc:
            return SdkStream(tuple(events), exc.start)
        raise
    return SdkStream(tuple(events), None)


@settings(max_examples=1500, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=40), st.data())
def test_the_events_are_the_sdks(pieces: list[bytes], data: st.DataObject) -> None:
    body = b"".join(pieces)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(body)), max_size=5)))
    chunks = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    with cpu_bound(budget(len(body))):
        ours = sdk_events(body)
    assert ours == reference(chunks)


def test_a_byte_order_mark_hides_the_first_line() -> None:
    stream = sdk_events(b'\xef\xbb\xbfdata: {"a":1}\n\ndata: {"b":2}\n\n')
    assert stream.events == (SdkEvent(None, '{"b":2}'),)


def test_an_id_makes_every_blank_line_an_event() -> None:
    stream = sdk_events(b"id: 1\ndata: x\n\n\n")
    assert stream.events == (SdkEvent(None, "x"), SdkEvent(None, ""))


def test_decoding_stops_at_the_first_line_that_is_not_utf8() -> None:
    body = b"data: a\n\ndata: \xff\n\ndata: b\n\n"
    assert sdk_events(body) == SdkStream((SdkEvent(None, "a"),), body.index(b"\xff"))


def test_a_long_line_is_linear() -> None:
    body = b"data: " + b"x" * 8_000_000
    with cpu_bound(budget(len(body))):
        assert sdk_events(body).events == ()


_PIECES = st.one_of(
    st.text(max_size=8).map(lambda text: b"data: " + text.encode() + b"\n\n"),
    st.sampled_from(
        [b"data: \n\n", b"data: x\r\n\r\n", b"event: e\n", b"id: 1\n", b"retry: 5\n\n", b":c\n"]
    ),
    st.sampled_from([b"\xef\xbb\xbf", b"data: \xff\n\n", b"data:x\n\n", b"\n", b"data: a\n"]),
    st.binary(max_size=10),
)


def _response(body: bytes, parser: SseParser) -> ResponseMessage:
    events = tuple(parser.events)
    return ResponseMessage(
        200,
        "OK",
        "1.1",
        (),
        (),
        body,
        "",
        len(body),
        0,
        0,
        (),
        (),
        events,
        is_sse=True,
        sse_simple=parser.simple and not parser.dropped_events,
    )


@settings(max_examples=400, deadline=None)
@given(st.lists(_PIECES, max_size=10), st.integers(1, 3))
def test_a_simple_stream_is_what_the_sdk_reads_from_its_body(
    pieces: list[bytes], max_events: int
) -> None:
    """Whatever the pieces, a stream the HTTP layer calls simple gives the SDK's events."""
    parser = SseParser(max_events=max_events)
    for at, piece in enumerate(pieces):
        parser.feed(piece, at)
    body = b"".join(pieces)
    fast = simple_stream(_response(body, parser))
    if fast is not None:
        sdk = sdk_events(body)
        # The HTTP layer's events themselves: unnamed, which they say with "" (None for the SDK).
        assert [(e.event or None, e.data) for e in fast.events] == list(sdk.events)
        assert fast.undecodable_at == sdk.undecodable_at is None
    one_line_events = all(
        p[:6] == b"data: " and p[-2:] == b"\n\n" and p.count(b"\n") == 2 and b"\r" not in p
        for p in pieces
    )
    if one_line_events and body.isascii() and len(pieces) <= max_events:
        assert fast is not None, "the servers' shape takes the short way"

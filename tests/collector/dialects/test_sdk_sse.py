"""`sdk_events` yields what openai-python's own SSEDecoder yields, however the body is split."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.dialects.sdk_sse import SdkEvent, SdkStream, sdk_events
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

"""SSE parsing per the WHATWG rules, arrival times and resynchronisation after gaps."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from collector.http.sse import SseEvent, SseParser


def parse(chunks: list[bytes]) -> list[SseEvent]:
    parser = SseParser()
    for i, chunk in enumerate(chunks):
        parser.feed(chunk, i + 1)
    return parser.events


def test_line_endings_multiline_data_comments_and_fields() -> None:
    stream = (
        b"\xef\xbb\xbf: a comment\r\n"
        b"event: delta\rid: 7\ndata: one\r\ndata:two\r\ndata\n\n"
        b"retry: 100\nunknown: x\ndata: [DONE]\r\r"
        b"data\n\n"
        b"id\n\n"
    )
    events = parse([stream])
    assert [(e.event, e.data, e.id) for e in events] == [
        ("delta", "one\ntwo\n", "7"),
        ("", "[DONE]", "7"),
        ("", "", "7"),
    ]


def test_blank_line_without_data_dispatches_nothing() -> None:
    assert parse([b"event: x\n\n: only comment\n\n"]) == []


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=200), max_size=12))
def test_any_split_points_give_the_same_events(cuts: list[int]) -> None:
    stream = b'data: {"a": 1}\r\n\r\ndata: x\rdata: y\r\rdata: z\n\n' * 3
    points = sorted({min(c, len(stream)) for c in cuts})
    chunks = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    whole = [(e.event, e.data) for e in parse([stream])]
    assert [(e.event, e.data) for e in parse(chunks)] == whole
    assert len(whole) == 9


def test_arrival_time_is_that_of_the_bytes_that_completed_the_event() -> None:
    parser = SseParser()
    parser.feed(b"data: a", 10)
    parser.feed(b"bc\n", 20)
    parser.feed(b"\ndata: d\n\n", 30)
    assert [(e.data, e.arrival_ns) for e in parser.events] == [("abc", 30), ("d", 30)]


def test_gap_drops_the_broken_event_and_resumes_at_a_field() -> None:
    parser = SseParser()
    parser.feed(b"data: one\n\ndata: tw", 1)
    parser.gap()
    parser.feed(b"data: three\n\n", 2)
    parser.gap()
    parser.feed(b'ree"}\n\ndata: four\n\n', 3)
    assert [e.data for e in parser.events] == ["one", "three", "four"]
    assert parser.resyncs == 2

"""SSE parsing per the WHATWG rules, arrival times and resynchronisation after gaps."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from collector.http.sse import MAX_LINE_BYTES, SseEvent, SseParser
from tests.cpu_bound import budget, cpu_bound


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


def test_an_8_mb_unterminated_line_is_scanned_once_and_its_event_dropped() -> None:
    """It was re-joined and re-split on every segment: 16 s of CPU for 8 MB."""
    parser = SseParser()
    piece = b"x" * 1460
    with cpu_bound(budget(8 << 20, 0.5e-6)):
        parser.feed(b"data: ", 1)
        for _ in range((8 << 20) // len(piece)):
            parser.feed(piece, 2)
        parser.feed(b"\n\ndata: after\n\n", 3)
    assert [e.data for e in parser.events] == ["after"]
    assert parser.dropped_events == 1 and parser.dropped_bytes > MAX_LINE_BYTES


def test_a_long_line_under_the_cap_is_kept_whole() -> None:
    parser = SseParser()
    with cpu_bound(budget(3 << 20, 0.5e-6)):
        parser.feed(b"data: ", 1)
        for _ in range(3 << 10):
            parser.feed(b"y" * 1024, 2)
        parser.feed(b"\n\n", 3)
    assert [len(e.data) for e in parser.events] == [3 << 20]
    assert parser.dropped_events == 0


def test_lines_over_the_cap_drop_their_event_whether_split_or_whole() -> None:
    stream = b"data: keep\n\nevent: x\ndata: " + b"z" * 100 + b"\ndata: more\n\ndata: next\n\n"
    for chunks in ([stream], [stream[i : i + 7] for i in range(0, len(stream), 7)]):
        parser = SseParser(max_line_bytes=50)
        for chunk in chunks:
            parser.feed(chunk, 1)
        assert [(e.event, e.data) for e in parser.events] == [("", "keep"), ("", "next")]
        assert parser.dropped_events == 1


def test_events_past_the_cap_are_counted_not_kept() -> None:
    parser = SseParser(max_events=2)
    parser.feed(b"data: 1\n\ndata: 2\n\ndata: 3\n\ndata: 4\n\n", 1)
    assert [e.data for e in parser.events] == ["1", "2"] and parser.dropped_events == 2


_SSE_PIECES = st.sampled_from(
    [
        b"data: ",
        b"data:",
        b"event: e",
        b"id: 1",
        b":c",
        b"retry: 5",
        b"x" * 40,
        b"\r",
        b"\n",
        b"\r\n",
    ]
)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.one_of(_SSE_PIECES, st.binary(max_size=30)), max_size=30).map(b"".join),
    st.lists(st.integers(0, 1000), max_size=8),
    st.lists(st.integers(0, 1000), max_size=3),
)
def test_fuzz_events_are_the_same_however_split_and_cpu_stays_bounded(
    stream: bytes, cuts: list[int], gaps: list[int]
) -> None:
    """Any bytes with gaps at the same places, split two ways, under a small line cap."""
    points = sorted({min(c, len(stream)) for c in cuts + gaps})
    holes = {min(g, len(stream)) for g in gaps}

    def run(split: bool) -> tuple[list[tuple[str, str, str]], int]:
        parser = SseParser(max_line_bytes=64, max_events=20)
        for start, end in zip([0, *points], [*points, len(stream)], strict=True):
            if start in holes:
                parser.gap()
            piece = stream[start:end]
            pieces = [piece[i : i + 5] for i in range(0, len(piece), 5)] if split else [piece]
            for part in pieces:
                parser.feed(part, 1)
        return [(e.event, e.data, e.id) for e in parser.events], parser.dropped_events

    with cpu_bound(budget(len(stream))):
        assert run(split=False) == run(split=True)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.binary(max_size=12).map(lambda x: b"data: " + x + b"\n\n"),
            st.sampled_from([b"id: 4\n", b"event: e\n", b"data: a\n", b"\r", b"x", b"\n"]),
        ),
        max_size=12,
    )
)
def test_segments_of_one_event_each_read_as_byte_by_byte(pieces: list[bytes]) -> None:
    """Whole one-line events (the common segment) give the events, times and ids that the
    same bytes fed one at a time give, whatever state the pieces before them left."""
    whole, bytewise = SseParser(max_line_bytes=8), SseParser(max_line_bytes=8)
    for ts, piece in enumerate(pieces, 1):
        whole.feed(piece, ts)
        for at in range(len(piece)):
            bytewise.feed(piece[at : at + 1], ts)
    assert whole.events == bytewise.events
    assert whole.dropped_events == bytewise.dropped_events


def _spec_events(lines: list[bytes]) -> list[tuple[str, str, str]]:
    """The WHATWG rules, line by line, for LF-terminated lines (name, data, id of each)."""
    events: list[tuple[str, str, str]] = []
    name, data, last_id = b"", [], b""
    for line in lines:
        if not line:
            if data:
                events.append((name.decode(), b"\n".join(data).decode(), last_id.decode()))
            name, data = b"", []
            continue
        field, colon, value = line.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        if field == b"data":
            data.append(value)
        elif field == b"event":
            name = value
        elif field == b"id" and b"\x00" not in value:
            last_id = value
    return events


_LINES = st.sampled_from(
    [b"", b"d", b"da", b"data", b"data:", b"data: x", b"datax: 1", b"e", b"ev", b"event",
     b"event: e", b"eventx", b"i", b"id", b"id: 7", b"id:8", b"id: \x00", b"idx", b":", b": c",
     b"retry: 1", b"x: y", b"data:y"]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(_LINES, max_size=40), st.integers(1, 64))
def test_every_kind_of_line_reads_as_the_specification_says(
    lines: list[bytes], segment: int
) -> None:
    """Lines that name no field the parser keeps (prefixes of `data`, `event`, `id`,
    comments, `retry`, unknown names) change nothing; a repeated id is the same id."""
    stream = b"".join(line + b"\n" for line in lines)
    events = parse([stream[at : at + segment] for at in range(0, len(stream), segment)])
    assert [(e.event, e.data, e.id) for e in events] == _spec_events(lines)

"""Chunk framing: strict chunk sizes, where bodies end, and chunk boundaries after a gap."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.http.chunked import MAX_LINE_BYTES, ChunkBoundarySearch, ChunkFramer, chunk_size
from collector.http.errors import ChunkFramingError
from tests.cpu_bound import budget, cpu_bound

# The resynchronisation rule as one (slow, backtracking) regex: a reference for small inputs.
_REFERENCE_LINE = re.compile(rb"(?:^|(?<=\n))([0-9A-Fa-f]{1,16})[ \t]*(?:;[^\r\n]*)?\r\n")


def _reference_boundary(buf: bytes) -> int | None:
    for match in _REFERENCE_LINE.finditer(buf):
        size = int(match.group(1), 16)
        if size == 0:
            return match.start()
        end = match.end() + size
        if end + 2 > len(buf):
            return None
        if buf[end : end + 2] == b"\r\n":
            return match.start()
    return None


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


@pytest.mark.parametrize(
    "line",
    [
        b"-6\r\n",
        b"+6\r\n",
        b"0x6\r\n",
        b"6_0\r\n",
        b" 6\r\n",
        b"\r\n",
        b"g\r\n",
        b"1" * 17 + b"\r\n",
    ],
)
def test_chunk_sizes_are_hex_digits_only(line: bytes) -> None:
    assert chunk_size(line) is None


@pytest.mark.parametrize(
    ("line", "size"),
    [
        (b"6\r\n", 6),
        (b"00fF\r\n", 255),
        (b"a \t;name=v\r\n", 10),
        (b"0\n", 0),
        (b"f" * 16 + b"\r\n", 2**64 - 1),
    ],
)
def test_chunk_sizes_that_parse(line: bytes, size: int) -> None:
    assert chunk_size(line) == size


def test_a_negative_chunk_size_is_an_error_not_a_rewind() -> None:
    framer = ChunkFramer()
    with cpu_bound(1.0), pytest.raises(ChunkFramingError):
        framer.advance(b"3\r\nabc\r\n-6\r\nabcdef\r\n0\r\n\r\n", 0)


def test_framer_finds_the_end_in_any_split() -> None:
    body = b"5;x=1\r\nhello\r\n6\r\n world\r\n0\r\nT: 1\r\n\r\n"
    for cut in range(len(body)):
        framer = ChunkFramer()
        assert framer.advance(body[:cut], 0) == cut and not framer.done
        assert framer.advance(body[cut:] + b"NEXT", 0) == len(body) - cut and framer.done
        assert framer.wire_bytes == len(body)


def test_an_endless_chunk_size_line_is_an_error_once_it_passes_16_kib() -> None:
    framer = ChunkFramer()
    with pytest.raises(ChunkFramingError):
        framer.advance(b"1" * (1 << 20), 0)
    framer = ChunkFramer()
    framer.advance(b"a" * 8000, 0)
    with pytest.raises(ChunkFramingError):
        framer.advance(b"a" * 9000, 0)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000), st.lists(st.integers(0, 2000), max_size=6))
def test_framer_fuzz_never_rewinds_and_stays_bounded(data: bytes, cuts: list[int]) -> None:
    framer = ChunkFramer()
    with cpu_bound(budget(len(data))):
        for piece in _split(data, cuts):
            try:
                end = framer.advance(piece, 0)
            except ChunkFramingError:
                return
            assert 0 <= end <= len(piece)
            if framer.done:
                return
            assert end == len(piece)


_CHUNKY = st.lists(
    st.sampled_from(
        [b"0\r\n", b"3\r\n", b"abc", b"\r\n", b"\n", b"1;e\r\n", b"x", b"ff\r\n", b"\r"]
    ),
    max_size=14,
).map(b"".join)


@settings(max_examples=300, deadline=None)
@given(_CHUNKY, st.lists(st.integers(0, 60), max_size=5))
def test_boundary_search_matches_the_reference_however_bytes_arrive(
    data: bytes, cuts: list[int]
) -> None:
    search = ChunkBoundarySearch()
    buf = bytearray()
    found = None
    for piece in _split(data, cuts):
        buf += piece
        found = search.search(buf)
        if found is not None:
            break
    expected = _reference_boundary(bytes(buf))
    assert found == expected


@pytest.mark.parametrize(
    "unit", [b"0;" * 4, b"1\r\n", b"a\r\nxx", b"\n", b"ffffffff\r\n" + b"x" * 20]
)
def test_boundary_search_over_256_kib_is_linear(unit: bytes) -> None:
    data = unit * (256 * 1024 // len(unit))
    search = ChunkBoundarySearch()
    buf = bytearray()
    with cpu_bound(budget(len(data), 1e-6)):
        for at in range(0, len(data), 1460):
            buf += data[at : at + 1460]
            search.search(buf)


@pytest.mark.parametrize("line", [b"abc\r\r\n", b"6\r\r\n", b"1;e\r\r\n", b"1;\re\r\n"])
def test_a_bare_cr_before_the_line_end_makes_no_chunk_size_line(line: bytes) -> None:
    assert chunk_size(line) is None


def _reference_trailers_end(trailers: bytes) -> int | None:
    """Where the trailer section ends (after its blank line), -1 for a line over 16 KiB,
    None when the bytes end first."""
    pos = 0
    while True:
        newline = trailers.find(b"\n", pos)
        if newline - pos > MAX_LINE_BYTES or (newline < 0 and len(trailers) - pos > MAX_LINE_BYTES):
            return -1
        if newline < 0:
            return None
        line, pos = trailers[pos : newline + 1], newline + 1
        if line in (b"\r\n", b"\n"):
            return pos


_TRAILER_PIECES = st.lists(
    st.sampled_from(
        [b"T: 1\r\n", b"0\r\n", b"\r\r\n", b"\r", b"x", b"\n", b"\r\n", b"a" * 9000, b";"]
    ),
    max_size=12,
).map(b"".join)


@settings(max_examples=300, deadline=None)
@given(_TRAILER_PIECES, st.lists(st.integers(0, 40000), max_size=5))
def test_trailer_lines_end_at_the_first_blank_line_however_split(
    trailers: bytes, cuts: list[int]
) -> None:
    """Trailer lines are skipped up to the blank line; a line over 16 KiB is an error."""
    head = b"3\r\nabc\r\n0\r\n"
    data = head + trailers
    expected = _reference_trailers_end(trailers)
    framer = ChunkFramer()
    consumed = 0
    try:
        for piece in _split(data, cuts):
            consumed += framer.advance(piece, 0)
            if framer.done:
                break
    except ChunkFramingError:
        assert expected == -1
        return
    if expected is None or expected == -1:
        assert not framer.done and expected is None
    else:
        assert framer.done and consumed == framer.wire_bytes == len(head) + expected


@settings(max_examples=300, deadline=None)
@given(_CHUNKY, st.lists(st.integers(0, 60), max_size=5))
def test_whole_chunks_taken_apart_leave_the_framer_where_advance_does(
    data: bytes, cuts: list[int]
) -> None:
    """The reader's fast path (`whole_chunk` first, `advance` for the rest) frames any
    bytes, however split, as `advance` alone does, and finds each chunk's data."""
    alone, mixed = ChunkFramer(), ChunkFramer()
    for piece in _split(data, cuts):
        try:
            expected = alone.advance(piece, 0)
        except ChunkFramingError:
            expected = -1
        pos = 0
        try:
            while pos < len(piece) and not mixed.done:
                chunk = mixed.whole_chunk(piece, pos)
                if chunk is None:
                    pos = mixed.advance(piece, pos)
                    break
                start, stop = chunk
                assert int(piece[pos : start - 2], 16) == stop - start
                assert piece[stop : stop + 2] == b"\r\n"
                pos = stop + 2
        except ChunkFramingError:
            pos = -1
        assert pos == expected
        if expected < 0:
            return
        assert (mixed.done, mixed.wire_bytes) == (alone.done, alone.wire_bytes)


def test_only_a_plain_whole_chunk_is_taken_whole() -> None:
    assert ChunkFramer().whole_chunk(b"xx5\r\nhello\r\n", 2) == (5, 10)
    for data in (
        b"5\r\nhelloX\r\n",  # the data is not followed by CRLF: llhttp judges it
        b"5\r\nhello\r",  # the chunk goes on in the next bytes
        b"5;e=1\r\nhello\r\n",  # an extension
        b"0\r\n\r\n",  # the last chunk
        b"5\nhello\r\n",  # a bare LF
    ):
        framer = ChunkFramer()
        assert framer.whole_chunk(data, 0) is None
        assert framer.wire_bytes == 0
    framer = ChunkFramer()
    framer.advance(b"5\r\nhel", 0)  # inside a chunk's data, no chunk-size line is due
    assert framer.whole_chunk(b"5\r\nhello\r\n", 0) is None

"""The start-line scanner: the same answer as the bounded grammar's regex, in linear time."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.http.start_line import MAX_REASON_BYTES, MAX_TARGET_BYTES, StartLineScanner
from tests.cpu_bound import budget, cpu_bound

# The grammar as backtracking regexes: the reference for small inputs (quadratic on large ones).
REFERENCE = {
    True: re.compile(
        rb"(?:GET|POST|PUT|DELETE|HEAD|OPTIONS|PATCH|TRACE|CONNECT) /[!-~]{0,%d} HTTP/1\.[01]\r\n"
        % MAX_TARGET_BYTES
    ),
    False: re.compile(rb"HTTP/1\.[01] [1-5][0-9][0-9](?: [^\r\n]{0,%d})?\r\n" % MAX_REASON_BYTES),
}

_PIECES = st.sampled_from(
    [
        b"GET /",
        b"POST /",
        b"CONNECT /",
        b"HTTP/1.1 200",
        b"HTTP/1.0 ",
        b"HTTP/1.2 200 ",
        b" ",
        b"\r\n",
        b"\r",
        b"\n",
        b"a",
        b"/",
        b" HTTP/1.1\r\n",
        b" HTTP/1.",
        b"1",
        b"OK",
        b"x" * 30,
    ]
)


def scan(requests: bool, pieces: list[bytes]) -> int | None:
    """Where the scanner, fed `pieces`, says the first start line begins in their concatenation."""
    scanner = StartLineScanner(requests)
    offset = 0
    for piece in pieces:
        at = scanner.feed(piece)
        if at is not None:
            if at < 0:
                assert scanner.carried == b"".join(pieces)[offset + at : offset]
            return offset + at
        offset += len(piece)
    return None


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


@settings(max_examples=1500, deadline=None)
@given(
    st.booleans(),
    st.lists(_PIECES, max_size=14).map(b"".join),
    st.lists(st.integers(0, 200), max_size=5),
)
def test_scanner_agrees_with_the_reference_however_bytes_arrive(
    requests: bool, data: bytes, cuts: list[int]
) -> None:
    match = REFERENCE[requests].search(data)
    assert scan(requests, _split(data, cuts)) == (match.start() if match else None)


@pytest.mark.parametrize(
    ("requests", "length"),
    [
        (True, MAX_TARGET_BYTES),
        (True, MAX_TARGET_BYTES + 1),
        (False, MAX_REASON_BYTES),
        (False, MAX_REASON_BYTES + 1),
    ],
)
def test_long_lines_split_into_single_bytes_are_found_up_to_their_bound(
    requests: bool, length: int
) -> None:
    line = (
        b"GET /" + b"a" * length + b" HTTP/1.1\r\n"
        if requests
        else b"HTTP/1.1 200 " + b"r" * length + b"\r\n"
    )
    data = b"junk" + line
    match = REFERENCE[requests].search(data)
    assert scan(requests, [data[i : i + 1] for i in range(len(data))]) == (
        match.start() if match else None
    )


@pytest.mark.parametrize(
    ("requests", "unit"),
    [
        (False, b"HTTP/1.1 200 "),
        (False, b"HTTP/1.1 200 \r"),
        (False, b"HTTP/1.1 200"),
        (True, b"GET /"),
        (True, b"GET /a HTTP/1.1\r"),
        (True, b"GET /a HTTP/1."),
    ],
)
def test_pathological_256_kib_scans_are_linear(requests: bool, unit: bytes) -> None:
    """The old regexes took ~50 minutes on 256 KB of these; each is bounded per byte now."""
    data = unit * (256 * 1024 // len(unit))
    scanner = StartLineScanner(requests)
    with cpu_bound(budget(len(data), 1e-6)):
        assert scanner.feed(data) is None
        for at in range(0, len(data), 1460):
            assert scanner.feed(data[at : at + 1460]) is None

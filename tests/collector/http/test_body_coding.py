"""Content-Encoding decoders: gzip, deflate (zlib and raw), br, stacked codings, caps, bombs."""

from __future__ import annotations

import gzip
import tracemalloc
import zlib

import brotli
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.http.content_coding import BROTLI_STEP_BYTES, MAX_CODINGS, BodyDecoder
from collector.http.errors import ContentDecodingError
from tests.cpu_bound import budget, cpu_bound

BODY = b'{"choices": [' + b'{"text": "hello world"},' * 200 + b"]}"


def _raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


@pytest.mark.parametrize(
    ("coding", "encoded"),
    [
        ("gzip", gzip.compress(BODY)),
        ("x-gzip", gzip.compress(BODY)),
        ("deflate", zlib.compress(BODY)),
        ("deflate", _raw_deflate(BODY)),
        ("br", brotli.compress(BODY)),
        ("gzip, br", brotli.compress(gzip.compress(BODY))),
        ("identity", BODY),
    ],
)
def test_codings_decode_in_pieces(coding: str, encoded: bytes) -> None:
    decoder = BodyDecoder(coding, 1 << 20)
    out = b"".join(decoder.decode(encoded[i : i + 7]) for i in range(0, len(encoded), 7))
    assert out == BODY


def test_unknown_coding_bad_data_and_bombs_are_errors() -> None:
    with pytest.raises(ContentDecodingError):
        BodyDecoder("compress", 100)
    with pytest.raises(ContentDecodingError):
        BodyDecoder("gzip", 100).decode(b"definitely not gzip")
    with pytest.raises(ContentDecodingError):
        BodyDecoder("gzip", 1000).decode(gzip.compress(bytes(100_000)))


def _bomb_peak(coding: str, bomb: bytes, cap: int) -> int:
    """Peak bytes traced while decoding `bomb` until the cap refuses it."""
    tracemalloc.start()
    try:
        with pytest.raises(ContentDecodingError, match="body cap"):
            decoder = BodyDecoder(coding, cap)
            for at in range(0, len(bomb), 1460):
                decoder.decode(bomb[at : at + 1460])
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_brotli_bomb_allocates_at_most_the_cap_and_one_step() -> None:
    """500 bytes of brotli for 300 MB of zeros once decoded to 314 MB before the cap was checked."""
    bomb = brotli.compress(bytes(300 << 20), quality=5)
    assert len(bomb) < 1000
    cap = 8 << 20
    assert _bomb_peak("br", bomb, cap) < cap + 3 * BROTLI_STEP_BYTES


def test_a_gzip_bomb_allocates_at_most_about_the_cap() -> None:
    bomb = gzip.compress(bytes(100 << 20), compresslevel=9)
    cap = 8 << 20
    assert _bomb_peak("gzip", bomb, cap) < cap + (1 << 20)


def test_brotli_output_larger_than_one_step_comes_out_whole() -> None:
    body = bytes(range(256)) * (3 * BROTLI_STEP_BYTES // 256) + b"end"
    decoder = BodyDecoder("br", 1 << 30)
    assert decoder.decode(brotli.compress(body)) == body


def test_stacked_codings_are_capped() -> None:
    payload = b"x" * 100
    encoded = payload
    for _ in range(MAX_CODINGS):
        encoded = gzip.compress(encoded)
    assert BodyDecoder(", ".join(["gzip"] * MAX_CODINGS), 1000).decode(encoded) == payload
    with pytest.raises(ContentDecodingError, match="at most"):
        BodyDecoder(", ".join(["gzip"] * (MAX_CODINGS + 1)), 1000)


_CODINGS = ["gzip", "deflate", "br", "gzip, br", "br, deflate", "identity, gzip"]


def _encode(coding: str, body: bytes) -> bytes:
    for name in (c.strip() for c in coding.split(",")):
        if name == "gzip":
            body = gzip.compress(body)
        elif name == "deflate":
            body = zlib.compress(body)
        elif name == "br":
            body = brotli.compress(body)
    return body


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(_CODINGS),
    st.binary(max_size=3000),
    st.lists(st.tuples(st.integers(0, 4000), st.integers(0, 255)), max_size=4),
    st.integers(1, 4096),
)
def test_fuzz_mutated_bodies_decode_or_fail_cleanly_within_the_cap(
    coding: str, body: bytes, flips: list[tuple[int, int]], cap: int
) -> None:
    encoded = bytearray(_encode(coding, body))
    for at, value in flips:
        if encoded:
            encoded[at % len(encoded)] = value
    decoder = BodyDecoder(coding, cap)
    out = []
    with cpu_bound(budget(len(encoded))):
        try:
            for at in range(0, len(encoded), 100):
                out.append(decoder.decode(bytes(encoded[at : at + 100])))
        except ContentDecodingError:
            return
    assert sum(len(piece) for piece in out) <= cap

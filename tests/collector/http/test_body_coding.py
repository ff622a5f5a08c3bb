"""Content-Encoding decoders: gzip, deflate (zlib and raw), br, stacked codings, caps."""

from __future__ import annotations

import gzip
import zlib

import brotli
import pytest

from collector.http.content_coding import BodyDecoder
from collector.http.errors import ContentDecodingError

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

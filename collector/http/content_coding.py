"""Streaming decoders for Content-Encoding: gzip (x-gzip), deflate (zlib or raw), br, identity.

A `BodyDecoder` takes body bytes as they arrive (SSE needs events before the
body ends) and refuses to produce more than `max_output` bytes in total. The
cap is enforced on the decompressors' output before it is allocated (zlib's
`max_length`; brotli's `output_buffer_limit`, taken in steps of at most
`BROTLI_STEP_BYTES` because brotli may overshoot a limit by up to about its
size), so a compression bomb costs at most the body cap plus one step. At most
`MAX_CODINGS` codings are undone, as curl does: each holds a decompressor's state.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import brotli

from collector.http.errors import ContentDecodingError

MAX_CODINGS = 5
BROTLI_STEP_BYTES = 1 << 20

_Step = Callable[[bytes], bytes]


def _over_cap() -> ContentDecodingError:
    return ContentDecodingError("decoded body is larger than the body cap")


def _zlib_step(wbits: int, budget: list[int]) -> _Step:
    decompressor = zlib.decompressobj(wbits)

    def step(data: bytes) -> bytes:
        out = decompressor.decompress(data, budget[0] + 1)
        if decompressor.unconsumed_tail or len(out) > budget[0]:
            raise _over_cap()
        return out

    return step


def _deflate_step(budget: list[int]) -> _Step:
    """RFC 9110 deflate is zlib-wrapped; some servers send it raw: decide on the first bytes."""
    chosen: list[_Step] = []

    def step(data: bytes) -> bytes:
        if not chosen:
            if not data:
                return b""
            wrapped = (
                len(data) >= 2 and (data[0] & 0x0F) == 8 and (data[0] << 8 | data[1]) % 31 == 0
            )
            chosen.append(_zlib_step(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS, budget))
        return chosen[0](data)

    return step


def _brotli_step(budget: list[int]) -> _Step:
    decompressor = brotli.Decompressor()

    def step(data: bytes) -> bytes:
        # A call whose output filled its limit may have more to give: drain with empty input.
        # (`can_accept_more_data` says only that the input was consumed.)
        pieces: list[bytes] = []
        total = 0
        limit = min(budget[0] + 1, BROTLI_STEP_BYTES)
        out: bytes = decompressor.process(data, output_buffer_limit=limit)
        while True:
            total += len(out)
            if total > budget[0]:
                raise _over_cap()
            pieces.append(out)
            if len(out) < limit and decompressor.can_accept_more_data():
                return pieces[0] if len(pieces) == 1 else b"".join(pieces)
            if not out:
                raise ContentDecodingError("brotli decoder stopped without output")
            limit = min(budget[0] + 1 - total, BROTLI_STEP_BYTES)
            out = decompressor.process(b"", output_buffer_limit=limit)

    return step


class BodyDecoder:
    """Undoes the codings of a message's Content-Encoding lines (joined with ", "), last first."""

    def __init__(self, content_encoding: str, max_output: int) -> None:
        self._budget = [max_output]
        codings = [c.strip().lower() for c in content_encoding.split(",")]
        codings = [c for c in codings if c and c != "identity"]
        if len(codings) > MAX_CODINGS:
            raise ContentDecodingError(f"{len(codings)} content codings; at most {MAX_CODINGS}")
        steps: list[_Step] = []
        for coding in reversed(codings):
            if coding in ("gzip", "x-gzip"):
                steps.append(_zlib_step(16 + zlib.MAX_WBITS, self._budget))
            elif coding == "deflate":
                steps.append(_deflate_step(self._budget))
            elif coding == "br":
                steps.append(_brotli_step(self._budget))
            else:
                raise ContentDecodingError(f"unsupported content-encoding {coding!r}")
        self._steps = steps

    @property
    def identity(self) -> bool:
        return not self._steps

    def decode(self, data: bytes) -> bytes:
        try:
            for step in self._steps:
                data = step(data)
        except (zlib.error, brotli.error) as exc:
            raise ContentDecodingError(f"body does not decode: {exc}") from exc
        self._budget[0] -= len(data)
        return data

"""Where a chunked body ends on the wire.

llhttp decodes chunked bodies but does not say how many input bytes a message
used; this framer walks the same chunk-size lines, data and trailers to find
the message's last byte, so pipelined messages, wire lengths and
resynchronisation after a gap are exact. llhttp stays the judge of syntax: a
disagreement between the two is a parse error.
"""

from __future__ import annotations

import re

from collector.http.errors import ChunkFramingError

_SIZE, _DATA, _TRAILER, _DONE = range(4)
_MAX_LINE = 16 * 1024
# A chunk-size line at a line start, for resynchronising after a gap.
CHUNK_LINE = re.compile(rb"(?:^|(?<=\n))([0-9A-Fa-f]{1,8})[ \t]*(?:;[^\r\n]*)?\r\n")


class ChunkFramer:
    """Feed wire bytes of a chunked body; `advance` stops at the body's end."""

    __slots__ = ("_line", "_need", "_state", "wire_bytes")

    def __init__(self) -> None:
        self._state = _SIZE
        self._need = 0
        self._line = b""
        self.wire_bytes = 0

    @property
    def done(self) -> bool:
        return self._state == _DONE

    def advance(self, data: bytes, pos: int) -> int:
        """Consume from `pos`; returns the position after the last byte that belongs to the body."""
        start = pos
        size = len(data)
        state = self._state
        need = self._need
        while pos < size and state != _DONE:
            if state == _DATA:
                # The chunk's data and its CRLF.
                if need > size - pos:
                    need -= size - pos
                    pos = size
                    break
                pos += need
                state = _SIZE
                continue
            newline = data.find(b"\n", pos)
            if newline < 0:
                self._line += data[pos:]
                pos = size
                if len(self._line) > _MAX_LINE:
                    raise ChunkFramingError("chunk-size or trailer line over 16 KiB")
                break
            line = self._line + data[pos : newline + 1] if self._line else data[pos : newline + 1]
            self._line = b""
            pos = newline + 1
            if state == _SIZE:
                try:
                    # int() also takes "0x" and "_"; llhttp rejects those and has the last word.
                    chunk = int(line.split(b";", 1)[0], 16)
                except ValueError:
                    raise ChunkFramingError(f"bad chunk-size line {line[:40]!r}") from None
                if chunk:
                    state, need = _DATA, chunk + 2
                else:
                    state = _TRAILER
            elif line in (b"\r\n", b"\n"):
                state = _DONE
        self._state = state
        self._need = need
        self.wire_bytes += pos - start
        return pos

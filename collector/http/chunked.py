"""Where a chunked body ends on the wire, and where the next chunk begins after a gap.

llhttp decodes chunked bodies but does not say how many input bytes a message
used; this framer walks the same chunk-size lines, data and trailers to find
the message's last byte, so pipelined messages, wire lengths and
resynchronisation after a gap are exact. llhttp stays the judge of syntax: a
disagreement between the two is a parse error. The one chunk it is not shown is the
common one that both read alike, checked here byte for byte (`whole_chunk`).

A chunk size is 1 to 16 hex digits and nothing else (`int(x, 16)` alone would
also take a sign, "0x", "_" and spaces: a size of -6 once made the framer
rewind to its own line forever). Both the framer and the search for a chunk
boundary after a gap look at each byte a bounded number of times, however the
bytes are split.
"""

from __future__ import annotations

import re

from collector.http.errors import ChunkFramingError

_SIZE, _DATA, _TRAILER, _DONE = range(4)
MAX_LINE_BYTES = 16 * 1024
MAX_SIZE_DIGITS = 16
_HEX_DIGITS = b"0123456789abcdefABCDEF"
# No nested repetition: matching is linear in the line (and a line is at most 16 KiB).
_SIZE_LINE = re.compile(rb"([0-9A-Fa-f]{1,%d})[ \t]*(?:;[^\r]*)?\r?\n" % MAX_SIZE_DIGITS)
# The line servers send (digits, CRLF), matched in place: a line `_SIZE_LINE` reads alike.
_PLAIN_SIZE_LINE = re.compile(rb"([0-9A-Fa-f]{1,%d})\r\n" % MAX_SIZE_DIGITS).match
_NOT_A_LINE = -1
# Whole trailer lines that are not the blank one ending the body, each at most the line cap:
# skipped in one match (no nested repetition: a line ends at its only LF).
_TRAILER_LINES = re.compile(rb"(?:(?!\r?\n)[^\n]{0,%d}\n)*" % MAX_LINE_BYTES).match


def chunk_size(line: bytes) -> int | None:
    """The size a chunk-size line (ending in LF) announces, or None if it is not one.

    The size is followed by optional spaces or tabs, then an optional `;` extension, then
    one LF or CRLF: any other CR makes it no chunk-size line (llhttp refuses a bare CR).
    """
    match = _SIZE_LINE.fullmatch(line)
    return None if match is None else int(match[1], 16)


class ChunkFramer:
    """Feed wire bytes of a chunked body; `advance` stops at the body's end."""

    __slots__ = ("_line", "_need", "_state", "done", "wire_bytes")

    def __init__(self) -> None:
        self._state = _SIZE
        self._need = 0
        self._line = b""
        self.wire_bytes = 0
        #: The body's last byte was consumed.
        self.done = False

    def whole_chunk(self, data: bytes, pos: int) -> tuple[int, int] | None:
        """Consume one whole chunk as servers send it (`SIZE` CRLF, the data, CRLF) when one
        begins at `pos`, where a chunk-size line is due; returns where its data lies.

        None, consuming nothing, for anything else (a last chunk, an extension, a chunk
        that goes on in later bytes, data not followed by CRLF): `advance` takes those.
        Such a chunk is one llhttp reads alike from where a chunk-size line is due, so the
        reader need not hand it to llhttp (see `MessageReader._feed_chunked`).
        """
        if self._state != _SIZE or self._line:
            return None
        plain = _PLAIN_SIZE_LINE(data, pos)
        if plain is None:
            return None
        start = plain.end()
        stop = start + int(plain[1], 16)
        if stop == start or data[stop : stop + 2] != b"\r\n":
            return None
        self.wire_bytes += stop + 2 - pos
        return start, stop

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
            if state == _TRAILER and not self._line:
                skipped = _TRAILER_LINES(data, pos)  # what the line loop below would skip
                assert skipped is not None  # a repetition matches, if only the empty string
                pos = skipped.end()
                if pos == size:
                    break
            elif state == _SIZE and not self._line:
                plain = _PLAIN_SIZE_LINE(data, pos)
                if plain is not None:
                    pos = plain.end()
                    announced = int(plain[1], 16)
                    if announced:
                        state, need = _DATA, announced + 2
                    else:
                        state = _TRAILER
                    continue
            newline = data.find(b"\n", pos, pos + MAX_LINE_BYTES + 1 - len(self._line))
            if newline < 0:
                self._line += data[pos : pos + MAX_LINE_BYTES + 1]
                pos = size
                if len(self._line) > MAX_LINE_BYTES:
                    raise ChunkFramingError("chunk-size or trailer line over 16 KiB")
                break
            line = self._line + data[pos : newline + 1] if self._line else data[pos : newline + 1]
            self._line = b""
            pos = newline + 1
            if state == _SIZE:
                chunk = chunk_size(line)
                if chunk is None:
                    raise ChunkFramingError(f"bad chunk-size line {line[:40]!r}")
                if chunk:
                    state, need = _DATA, chunk + 2
                else:
                    state = _TRAILER
            elif line in (b"\r\n", b"\n"):
                state = _DONE
        self._state = state
        self._need = need
        self.done = state == _DONE
        self.wire_bytes += pos - start
        return pos


class ChunkBoundarySearch:
    """Finds the first chunk boundary in the bytes that follow a gap, as they arrive.

    A boundary is a chunk-size line ending in CRLF at a line start (the first
    byte after the gap counts as one) whose data is followed by CRLF where its
    size says; a last-chunk line (`0`) needs no such check. `search` is called
    with the buffer of all bytes since the gap each time it grows, and resumes
    where it stopped, so the whole search is linear in the buffer.
    """

    __slots__ = ("_candidate", "_data_end", "_line_start", "_searched")

    def __init__(self) -> None:
        self._line_start = 0
        self._searched = 0
        self._candidate = _NOT_A_LINE
        self._data_end = 0

    def search(self, buf: bytes | bytearray) -> int | None:
        """The offset of the first boundary in `buf`, or None while there is none yet."""
        size = len(buf)
        while True:
            if self._candidate != _NOT_A_LINE:
                if self._data_end + 2 > size:
                    return None
                if buf[self._data_end : self._data_end + 2] == b"\r\n":
                    return self._candidate
                self._candidate = _NOT_A_LINE
            start = self._line_start
            newline = buf.find(b"\n", max(start, self._searched))
            if newline < 0:
                self._searched = size
                return None
            self._line_start = self._searched = newline + 1
            if newline - start >= MAX_LINE_BYTES or buf[start] not in _HEX_DIGITS:
                continue
            line = bytes(buf[start : newline + 1])
            chunk = chunk_size(line) if line.endswith(b"\r\n") else None
            if chunk == 0:
                return start
            if chunk is not None:
                self._candidate = start
                self._data_end = newline + 1 + chunk

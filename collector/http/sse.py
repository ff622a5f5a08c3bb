"""Server-Sent Events parsing per the WHATWG specification, sans-IO.

Lines end with LF, CRLF or CR (a CR at the end of one chunk and an LF at the
start of the next are one terminator). `data:` lines accumulate and are joined
with "\\n"; a blank line dispatches; comments (":...") and `retry` are ignored;
`id` persists across events. Each event carries the capture time of the latest
bytes that completed it.

After a hole in the stream (`gap()`), the partial line and the event being
built are dropped and parsing resumes at the next line that starts an SSE
field — the bytes just after the hole when they begin with one, otherwise the
line after the first terminator.
"""

from __future__ import annotations

import re
from typing import NamedTuple

_TERMINATOR = re.compile(rb"\r\n|\r|\n")
_FIELD_START = re.compile(rb"(?:data|event|id|retry)(?::|\r|\n)|:|\r|\n")
_BOM = b"\xef\xbb\xbf"


class SseEvent(NamedTuple):
    """One dispatched event (a named tuple: one is built per event on the hot path)."""

    arrival_ns: int
    event: str
    data: str
    id: str


class SseParser:
    """Feed body bytes with their capture times; read `events`."""

    def __init__(self) -> None:
        self.events: list[SseEvent] = []
        self.resyncs = 0
        self.dropped_bytes = 0
        self._partial = b""
        self._after_cr = False
        self._started = False
        self._resync = False
        self._data: list[bytes] = []
        self._event = b""
        self._last_id = b""
        self._event_ts = 0

    def feed(self, data: bytes, ts_ns: int) -> None:
        if not self._started:
            if len(self._partial) + len(data) < 3 and _BOM.startswith(self._partial + data):
                self._partial += data
                return
            data = self._partial + data
            self._partial = b""
            self._started = True
            if data.startswith(_BOM):
                data = data[3:]
        if self._after_cr:
            self._after_cr = False
            if data[:1] == b"\n":
                data = data[1:]
        if self._resync:
            data = self._skip_to_field(data)
            if not data:
                return
        buf = self._partial + data if self._partial else data
        if b"\r" in buf:
            lines = _TERMINATOR.split(buf)
            if buf.endswith(b"\r"):
                self._after_cr = True
        else:
            lines = buf.split(b"\n")
        self._partial = lines.pop()
        event_ts = max(self._event_ts, ts_ns)
        data_lines = self._data
        for line in lines:
            if not line:
                if data_lines:
                    self._event_ts = event_ts
                    self._dispatch()
                    data_lines = self._data
                else:
                    self._event = b""
                event_ts = ts_ns
            elif line[:5] == b"data:":
                data_lines.append(line[6:] if line[5:6] == b" " else line[5:])
            else:
                self._field(line)
        self._event_ts = event_ts if data_lines or self._event or self._partial else 0

    def gap(self) -> None:
        """Bytes are missing here: drop what was partial and resynchronise."""
        self._partial = b""
        self._after_cr = False
        self._data = []
        self._event = b""
        self._resync = True
        self.resyncs += 1

    def _skip_to_field(self, data: bytes) -> bytes:
        if _FIELD_START.match(data):
            self._resync = False
            return data
        match = _TERMINATOR.search(data)
        if match is None:
            self.dropped_bytes += len(data)
            return b""
        self._resync = False
        self.dropped_bytes += match.end()
        if data[match.start() : match.end()] == b"\r" and match.end() == len(data):
            self._after_cr = True
        return data[match.end() :]

    def _field(self, line: bytes) -> None:
        """A non-blank line other than `data:` (the common case is handled inline)."""
        if line[0] == 0x3A:
            return
        colon = line.find(b":")
        if colon < 0:
            name, value = line, b""
        else:
            name, value = line[:colon], line[colon + 1 :]
            if value[:1] == b" ":
                value = value[1:]
        if name == b"data":
            self._data.append(value)
        elif name == b"event":
            self._event = value
        elif name == b"id" and b"\x00" not in value:
            self._last_id = value

    def _dispatch(self) -> None:
        data = self._data
        self.events.append(
            SseEvent(
                self._event_ts,
                self._event.decode("utf-8", "replace") if self._event else "",
                (data[0] if len(data) == 1 else b"\n".join(data)).decode("utf-8", "replace"),
                self._last_id.decode("utf-8", "replace") if self._last_id else "",
            )
        )
        self._data = []
        self._event = b""
        self._event_ts = 0

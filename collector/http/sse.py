"""Server-Sent Events parsing per the WHATWG specification, sans-IO.

Lines end with LF, CRLF or CR (a CR at the end of one chunk and an LF at the
start of the next are one terminator). `data:` lines accumulate and are joined
with "\\n"; a blank line dispatches; comments (":...") and `retry` are ignored;
`id` persists across events. Each event carries the capture time of the latest
bytes that completed it.

Bounded and linear: each byte is scanned once however the body is split (an
unterminated line is kept as pieces, not re-joined and re-split on every
feed). A line longer than `max_line_bytes` (default `MAX_LINE_BYTES`) is not
kept: its bytes are skipped to its terminator and the event it belongs to is
dropped; so is every event past `max_events` (default `MAX_EVENTS`). Dropped
events are counted in `dropped_events`, for the reader to report.

After a hole in the stream (`gap()`), the partial line and the event being
built are dropped and parsing resumes at the next line that starts an SSE
field — the bytes just after the hole when they begin with one, otherwise the
line after the first terminator.
"""

from __future__ import annotations

import re
from typing import NamedTuple

MAX_LINE_BYTES = 4 * 1024 * 1024
MAX_EVENTS = 1 << 20

_TERMINATOR = re.compile(rb"\r\n|\r|\n")
_FIELD_START = re.compile(rb"(?:data|event|id|retry)(?::|\r|\n)|:|\r|\n")
_BOM = b"\xef\xbb\xbf"
# Bytes tested for as integers: `b"\r" in data` costs a raised and cleared TypeError first.
_CR = 0x0D
_LF = 0x0A
# The first byte of every line besides `data` that can change anything: `event`, `id`.
_EVENT_OR_ID_INITIAL = frozenset(b"ei")


class SseEvent(NamedTuple):
    """One dispatched event (a named tuple: one is built per event on the hot path)."""

    arrival_ns: int
    event: str
    data: str
    id: str


# Named tuples are built with tuple.__new__ on hot paths: half the cost of calling the class.
_new_event = tuple.__new__


class SseParser:
    """Feed body bytes with their capture times; read `events`."""

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES, max_events: int = MAX_EVENTS) -> None:
        self.events: list[SseEvent] = []
        self.resyncs = 0
        self.dropped_bytes = 0
        self.dropped_events = 0
        self._max_line = max_line_bytes
        self._max_events = max_events
        self._bom = b""
        self._partial: list[bytes] = []
        self._partial_len = 0
        self._overlong = False  # the line in progress passed the cap: skipped to its end
        self._dropping = False  # the event being built lost a line: it is not dispatched
        self._after_cr = False
        self._started = False
        self._resync = False
        self._data: list[bytes] = []
        self._event = b""
        self._last_id = ""  # decoded once when set: every later event carries it
        self._last_id_bytes = b""  # what it was decoded from (the same id is not decoded again)
        self._event_ts = 0
        #: Every piece so far was one whole event of one `data: ` line without CR (what
        #: servers send): then openai-python's decoder reads these same events.
        self.simple = True

    def feed(self, data: bytes, ts_ns: int) -> None:
        if (
            data[:6] == b"data: "
            and data[-2:] == b"\n\n"
            and data.count(b"\n") == 2
            and _CR not in data
            and len(data) - 2 <= self._max_line
            # Nothing is pending: every piece so far took this path (a gap ends `simple`),
            # or the general path left nothing behind.
            and (
                self.simple
                or not (
                    self._bom
                    or self._partial
                    or self._data
                    or self._event
                    or self._resync
                    or self._after_cr
                    or self._overlong
                    or self._dropping
                )
            )
        ):
            # The common piece, one event of one data line, as the general path and
            # `_dispatch` read it (nothing is pending, so no event name and no drop).
            self._started = True
            events = self.events
            if len(events) >= self._max_events:
                self.dropped_events += 1
            else:
                arrival = self._event_ts if self._event_ts > ts_ns else ts_ns
                text = data[6:-2].decode("utf-8", "replace")
                events.append(_new_event(SseEvent, (arrival, "", text, self._last_id)))
            self._event_ts = 0
            return
        self.simple = False
        if len(data) <= self._max_line:
            self._feed(data, ts_ns)
            return
        # In pieces no longer than the cap, only a line that spans pieces can pass it.
        for at in range(0, len(data), self._max_line):
            self._feed(data[at : at + self._max_line], ts_ns)

    def gap(self) -> None:
        """Bytes are missing here: drop what was partial and resynchronise."""
        self._partial = []
        self._partial_len = 0
        self._overlong = False
        self._dropping = False
        self._after_cr = False
        self._data = []
        self._event = b""
        self._resync = True
        self.resyncs += 1
        self.simple = False

    def _feed(self, data: bytes, ts_ns: int) -> None:
        if not self._started:
            if len(self._bom) + len(data) < 3 and _BOM.startswith(self._bom + data):
                self._bom += data
                return
            data = self._bom + data
            self._started = True
            if data.startswith(_BOM):
                data = data[3:]
        if self._after_cr:
            self._after_cr = False
            if data[:1] == b"\n":
                data = data[1:]
                if not data:
                    return
        if self._resync:
            data = self._skip_to_field(data)
            if not data:
                return
        if _LF not in data and _CR not in data:
            self._continue_line(data)
            self._event_ts = max(self._event_ts, ts_ns)
            return
        if _CR in data:
            lines = _TERMINATOR.split(data)
            if data.endswith(b"\r"):
                self._after_cr = True
        else:
            lines = data.split(b"\n")
        last = lines.pop()
        first = 0
        if self._overlong or self._partial_len + len(lines[0]) > self._max_line:
            self._overlong = False
            self._dropping = True
            first = 1
        elif self._partial:
            lines[0] = b"".join(self._partial) + lines[0]
        self._partial = []
        self._partial_len = 0
        event_ts = max(self._event_ts, ts_ns)
        data_lines = self._data
        events = self.events
        room = self._max_events - len(events)
        for line in lines[first:] if first else lines:
            if not line:
                if not data_lines and not self._dropping:
                    self._event = b""
                elif room > 0 and not self._dropping and not self._event:
                    # `_dispatch` inline for the common event: unnamed, kept.
                    events.append(
                        _new_event(
                            SseEvent,
                            (
                                event_ts,
                                "",
                                (
                                    data_lines[0]
                                    if len(data_lines) == 1
                                    else b"\n".join(data_lines)
                                ).decode("utf-8", "replace"),
                                self._last_id,
                            ),
                        )
                    )
                    room -= 1
                    data_lines = self._data = []
                else:
                    self._event_ts = event_ts
                    self._dispatch()
                    data_lines = self._data
                    room = self._max_events - len(events)
                event_ts = ts_ns
            elif line[:5] == b"data:":
                data_lines.append(line[6:] if line[5:6] == b" " else line[5:])
            elif line == b"data":
                data_lines.append(b"")
            elif line[0] in _EVENT_OR_ID_INITIAL:
                self._field(line)
            # Any other line (a comment, `retry`, an unknown field) changes nothing.
        if last:
            self._continue_line(last)
        self._event_ts = event_ts if data_lines or self._event or self._partial else 0

    def _continue_line(self, piece: bytes) -> None:
        """Bytes of a line whose terminator has not arrived yet."""
        if self._overlong:
            self.dropped_bytes += len(piece)
        elif self._partial_len + len(piece) > self._max_line:
            self.dropped_bytes += self._partial_len + len(piece)
            self._partial = []
            self._partial_len = 0
            self._overlong = True
        else:
            self._partial.append(piece)
            self._partial_len += len(piece)

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
        """A line that may be `data` without a colon, `event` or `id` (`data:` lines are
        handled inline, and no other line changes anything)."""
        colon = line.find(b":")
        if colon < 0:
            name, value = line, b""
        else:
            name, value = line[:colon], line[colon + 1 :]
            if value[:1] == b" ":
                value = value[1:]
        if name == b"event":
            self._event = value
        elif name == b"id" and 0 not in value and value != self._last_id_bytes:
            self._last_id_bytes = value
            self._last_id = value.decode("utf-8", "replace")

    def _dispatch(self) -> None:
        data = self._data
        events = self.events
        if self._dropping or len(events) >= self._max_events:
            self.dropped_events += 1
            self._dropping = False
        else:
            name = self._event
            events.append(
                _new_event(
                    SseEvent,
                    (
                        self._event_ts,
                        name.decode("utf-8", "replace") if name else "",
                        (data[0] if len(data) == 1 else b"\n".join(data)).decode(
                            "utf-8", "replace"
                        ),
                        self._last_id,
                    ),
                )
            )
        self._data = []
        self._event = b""
        self._event_ts = 0

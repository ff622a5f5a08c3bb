"""Finding the next request or response start line in a stream, after a gap or at a pickup.

The lines looked for (not anchored to a line start: a message usually follows
the previous body's last byte directly):

    request:  METHOD SP "/" 0..MAX_TARGET_BYTES of [!-~] SP "HTTP/1." [01] CRLF
    response: "HTTP/1." [01] SP [1-5] DIGIT DIGIT [SP 0..MAX_REASON_BYTES of non-CR/LF] CRLF

A single backtracking regex over these costs quadratic time on inputs such as
`GET /GET /GET /...` or `HTTP/1.1 200 HTTP/1.1 200 ...`. Here a fixed prefix is
found first, then the variable part is matched with a possessive run, and a
candidate that fails rules out every later candidate inside its run, so the
search skips past it. Bytes arrive in pieces: the scanner keeps only the bytes
from which a line could still begin (a pending candidate, at most one line
long) and remembers how far that candidate's run was already checked, so each
byte is examined a bounded number of times however the stream is split.
"""

from __future__ import annotations

import re

MAX_TARGET_BYTES = 8192
MAX_REASON_BYTES = 1024

_METHOD = re.compile(rb"(?:GET|POST|PUT|DELETE|HEAD|OPTIONS|PATCH|TRACE|CONNECT) /")
_LONGEST_METHOD = len(b"CONNECT")
_TARGET_RUN = re.compile(rb"[!-~]*+")
_REQUEST_END = re.compile(rb" HTTP/1\.[01]\r\n")
_REQUEST_ENDS = (b" HTTP/1.0\r\n", b" HTTP/1.1\r\n")
_REQUEST_END_PREFIXES = frozenset(end[:n] for end in _REQUEST_ENDS for n in range(1, len(end)))
_STATUS = re.compile(rb"HTTP/1\.[01] [1-5][0-9][0-9]")
_STATUS_LENGTH = len(b"HTTP/1.1 200")
_REASON_RUN = re.compile(rb"[^\r\n]*+")
_NONE = -1


def _run_end(run: re.Pattern[bytes], buf: bytes, at: int) -> int:
    """Where the run of `run` (a pattern that also matches nothing) starting at `at` ends."""
    match = run.match(buf, at)
    return at if match is None else match.end()


class StartLineScanner:
    """Feed the stream's bytes; `feed` says where the first start line begins."""

    __slots__ = ("_checked", "_kept", "_requests", "carried")

    def __init__(self, requests: bool) -> None:
        self._requests = requests
        self._kept = b""
        self._checked = _NONE  # how far the run of the candidate at kept[0] is known good
        self.carried = b""

    def reset(self) -> None:
        """Forget earlier bytes (a gap, or a start line was found)."""
        self._kept = b""
        self._checked = _NONE

    def feed(self, data: bytes) -> int | None:
        """Where in `data` the first start line begins, or None.

        A negative offset means the line began that many bytes before `data`, in bytes
        kept from earlier calls; they are in `carried`. A found line resets the scanner.
        """
        kept = self._kept
        buf = kept + data if kept else data
        found = self._search_requests(buf) if self._requests else self._search_responses(buf)
        if found is None:
            return None
        self.carried = buf[found : len(kept)] if found < len(kept) else b""
        self.reset()
        return found - len(kept)

    def _keep(self, buf: bytes, at: int, checked: int) -> None:
        self._kept = buf[at:]
        self._checked = checked - at if checked != _NONE else _NONE

    def _run_from(self, candidate: int, run_start: int) -> int:
        """Where to resume checking the run of `candidate` (known good up to `_checked`)."""
        if candidate == 0 and self._checked != _NONE:
            return max(run_start, self._checked)
        return run_start

    def _search_requests(self, buf: bytes) -> int | None:
        size = len(buf)
        pos = 0
        while True:
            method = _METHOD.search(buf, pos)
            if method is None:
                self._keep(buf, max(pos, size - _LONGEST_METHOD - 1), _NONE)
                return None
            at, run_start = method.start(), method.end()
            end = _run_end(_TARGET_RUN, buf, self._run_from(at, run_start))
            if end - run_start <= MAX_TARGET_BYTES:
                if _REQUEST_END.match(buf, end):
                    return at
                if end == size or (size - end < 11 and buf[end:] in _REQUEST_END_PREFIXES):
                    self._keep(buf, at, end)
                    return None
            # No later candidate can begin inside this one's target run except one whose
            # method ends where the run does.
            pos = max(at + 1, end - _LONGEST_METHOD)

    def _search_responses(self, buf: bytes) -> int | None:
        size = len(buf)
        pos = 0
        while True:
            at = buf.find(b"HTTP/1.", pos)
            if at < 0:
                self._keep(buf, max(pos, size - _STATUS_LENGTH + 1), _NONE)
                return None
            if size - at < _STATUS_LENGTH + 2:
                self._keep(buf, at, _NONE)
                return None
            if not _STATUS.match(buf, at):
                pos = at + 1
                continue
            end = at + _STATUS_LENGTH
            if buf[end] == 0x20:
                end = _run_end(_REASON_RUN, buf, self._run_from(at, end + 1))
            if end == size or (end == size - 1 and buf[end] == 0x0D):
                if end - at - _STATUS_LENGTH - 1 <= MAX_REASON_BYTES:
                    self._keep(buf, at, end)
                    return None
                pos = max(at + 1, end - _STATUS_LENGTH - 1 - MAX_REASON_BYTES)
                continue
            if buf[end : end + 2] != b"\r\n":
                # Every later candidate that starts before `end` ends at `end` too.
                pos = end
                continue
            if end - at - _STATUS_LENGTH - 1 <= MAX_REASON_BYTES:
                return at
            pos = max(at + 1, end - _STATUS_LENGTH - 1 - MAX_REASON_BYTES)

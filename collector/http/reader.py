"""One direction of an HTTP/1.1 connection: bytes, gaps and the end in; messages out. Sans-IO.

llhttp (through httptools) parses each head as its bytes arrive, so garbage is
refused at its first bad byte, and decodes chunked bodies; `ChunkFramer`
tells where a chunked body ends and Content-Length bodies are counted here, so
every message's last byte is known exactly (pipelining, wire lengths, gaps).

Framing follows RFC 9112 §6: no body for responses to HEAD, for 1xx, 204 and
304; a Transfer-Encoding ending in chunked, else Content-Length, else (for
responses) the body runs to the end of the connection. `101 Switching
Protocols` and a 2xx answer to CONNECT leave HTTP: the rest is counted, not parsed.

Loss handling: a gap inside a Content-Length or close-delimited body is
recorded as a `BodyGap` and the body goes on after it; a gap inside a chunked
body resynchronises at the next chunk-size line that is followed by its data
and CRLF (or at the next message's start line if that comes first), with
llhttp primed by a synthetic head; a gap in a head, or parse error, ends the
message with its problem and the stream is scanned for the next start line.
A stream that starts mid-connection is scanned the same way. Compressed bodies
cannot be decoded past a gap; SSE bodies resynchronise at the next event.

Bounded and linear, since the prover chooses every byte: the start-line scan
(`start_line`) and the chunk boundary search (`chunked`) resume where they
stopped, so each byte is examined a bounded number of times however the bytes
arrive; a head is searched for its end only within `max_head_bytes`; a resync
window that overflows hands its bytes on to the start-line scan.

Known limits: a request that sent `Expect: 100-continue` and got a final
answer instead of 100 is still expected to carry the body its head announced
(clients close or send it); pipelined requests lost whole inside one gap
cannot be told apart, so their responses pair by timing (see `exchange`).
After llhttp or the framer refuses a message, where the scan for the next
start line begins depends on the segment the bad byte came in (llhttp does not
say where it stopped); everything up to the refusal does not depend on segmentation.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import httptools

from collector.http.chunked import ChunkBoundarySearch, ChunkFramer
from collector.http.content_coding import BodyDecoder
from collector.http.errors import ChunkFramingError, ContentDecodingError
from collector.http.messages import (
    BodyGap,
    Problem,
    ProblemKind,
    RequestMessage,
    ResponseMessage,
)
from collector.http.sse import MAX_EVENTS, MAX_LINE_BYTES, SseParser
from collector.http.start_line import StartLineScanner

_IDLE, _SCAN, _HEAD, _BODY_LENGTH, _BODY_CHUNKED, _CHUNK_RESYNC, _BODY_EOF = range(7)
_UPGRADED, _CLOSED = 7, 8

_UPGRADE_PAUSE = "Pause on CONNECT/Upgrade"
_PRIME_REQUEST = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
_PRIME_RESPONSE = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


@dataclass(frozen=True, slots=True)
class HttpLimits:
    max_head_bytes: int = 64 * 1024
    max_body_bytes: int = 64 * 1024 * 1024
    # How much of a chunked body to search for a chunk boundary after a gap.
    resync_window_bytes: int = 256 * 1024
    # An SSE line longer than this, or an event past this many, is dropped and counted (`sse`).
    max_sse_line_bytes: int = MAX_LINE_BYTES
    max_sse_events: int = MAX_EVENTS
    # How much earlier than its request a response may be captured and still pair with it
    # (a TAP merges the two directions with skew; see `exchange`).
    response_skew_ns: int = 100_000_000


class _Message:
    """A message being read (mutable; becomes a frozen message at the end)."""

    __slots__ = (
        "body",
        "body_len",
        "content_encoding",
        "decode_stopped",
        "decoder",
        "first_ts",
        "gaps",
        "head_done",
        "headers",
        "last_ts",
        "method",
        "parsed",
        "problems",
        "reason",
        "sse",
        "status",
        "target",
        "trailers",
        "upgrade",
        "version",
        "wire",
    )

    def __init__(self, ts: int) -> None:
        self.first_ts = ts
        self.last_ts = ts
        self.method = ""
        self.target = ""
        self.status = 0
        self.reason = ""
        self.version = ""
        self.headers: list[tuple[str, str]] = []
        self.trailers: list[tuple[str, str]] = []
        self.head_done = False
        self.parsed = False  # llhttp saw the end of the message
        self.upgrade = False
        self.body: list[bytes] = []
        self.body_len = 0
        self.wire = 0
        self.content_encoding = ""
        self.decoder: BodyDecoder | None = None
        self.decode_stopped = False
        self.sse: SseParser | None = None
        self.gaps: list[BodyGap] = []
        self.problems: list[Problem] = []

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name), None)

    def header_list(self, name: str) -> str | None:
        """Every line of header `name`, joined with ", " as one list (RFC 9110 §5.3)."""
        values = [v for k, v in self.headers if k.lower() == name]
        return ", ".join(values) if values else None


class MessageReader(ABC):
    """State machine of one direction; subclasses say what a head means for framing."""

    _prime = b""
    _requests = True

    def __init__(self, limits: HttpLimits) -> None:
        self.limits = limits
        self.skipped_bytes = 0
        self.lost_between_messages = 0
        self.messages = 0
        self._state = _IDLE
        self._synced = True
        self._msg: _Message | None = None
        self._parser: httptools.HttpRequestParser | httptools.HttpResponseParser | None = None
        self._priming = False
        self._chunk_data: list[bytes] = []  # what llhttp decoded during one feed_data call
        self._head_tail = b""
        self._head_len = 0
        self._remaining = 0
        self._framer = ChunkFramer()
        self._scanner = StartLineScanner(self._requests)
        self._resync_buf = bytearray()
        self._chunk_search = ChunkBoundarySearch()

    # -- what the connection calls ------------------------------------------

    @property
    def at_message_boundary(self) -> bool:
        """In step and between messages: bytes lost now hold the next message's start."""
        return self._state == _IDLE and self._synced

    @property
    def in_message(self) -> bool:
        """A message has begun and not ended (its bytes so far belong to it)."""
        return self._msg is not None

    def start(self, midstream: bool) -> None:
        """The stream begins; `midstream`: its first byte is not the connection's first."""
        if midstream:
            self._synced = False

    def feed(self, data: bytes, ts_ns: int) -> None:
        pos = 0
        size = len(data)
        while pos < size:
            state = self._state
            if state == _BODY_CHUNKED:
                pos = self._feed_chunked(data, pos, ts_ns)
            elif state == _BODY_LENGTH:
                take = min(self._remaining, size - pos)
                msg = self._msg
                assert msg is not None
                msg.last_ts = ts_ns
                msg.wire += take
                self._body(data if take == size else data[pos : pos + take], ts_ns)
                pos += take
                self._remaining -= take
                if not self._remaining:
                    self._complete()
            elif state == _IDLE:
                while pos < size and data[pos] in b"\r\n":
                    pos += 1
                if pos == size:
                    break
                if not self._synced:
                    self._state = _SCAN
                    continue
                self._begin(ts_ns)
            elif state == _HEAD:
                pos = self._feed_head(data, pos, ts_ns)
            elif state == _BODY_EOF:
                msg = self._msg
                assert msg is not None
                msg.last_ts = ts_ns
                msg.wire += size - pos
                self._body(data[pos:] if pos else data, ts_ns)
                pos = size
            elif state == _SCAN:
                pos = self._feed_scan(data, pos, ts_ns)
            elif state == _CHUNK_RESYNC:
                pos = self._feed_chunk_resync(data, pos, ts_ns)
            else:
                self.skipped_bytes += size - pos
                pos = size

    def gap(self, length: int, ts_ns: int) -> None:
        """`length` bytes of this direction were never captured."""
        state = self._state
        msg = self._msg
        if state in (_IDLE, _SCAN):
            self.lost_between_messages += length
            self._synced = False
            self._state = _SCAN
            self._scanner.reset()
        elif msg is None:
            self.skipped_bytes += length
        elif state == _HEAD:
            msg.problems.append(
                Problem(ProblemKind.GAP, f"{length} bytes missing inside the message head")
            )
            self._finish()
            self._unsync()
        elif state == _BODY_LENGTH:
            if length < self._remaining:
                self._body_gap(length)
                self._remaining -= length
            else:
                self._body_gap(self._remaining)
                self.lost_between_messages += length - self._remaining
                self._finish()
                self._unsync()
        elif state == _BODY_EOF:
            self._body_gap(length)
        elif state == _BODY_CHUNKED:
            self._body_gap(length)
            self._state = _CHUNK_RESYNC
            self._start_resync()
        elif state == _CHUNK_RESYNC:
            # The bytes since the last gap are skipped too; the search starts again after this one.
            self._add_missing(len(self._resync_buf) + length)
            self._start_resync()

    def end(self, reason: str, ts_ns: int) -> None:
        """The direction ended (`fin`, `rst`, `idle`, ...); finish what is in progress."""
        state = self._state
        msg = self._msg
        if msg is not None:
            if state == _BODY_EOF and reason == "fin":
                self._complete()
            else:
                where = "head" if state == _HEAD else "body"
                msg.problems.append(
                    Problem(
                        ProblemKind.TRUNCATED,
                        f"connection ended ({reason}) inside the message {where}",
                    )
                )
                self._finish()
        self._state = _CLOSED

    def upgrade(self) -> None:
        """The connection left HTTP (101 or CONNECT): count what follows, parse nothing."""
        if self._msg is not None:
            self._finish()
        self._state = _UPGRADED

    # -- llhttp callbacks --------------------------------------------------

    def on_url(self, url: bytes) -> None:
        if self._msg is not None and not self._priming:
            self._msg.target += url.decode("latin-1")

    def on_status(self, status: bytes) -> None:
        if self._msg is not None and not self._priming:
            self._msg.reason += status.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        msg = self._msg
        if msg is None or self._priming:
            return
        pair = (name.decode("latin-1"), value.decode("latin-1"))
        if msg.head_done:
            msg.trailers.append(pair)
        else:
            msg.headers.append(pair)

    def on_headers_complete(self) -> None:
        if self._msg is not None and not self._priming:
            self._msg.head_done = True

    def on_body(self, body: bytes) -> None:
        self._chunk_data.append(body)

    def on_message_complete(self) -> None:
        if self._msg is not None:
            self._msg.parsed = True

    # -- role hooks --------------------------------------------------------

    @abstractmethod
    def _new_parser(self) -> httptools.HttpRequestParser | httptools.HttpResponseParser: ...

    @abstractmethod
    def _started(self, ts_ns: int) -> None:
        """A message began (its first byte is in)."""

    @abstractmethod
    def _head(self, msg: _Message) -> bool:
        """The head is parsed: set the framing state; returns whether bodies are kept."""

    @abstractmethod
    def _deliver(self, msg: _Message) -> None:
        """Hand a finished message to the connection."""

    # -- internals ---------------------------------------------------------

    def _begin(self, ts: int) -> None:
        self._msg = _Message(ts)
        self._parser = self._new_parser()
        self._head_tail = b""
        self._head_len = 0
        self._state = _HEAD
        self._started(ts)

    def _unsync(self) -> None:
        self._synced = False
        self._state = _SCAN
        self._scanner.reset()

    def _start_resync(self) -> None:
        self._resync_buf = bytearray()
        self._chunk_search = ChunkBoundarySearch()
        self._scanner.reset()

    def _feed_head(self, data: bytes, pos: int, ts: int) -> int:
        msg = self._msg
        parser = self._parser
        assert msg is not None and parser is not None
        msg.last_ts = ts
        tail = self._head_tail
        # The head, its blank line included, may take this many more bytes.
        window = min(len(data), pos + self.limits.max_head_bytes - self._head_len)
        if tail:
            index = (tail + data[pos:window]).find(b"\r\n\r\n")
            end = window if index < 0 else pos + index + 4 - len(tail)
        else:
            index = data.find(b"\r\n\r\n", pos, window)
            end = window if index < 0 else index + 4
        piece = data[pos:end]
        self._head_len += len(piece)
        try:
            parser.feed_data(piece)
        except httptools.HttpParserUpgrade:
            msg.upgrade = True
        except httptools.HttpParserError as exc:
            # llhttp pauses after an upgrade head (101, CONNECT); httptools reports the pause
            # as an error when its upgrade flag is not the one it expects.
            if msg.head_done and _UPGRADE_PAUSE in str(exc):
                msg.upgrade = True
            else:
                msg.problems.append(Problem(ProblemKind.PARSE_ERROR, f"bad message head: {exc}"))
                self._finish()
                self._unsync()
                return end
        if index < 0:
            if self._head_len >= self.limits.max_head_bytes:
                msg.problems.append(
                    Problem(
                        ProblemKind.PARSE_ERROR,
                        f"message head longer than {self.limits.max_head_bytes} bytes",
                    )
                )
                self._finish()
                self._unsync()
            else:
                self._head_tail = (tail + piece)[-3:]
            return end
        self._head_tail = b""
        if not msg.head_done:
            msg.problems.append(
                Problem(ProblemKind.PARSE_ERROR, "llhttp did not end the head at its blank line")
            )
            self._finish()
            self._unsync()
            return end
        msg.version = parser.get_http_version()
        keep = self._head(msg)
        if keep and self._state in (_BODY_LENGTH, _BODY_CHUNKED, _BODY_EOF):
            self._setup_body(msg)
        elif not keep:
            msg.decode_stopped = True
        if self._state == _BODY_CHUNKED:
            self._framer = ChunkFramer()
        return end

    def _setup_body(self, msg: _Message) -> None:
        coding = msg.header_list("content-encoding")
        if coding:
            msg.content_encoding = coding
            try:
                decoder = BodyDecoder(coding, self.limits.max_body_bytes)
            except ContentDecodingError as exc:
                msg.problems.append(Problem(ProblemKind.PARSE_ERROR, str(exc)))
            else:
                msg.decoder = None if decoder.identity else decoder

    def _feed_chunked(self, data: bytes, pos: int, ts: int) -> int:
        msg = self._msg
        parser = self._parser
        assert msg is not None and parser is not None
        msg.last_ts = ts
        framer = self._framer
        chunk = framer.whole_chunk(data, pos)
        if chunk is not None:
            # Every byte before was framed alike by both and accepted by llhttp, which is
            # therefore where a chunk-size line is due, and leaves this chunk there again:
            # its data goes on without the parser's pass and callback (the common segment).
            start, stop = chunk
            msg.wire += stop + 2 - pos
            self._body(data[start:stop], ts)
            return stop + 2
        try:
            end = framer.advance(data, pos)
        except ChunkFramingError as exc:
            msg.problems.append(Problem(ProblemKind.PARSE_ERROR, str(exc)))
            self._finish()
            self._unsync()
            return pos
        msg.wire += end - pos
        try:
            parser.feed_data(data if end - pos == len(data) else data[pos:end])
        except httptools.HttpParserError as exc:
            self._take_chunk_data(ts)
            msg.problems.append(Problem(ProblemKind.PARSE_ERROR, f"bad chunked body: {exc}"))
            self._finish()
            self._unsync()
            return end
        self._take_chunk_data(ts)
        if framer.done:
            if not msg.parsed:
                msg.problems.append(
                    Problem(ProblemKind.PARSE_ERROR, "chunked body ended where llhttp did not")
                )
                self._finish()
                self._unsync()
            else:
                self._complete()
        return end

    def _take_chunk_data(self, ts: int) -> None:
        """The body bytes of every chunk in one segment go on as one piece: tiny chunks cost
        one pass through decoding, the body cap and SSE per segment, not per chunk."""
        pieces = self._chunk_data
        if pieces:
            self._chunk_data = []
            self._body(pieces[0] if len(pieces) == 1 else b"".join(pieces), ts)

    def _feed_chunk_resync(self, data: bytes, pos: int, ts: int) -> int:
        msg = self._msg
        assert msg is not None
        buf = self._resync_buf
        before = len(buf)
        piece = data[pos:] if pos else data
        buf += piece
        chunk_at = self._chunk_search.search(buf)
        start = self._scanner.feed(piece)
        start_at = None if start is None else before + start
        if start_at is not None and (chunk_at is None or start_at < chunk_at):
            self._add_missing(start_at)
            msg.problems.append(
                Problem(ProblemKind.GAP, "the body ended inside a gap; its end was not seen")
            )
            self._finish()
            self._synced = True
            self._state = _IDLE
            rest = bytes(buf[start_at:])
            self._resync_buf = bytearray()
            self.feed(rest, ts)
            return len(data)
        if chunk_at is not None:
            self._add_missing(chunk_at)
            rest = bytes(buf[chunk_at:])
            self._resync_buf = bytearray()
            self._scanner.reset()
            parser = self._new_parser()
            self._priming = True
            try:
                parser.feed_data(self._prime)
            finally:
                self._priming = False
            self._parser = parser
            msg.parsed = False
            self._framer = ChunkFramer()
            self._state = _BODY_CHUNKED
            self.feed(rest, ts)
            return len(data)
        if len(buf) > self.limits.resync_window_bytes:
            self._add_missing(len(buf))
            msg.problems.append(
                Problem(ProblemKind.GAP, "no chunk boundary found after a gap; body cut there")
            )
            self._resync_buf = bytearray()
            self._finish()
            # The scanner has seen these bytes and goes on looking for the next start line.
            self._synced = False
            self._state = _SCAN
        return len(data)

    def _add_missing(self, extra: int) -> None:
        msg = self._msg
        assert msg is not None
        last = msg.gaps[-1]
        msg.gaps[-1] = BodyGap(last.body_offset, last.missing_bytes + extra)

    def _feed_scan(self, data: bytes, pos: int, ts: int) -> int:
        piece = data[pos:] if pos else data
        at = self._scanner.feed(piece)
        if at is None:
            self.skipped_bytes += len(piece)
            return len(data)
        self._synced = True
        self._state = _IDLE
        if at >= 0:
            self.skipped_bytes += at
            return pos + at
        # The start line began in bytes kept from earlier pieces: feed those first.
        self.feed(self._scanner.carried, ts)
        return pos

    def _body(self, data: bytes, ts: int) -> None:
        msg = self._msg
        if msg is None or msg.decode_stopped or not data:
            return
        if msg.decoder is not None:
            try:
                data = msg.decoder.decode(data)
            except ContentDecodingError as exc:
                msg.problems.append(Problem(ProblemKind.PARSE_ERROR, str(exc)))
                msg.decode_stopped = True
                return
        if msg.body_len + len(data) > self.limits.max_body_bytes:
            msg.problems.append(
                Problem(
                    ProblemKind.TRUNCATED,
                    f"body longer than {self.limits.max_body_bytes} bytes; the rest is not kept",
                )
            )
            msg.decode_stopped = True
            return
        msg.body.append(data)
        msg.body_len += len(data)
        if msg.sse is not None:
            msg.sse.feed(data, ts)

    def _body_gap(self, missing: int) -> None:
        msg = self._msg
        assert msg is not None
        msg.gaps.append(BodyGap(msg.body_len, missing))
        if msg.decoder is not None and not msg.decode_stopped:
            msg.decode_stopped = True
            msg.problems.append(
                Problem(
                    ProblemKind.GAP,
                    f"{msg.content_encoding} body cannot be decoded past a gap; cut there",
                )
            )
        if msg.sse is not None:
            msg.sse.gap()

    def _complete(self) -> None:
        self._finish()
        self._state = _IDLE

    def _finish(self) -> None:
        msg = self._msg
        if msg is None:
            return
        self._msg = None
        self._parser = None
        self.messages += 1
        if msg.gaps:
            missing = sum(g.missing_bytes for g in msg.gaps)
            msg.problems.insert(
                0,
                Problem(ProblemKind.GAP, f"{missing} body bytes missing in {len(msg.gaps)} gap(s)"),
            )
        if msg.sse is not None and msg.sse.dropped_events:
            msg.problems.append(
                Problem(
                    ProblemKind.TRUNCATED,
                    f"{msg.sse.dropped_events} SSE event(s) not kept: a line over "
                    f"{self.limits.max_sse_line_bytes} bytes or more than "
                    f"{self.limits.max_sse_events} events",
                )
            )
        self._deliver(msg)


class RequestListener(ABC):
    """What the request reader tells its connection."""

    @abstractmethod
    def request_started(self, ts_ns: int) -> None: ...

    @abstractmethod
    def request_head(self, method: str, target: str) -> bool:
        """Returns whether this request's exchange is recorded (bodies kept)."""

    @abstractmethod
    def request_done(self, message: RequestMessage) -> None: ...


class ResponseListener(ABC):
    """What the response reader asks and tells its connection."""

    @abstractmethod
    def response_head(self, status: int, ts_ns: int) -> tuple[str, bool]:
        """The method of the request this answers ("" if unknown) and whether it is kept."""

    @abstractmethod
    def response_done(self, message: ResponseMessage) -> None: ...


class RequestReader(MessageReader):
    _prime = _PRIME_REQUEST

    def __init__(self, limits: HttpLimits, listener: RequestListener) -> None:
        super().__init__(limits)
        self._listener = listener

    def _new_parser(self) -> httptools.HttpRequestParser:
        return httptools.HttpRequestParser(self)

    def _started(self, ts_ns: int) -> None:
        self._listener.request_started(ts_ns)

    def _head(self, msg: _Message) -> bool:
        parser = self._parser
        assert isinstance(parser, httptools.HttpRequestParser)
        msg.method = parser.get_method().decode("latin-1")
        keep = self._listener.request_head(msg.method, msg.target)
        transfer = msg.header_list("transfer-encoding")
        length = msg.header("content-length")
        if msg.upgrade:
            self._complete()
        elif transfer is not None:
            if transfer.split(",")[-1].strip().lower() == "chunked":
                self._state = _BODY_CHUNKED
            else:
                msg.problems.append(
                    Problem(ProblemKind.PARSE_ERROR, f"request transfer-encoding {transfer!r}")
                )
                self._finish()
                self._unsync()
        elif length is not None and int(length.split(",")[0]) > 0:
            self._remaining = int(length.split(",")[0])
            self._state = _BODY_LENGTH
        else:
            self._complete()
        return keep

    def _deliver(self, msg: _Message) -> None:
        self._listener.request_done(
            RequestMessage(
                method=msg.method,
                target=msg.target,
                version=msg.version,
                headers=tuple(msg.headers),
                trailers=tuple(msg.trailers),
                body=b"".join(msg.body),
                content_encoding=msg.content_encoding,
                wire_body_length=msg.wire,
                first_byte_ns=msg.first_ts,
                last_byte_ns=msg.last_ts,
                gaps=tuple(msg.gaps),
                problems=tuple(msg.problems),
            )
        )


class ResponseReader(MessageReader):
    _prime = _PRIME_RESPONSE
    _requests = False

    def __init__(self, limits: HttpLimits, listener: ResponseListener) -> None:
        super().__init__(limits)
        self._listener = listener
        self.upgraded = False

    def _new_parser(self) -> httptools.HttpResponseParser:
        return httptools.HttpResponseParser(self)

    def _started(self, ts_ns: int) -> None:
        return

    def _head(self, msg: _Message) -> bool:
        parser = self._parser
        assert isinstance(parser, httptools.HttpResponseParser)
        status = msg.status = parser.get_status_code()
        method, keep = self._listener.response_head(status, msg.first_ts)
        transfer = msg.header_list("transfer-encoding")
        length = msg.header("content-length")
        if status == 101 or (method == "CONNECT" and 200 <= status < 300):
            self.upgraded = True
            self._complete()
            self._state = _UPGRADED
        elif status < 200 or status in (204, 304) or method == "HEAD":
            self._complete()
        elif transfer is not None:
            chunked = transfer.split(",")[-1].strip().lower() == "chunked"
            self._state = _BODY_CHUNKED if chunked else _BODY_EOF
        elif length is not None:
            self._remaining = int(length.split(",")[0])
            if self._remaining:
                self._state = _BODY_LENGTH
            else:
                self._complete()
        else:
            self._state = _BODY_EOF
        content_type = (msg.header("content-type") or "").split(";")[0].strip().lower()
        if keep and content_type == "text/event-stream":
            msg.sse = SseParser(self.limits.max_sse_line_bytes, self.limits.max_sse_events)
        return keep

    def _deliver(self, msg: _Message) -> None:
        self._listener.response_done(
            ResponseMessage(
                status=msg.status,
                reason=msg.reason,
                version=msg.version,
                headers=tuple(msg.headers),
                trailers=tuple(msg.trailers),
                body=b"".join(msg.body),
                content_encoding=msg.content_encoding,
                wire_body_length=msg.wire,
                first_byte_ns=msg.first_ts,
                last_byte_ns=msg.last_ts,
                gaps=tuple(msg.gaps),
                problems=tuple(msg.problems),
                sse_events=tuple(msg.sse.events) if msg.sse is not None else (),
                is_sse=msg.sse is not None,
                sse_simple=msg.sse is not None and msg.sse.simple and not msg.sse.dropped_events,
            )
        )

"""Values the HTTP layer hands out: messages, their problems and body gaps, exchanges."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from collector.http.sse import SseEvent
from collector.tcp_reassembly import FlowInfo, StreamAmbiguity

Headers = tuple[tuple[str, str], ...]


class ProblemKind(enum.Enum):
    """What went wrong with a message or an exchange (the record's quality derives from it)."""

    GAP = "gap"  # bytes of this message are missing
    TRUNCATED = "truncated"  # the connection ended before the message did
    MIDSTREAM = "midstream"  # the capture began after this message or exchange did
    PARSE_ERROR = "parse_error"  # the bytes are not HTTP/1.1 (or the coding does not decode)
    NO_RESPONSE = "no_response"  # the request got no response before the connection ended
    NO_REQUEST = "no_request"  # a response whose request was never seen
    RESPONSE_LOST = "response_lost"  # no response, and the server side lost bytes in a gap
    # After lost messages, the request a response answers cannot be told among several: the
    # response is recorded alone with REQUEST_UNKNOWN, and each request it may have answered
    # that gets no response with RESPONSE_UNKNOWN (never a guessed pair).
    REQUEST_UNKNOWN = "request_unknown"
    RESPONSE_UNKNOWN = "response_unknown"


@dataclass(frozen=True, slots=True)
class Problem:
    kind: ProblemKind
    reason: str


@dataclass(frozen=True, slots=True)
class BodyGap:
    """A hole in a body: `missing_bytes` wire bytes lost at decoded offset `body_offset`."""

    body_offset: int
    missing_bytes: int


@dataclass(frozen=True, slots=True)
class RequestMessage:
    method: str
    target: str
    version: str
    headers: Headers
    trailers: Headers
    body: bytes
    content_encoding: str
    wire_body_length: int
    first_byte_ns: int
    last_byte_ns: int
    gaps: tuple[BodyGap, ...]
    problems: tuple[Problem, ...]
    #: Byte ranges of this message's stream seen in more than one version (see `exchange`).
    ambiguities: tuple[StreamAmbiguity, ...] = ()
    #: Stream offsets [start, end) that hold the message (bounds: a message that shares a
    #: segment with its neighbour is given the whole segment).
    stream_span: tuple[int, int] = (0, 0)

    def header(self, name: str) -> str | None:
        """The first header called `name` (case-insensitive)."""
        lowered = name.lower()
        return next((v for k, v in self.headers if k.lower() == lowered), None)


@dataclass(frozen=True, slots=True)
class ResponseMessage:
    status: int
    reason: str
    version: str
    headers: Headers
    trailers: Headers
    body: bytes
    content_encoding: str
    wire_body_length: int
    first_byte_ns: int
    last_byte_ns: int
    gaps: tuple[BodyGap, ...]
    problems: tuple[Problem, ...]
    sse_events: tuple[SseEvent, ...]
    is_sse: bool
    ambiguities: tuple[StreamAmbiguity, ...] = ()
    stream_span: tuple[int, int] = (0, 0)
    #: Each body piece was one whole event of one `data: ` line without CR, and every event
    #: was kept (`SseParser.simple`): the SDK's decoder reads `sse_events` from the body too.
    sse_simple: bool = False

    def header(self, name: str) -> str | None:
        lowered = name.lower()
        return next((v for k, v in self.headers if k.lower() == lowered), None)


@dataclass(frozen=True, slots=True)
class Exchange:
    """A request paired with its response; either may be missing, with `problems` saying why."""

    flow: FlowInfo
    request: RequestMessage | None
    response: ResponseMessage | None
    problems: tuple[Problem, ...]


@dataclass(frozen=True, slots=True)
class LateAmbiguity:
    """A differing copy of bytes whose records were already written.

    Records are append-only: those records keep the first version, and this is reported
    on its own (the pipeline writes an amendment record naming them)."""

    flow: FlowInfo
    ambiguity: StreamAmbiguity
    #: The ids of the records that hold the bytes, oldest first; empty when the messages
    #: holding them are older than the ones each connection remembers (`WRITTEN_KEPT`).
    record_ids: tuple[str, ...]

"""The events openai-python's SSE decoder yields from a response body (openai/_streaming.py).

What the client saw is decided by its SDK, not by the SSE specification the HTTP
layer follows (collector.http.sse), and the two differ where a prover can choose:

- Lines end at CR, LF or CRLF, and each line is decoded as strict UTF-8: the
  first line that is not UTF-8 raises in the client, whose stream ends there.
- A leading byte-order mark is kept, so the first line's field name starts with
  U+FEFF and the line is ignored.
- A blank line dispatches an event whenever a non-empty event name, a data
  line, a non-empty id (ids persist across events) or a retry was seen, even
  without data (the SDK then fails to decode the empty data as JSON).
- Comments (`:...`) and unknown fields are ignored; `data` lines join with
  "\\n"; one space after the colon is dropped; a final line without its
  terminator never dispatches.

`sdk_events` is linear in the body: one strict decode, one split, one pass.
`simple_stream` skips even that for the body servers send, each piece one event
of one `data: ` line, which both readings read alike (the HTTP layer says so:
`ResponseMessage.sse_simple`): it hands on the HTTP layer's events themselves,
whose unnamed events say `""` where the SDK says None (readers test the name's
truth, never `is None`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from collector.http.messages import ResponseMessage

_LINE_END = re.compile("\r\n|\r|\n")
# Named tuples are built with tuple.__new__ on hot paths: half the cost of calling the class.
_new_event = tuple.__new__


class SdkEvent(NamedTuple):
    """One event as the SDK's `ServerSentEvent` holds it (`event` None when unnamed).

    A named tuple: one is built per event on the hot path.
    """

    event: str | None
    data: str


class ClientEvent(Protocol):
    """An event as the dialects read it: an `SdkEvent`, or the HTTP layer's `SseEvent`
    where the two readings agree (an unnamed event's name is then `""`, not None)."""

    @property
    def event(self) -> str | None: ...

    @property
    def data(self) -> str: ...


@dataclass(frozen=True, slots=True)
class SdkStream:
    """The events the SDK yields, and where its decoding raises (None: it never does)."""

    events: tuple[ClientEvent, ...]
    #: Byte offset of the first byte that is not UTF-8 (the SDK raises on its line).
    undecodable_at: int | None


def sdk_events(body: bytes) -> SdkStream:
    """The events openai-python's `SSEDecoder.iter_bytes` yields from `body`."""
    undecodable_at = None
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        undecodable_at = exc.start
        text = body[: exc.start].decode("utf-8")
    lines = _LINE_END.split(text) if "\r" in text else text.split("\n")
    lines.pop()  # unterminated (or the line that does not decode): it never dispatches
    events: list[SdkEvent] = []
    event = ""
    data: list[str] = []
    last_id = ""
    retry = False
    append = events.append
    for line in lines:
        if line[:6] == "data: ":  # the common line, as the general rule below reads it
            data.append(line[6:])
            continue
        if not line:
            if event or data or last_id or retry:
                text = data[0] if len(data) == 1 else "\n".join(data)
                append(_new_event(SdkEvent, (event or None, text)))
            event, data, retry = "", [], False
            continue
        if line[0] == ":":
            continue
        name, _, value = line.partition(":")
        if value[:1] == " ":
            value = value[1:]
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
        elif name == "id":
            if "\0" not in value:
                last_id = value
        elif name == "retry":
            retry = retry or _is_int(value)
    return SdkStream(tuple(events), undecodable_at)


def simple_stream(response: ResponseMessage) -> SdkStream | None:
    """The SDK's events of a whole, UTF-8, `sse_simple` body: the HTTP layer's (None: the
    body must be decoded as the SDK decodes it).

    Without CR, BOM, comments or fields other than `data: `, the SDK's rules and the
    specification's agree event for event, and every event is unnamed."""
    if not response.sse_simple or response.gaps:
        return None
    try:
        response.body.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return SdkStream(response.sse_events, None)


def _is_int(value: str) -> bool:
    """Whether Python's `int(value)` accepts it (how the SDK reads `retry`)."""
    try:
        int(value)
    except ValueError:
        return False
    return True

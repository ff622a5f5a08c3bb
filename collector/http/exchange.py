"""One TCP connection as HTTP/1.1: a reader per direction, requests paired with responses.

`Connection` is the `StreamHandler` the reassembler drives. Responses pair with
requests in order (pipelining included); 1xx responses are informational and
pair with nothing. A response whose first byte was captured before the
request it would pair with cannot answer it: it is an orphan (its request was
lost, or the capture began after it). A response waits while no request is
pending, since the request may be held up behind a hole in the other
direction. Every request ends in exactly one exchange; so does every orphan.
Exchanges whose request path no dialect knows are counted, not emitted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeVar

from collector.http.messages import Exchange, Problem, ProblemKind, RequestMessage, ResponseMessage
from collector.http.reader import (
    HttpLimits,
    RequestListener,
    RequestReader,
    ResponseListener,
    ResponseReader,
)
from collector.tcp_reassembly import CLIENT_TO_SERVER, SERVER_TO_CLIENT, FlowInfo, StreamAmbiguity

_Message = TypeVar("_Message", RequestMessage, ResponseMessage)

# Whether an exchange for (method, target) is recorded.
PathFilter = Callable[[str, str], bool]
ExchangeSink = Callable[[Exchange], None]


@dataclass(slots=True)
class HttpStats:
    """Counters over all connections."""

    connections: int = 0
    requests: int = 0
    responses: int = 0
    informational: int = 0
    exchanges: int = 0
    not_recorded: int = 0
    orphan_responses: int = 0
    unanswered_requests: int = 0
    upgraded: int = 0
    skipped_bytes: int = 0


class _Slot:
    __slots__ = ("first_ts", "keep", "method", "request", "response")

    def __init__(self, first_ts: int) -> None:
        self.first_ts = first_ts
        self.keep = True
        self.method = ""
        self.request: RequestMessage | None = None
        self.response: ResponseMessage | None = None


class Connection(RequestListener, ResponseListener):
    """HTTP over one flow; emits `Exchange` values through `sink`."""

    def __init__(
        self,
        flow: FlowInfo,
        limits: HttpLimits,
        recorded: PathFilter,
        sink: ExchangeSink,
        stats: HttpStats,
    ) -> None:
        self.flow = flow
        self._recorded = recorded
        self._sink = sink
        self._stats = stats
        self.client = RequestReader(limits, self)
        self.server = ResponseReader(limits, self)
        self._slots: deque[_Slot] = deque()
        self._waiting: deque[ResponseMessage] = deque()
        self._client_midstream = False
        self._first_request_ts: int | None = None
        # Ambiguous byte ranges per direction, for the next message that direction finishes.
        self._ambiguous: tuple[list[StreamAmbiguity], list[StreamAmbiguity]] = ([], [])
        stats.connections += 1

    # -- StreamHandler -----------------------------------------------------

    def on_start(self, direction: int, midstream: bool, ts_ns: int) -> None:
        if direction == CLIENT_TO_SERVER:
            self._client_midstream = midstream
            self.client.start(midstream)
        else:
            self.server.start(midstream)

    def on_data(self, direction: int, data: bytes, ts_ns: int) -> None:
        if direction == CLIENT_TO_SERVER:
            self.client.feed(data, ts_ns)
        else:
            self.server.feed(data, ts_ns)

    def on_gap(self, direction: int, length: int, ts_ns: int) -> None:
        if direction == CLIENT_TO_SERVER:
            self.client.gap(length, ts_ns)
        else:
            self.server.gap(length, ts_ns)

    def on_ambiguous(self, ambiguity: StreamAmbiguity, ts_ns: int) -> None:
        self._ambiguous[ambiguity.direction].append(ambiguity)

    def on_end(self, direction: int, reason: str, ts_ns: int) -> None:
        if direction == CLIENT_TO_SERVER:
            self.client.end(reason, ts_ns)
        else:
            self.server.end(reason, ts_ns)

    def on_close(self, reason: str, ts_ns: int) -> None:
        self.client.end(reason, ts_ns)
        self.server.end(reason, ts_ns)
        self._pair()
        while self._waiting:
            self._orphan(self._waiting.popleft())
        while self._slots:
            slot = self._slots.popleft()
            problems: tuple[Problem, ...] = ()
            if slot.response is None:
                self._stats.unanswered_requests += 1
                if self.server.lost_between_messages:
                    problems = (
                        Problem(ProblemKind.RESPONSE_LOST, "the response was lost in a gap"),
                    )
                else:
                    problems = (
                        Problem(
                            ProblemKind.NO_RESPONSE,
                            f"no response before the connection ended ({reason})",
                        ),
                    )
            self._emit(slot, problems)
        self._stats.skipped_bytes += self.client.skipped_bytes + self.server.skipped_bytes

    # -- reader listeners --------------------------------------------------

    def request_started(self, ts_ns: int) -> None:
        self._slots.append(_Slot(ts_ns))
        if self._first_request_ts is None:
            self._first_request_ts = ts_ns
        if self._waiting:
            self._pair()

    def request_head(self, method: str, target: str) -> bool:
        slot = self._slots[-1]
        slot.method = method
        slot.keep = self._recorded(method, target)
        return slot.keep

    def request_done(self, message: RequestMessage) -> None:
        self._stats.requests += 1
        message = self._with_ambiguities(CLIENT_TO_SERVER, message)
        self._slots[-1].request = message
        self._flush()

    def response_head(self, status: int, ts_ns: int) -> tuple[str, bool]:
        slot = self._unanswered()
        if slot is None or slot.first_ts > ts_ns:
            return "", True
        return slot.method, slot.keep

    def response_done(self, message: ResponseMessage) -> None:
        if 100 <= message.status < 200 and message.status != 101:
            self._stats.informational += 1
            return
        self._stats.responses += 1
        message = self._with_ambiguities(SERVER_TO_CLIENT, message)
        if self.server.upgraded:
            self._stats.upgraded += 1
            self.client.upgrade()
        self._waiting.append(message)
        self._pair()

    def _with_ambiguities(self, direction: int, message: _Message) -> _Message:
        """`message` with the ambiguous ranges its direction reported since the last one.

        The reassembler reports a range before delivering its bytes, or as soon as a
        differing copy of delivered bytes arrives; either way the message in progress,
        or the next one, holds them. (A copy that differs from a message already
        finished marks the next message instead: conservative, never `complete`.)
        """
        pending = self._ambiguous[direction]
        if not pending:
            return message
        found = tuple(pending)
        pending.clear()
        return replace(message, ambiguities=message.ambiguities + found)

    # -- pairing -----------------------------------------------------------

    def _unanswered(self) -> _Slot | None:
        return next((s for s in self._slots if s.response is None), None)

    def _pair(self) -> None:
        while self._waiting:
            slot = self._unanswered()
            if slot is None:
                return
            response = self._waiting[0]
            if slot.first_ts > response.first_byte_ns:
                self._orphan(self._waiting.popleft())
                continue
            slot.response = self._waiting.popleft()
        self._flush()

    def _flush(self) -> None:
        slots = self._slots
        while slots and slots[0].request is not None and slots[0].response is not None:
            self._emit(slots.popleft(), ())

    def _orphan(self, response: ResponseMessage) -> None:
        self._stats.orphan_responses += 1
        first = self._first_request_ts
        if self._client_midstream and (first is None or response.first_byte_ns < first):
            problem = Problem(ProblemKind.MIDSTREAM, "the capture began after this request")
        else:
            problem = Problem(ProblemKind.NO_REQUEST, "no request was seen for this response")
        self._stats.exchanges += 1
        self._sink(Exchange(self.flow, None, response, (problem,)))

    def _emit(self, slot: _Slot, problems: tuple[Problem, ...]) -> None:
        if not slot.keep:
            self._stats.not_recorded += 1
            return
        self._stats.exchanges += 1
        self._sink(Exchange(self.flow, slot.request, slot.response, problems))

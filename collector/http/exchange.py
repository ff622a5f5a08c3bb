"""One TCP connection as HTTP/1.1: a reader per direction, requests paired with responses.

`Connection` is the `StreamHandler` the reassembler drives. Every request ends
in exactly one exchange; so does every response that pairs with none. 1xx
responses are informational and pair with nothing. Exchanges whose request path
no dialect knows are counted, not emitted.

Pairing survives loss; it never shifts. HTTP/1.1 answers requests in order, so
without loss the n-th response answers the n-th request. Loss breaks the count:
a gap on the client side may hide requests, one on the server side responses.
Each gap becomes a *loss marker* at its place in its direction's sequence of
messages, saying whether at least one message was lost there (the reader was
between messages and a start line's worth of bytes is missing) or maybe some.
For each response the connection keeps the range of requests it may answer
(requests hidden in a marker included), and narrows it:

- **Order.** A response answers a request after the one its predecessor
  answered; at least one later for each response certainly lost before it.
- **Time.** A response cannot begin before its request's first byte. A TAP
  delivers the two directions on separate ports, merged with skew: a response
  captured up to `HttpLimits.response_skew_ns` (`[http] response_skew_s`,
  100 ms) before its request's first byte (so also before its last) still
  pairs with it. When only that tolerance lets a response reach a request, and
  the next response began after the request and has no other to answer, the
  next one answers it.
- **One at a time.** Clients send a request after the previous response has
  ended unless the connection shows otherwise: a request begun before the
  previous response ended marks the connection pipelined. On a connection not
  pipelined, a response answers the latest request begun before it, when that
  request is visible, unanswered and begun after the previous response ended.
  After a lost response, or a predecessor that could not be paired, a client
  that pipelined while the messages showing it were lost reads the same, so
  the rule then asks more (see `_one_at_a_time`). After a paired predecessor
  it must also agree with the count: the request reached by counting one
  message for each marker that hides at least one (and none for the others).
  A client that sent a request ahead and lost it, with its response, reads by
  time alone as a client that waited and lost one more response; the count
  tells them apart unless a marker was made by several gaps, and then the
  rule says nothing.

A response whose range holds one request pairs with it, or is an orphan when
that request is hidden (`no_request`; `midstream` before the first request of
a stream picked up midway). A response whose range holds several is emitted
alone with `request_unknown`, and each request it might have answered that
ends with no response gets `response_unknown`: the record says the pairing
cannot be known instead of guessing. A request no response can answer any
more is emitted with `response_lost` (the server side lost bytes) or
`no_response`. A response whose range reaches requests not seen yet waits
until the client side passes its time or ends, since a request may be held up
behind a hole in the other direction. Requests and their start times are kept
in lists bisected by time, so each decision costs O(log n).

Ambiguous byte ranges (`on_ambiguous`: copies that differ) mark the messages
that hold them, by stream offset: a message in progress or not begun when its
bytes arrive, and a finished one whose exchange is not emitted yet (a request
waiting for its answer). A range inside messages already emitted cannot change
their records (the log is append-only): it is counted (`late_ambiguities`), marks no
other message, and goes to the connection's `late` sink as a `LateAmbiguity` naming the
records that hold those bytes (the sink returns each record's id; the connection
remembers the spans of its last `WRITTEN_KEPT` messages per direction). A range only in
exchanges not recorded (unknown paths) is counted alone.

Known limit: "one at a time" is an assumption. A client that pipelines while
the messages that would show it are lost, and loses as many more responses as
it has requests hidden ahead, can still get a response paired with the request
after the one it answers: time and count then agree on the wrong one. HTTP
clients of the OpenAI API (httpx, aiohttp, requests) do not pipeline; a
connection that shows pipelining never uses the rule. When the rule says
nothing on a pipelining connection, its later responses stay `request_unknown`:
with one request outstanding, each has two it may answer.
"""

from __future__ import annotations

import enum
from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeVar

from collector.http.messages import (
    Exchange,
    LateAmbiguity,
    Problem,
    ProblemKind,
    RequestMessage,
    ResponseMessage,
)
from collector.http.reader import (
    HttpLimits,
    MessageReader,
    RequestListener,
    RequestReader,
    ResponseListener,
    ResponseReader,
)
from collector.tcp_reassembly import CLIENT_TO_SERVER, SERVER_TO_CLIENT, FlowInfo, StreamAmbiguity

_Message = TypeVar("_Message", RequestMessage, ResponseMessage)

# Whether an exchange for (method, target) is recorded.
PathFilter = Callable[[str, str], bool]
# Takes an exchange; returns the id of its record (None: the sink does not say).
ExchangeSink = Callable[[Exchange], str | None]
LateSink = Callable[[LateAmbiguity], None]

# The shortest start line and blank line of any message ("HTTP/1.1 200\r\n\r\n"): bytes lost
# at a message boundary hold at least one message only when there are this many.
MIN_MESSAGE_BYTES = 16
# The start of a connection: the position before its first request.
_START = -1
#: Emitted messages per direction whose stream spans and record ids are remembered, for a
#: late differing copy to name the record that holds its bytes.
WRITTEN_KEPT = 16
# What is remembered of a message not recorded (an exchange on an unknown path).
_NOT_RECORDED = None


class Loss(enum.IntEnum):
    """What a gap in one direction says about the number of messages lost there."""

    NONE = 0
    SOME = 1  # zero or more messages may be lost
    AT_LEAST_ONE = 2  # the reader was between messages: the next one's start is gone


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
    unpaired_responses: int = 0
    unanswered_requests: int = 0
    pipelined_connections: int = 0
    upgraded: int = 0
    skipped_bytes: int = 0
    #: Differing copies of bytes whose records were already emitted (counted, nothing marked).
    late_ambiguities: int = 0


class _Slot:
    """A request, from its first byte on, and the response paired with it."""

    __slots__ = ("first_ts", "keep", "method", "request", "response")

    def __init__(self, first_ts: int) -> None:
        self.first_ts = first_ts
        self.keep = True
        self.method = ""
        self.request: RequestMessage | None = None
        self.response: ResponseMessage | None = None


@dataclass(frozen=True, slots=True)
class _Pending:
    """A finished response waiting for its pairing, with the loss marker before it."""

    response: ResponseMessage
    loss_before: Loss
    #: More than one gap made the marker: how many messages it hides is not even guessed.
    several_gaps: bool = False


# Positions in the client's sequence of requests: 2*i + 1 is visible request i (counted
# from 0 on the connection), 2*i stands for the requests hidden in the loss marker just
# before request i. The order of positions is the order of requests on the wire.


def _visible(position: int) -> bool:
    return position % 2 == 1


def _index(position: int) -> int:
    return position // 2


def _overlaps(message: RequestMessage | ResponseMessage, ambiguity: StreamAmbiguity) -> bool:
    start, end = message.stream_span
    return ambiguity.start < end and ambiguity.end > start


def _marked(message: _Message, ambiguity: StreamAmbiguity) -> _Message:
    return replace(message, ambiguities=(*message.ambiguities, ambiguity))


class Connection(RequestListener, ResponseListener):
    """HTTP over one flow; emits `Exchange` values through `sink`."""

    def __init__(
        self,
        flow: FlowInfo,
        limits: HttpLimits,
        recorded: PathFilter,
        sink: ExchangeSink,
        stats: HttpStats,
        *,
        late: LateSink | None = None,
    ) -> None:
        self.flow = flow
        self._recorded = recorded
        self._sink = sink
        self._late = late
        self._stats = stats
        self._skew = limits.response_skew_ns
        self.client = RequestReader(limits, self)
        self.server = ResponseReader(limits, self)
        # Requests by index (request i at `_requests[i - _base]`): those from `_first` on
        # are not emitted yet; `_next` is the index the next one gets. `_starts` holds
        # their first capture times, made non-decreasing, for bisection.
        self._requests: list[_Slot] = []
        self._starts: list[int] = []
        self._base = 0
        self._first = 0
        self._next = 0
        # Index ranges of requests that responses emitted with `request_unknown` may answer.
        self._unknown: deque[tuple[int, int]] = deque()
        # Loss markers: before request i (client side), before server message i (by the
        # reader's count of finished messages, 1xx included).
        self._client_losses: dict[int, Loss] = {}
        self._server_losses: dict[int, Loss] = {}
        # Markers made by more than one gap.
        self._client_several: set[int] = set()
        self._server_several: set[int] = set()
        self._carried_loss = Loss.NONE
        self._carried_several = False
        self._waiting: deque[_Pending] = deque()
        # The range of positions the last decided response may have answered.
        self._lo = _START
        self._hi = _START
        self._last_response_end: int | None = None
        self._pipelined = False
        self._client_ended = False
        self._server_ended = False
        self._client_midstream = False
        self._first_request_ts: int | None = None
        # Ambiguous byte ranges per direction not in a finished message yet.
        self._ambiguous: tuple[list[StreamAmbiguity], list[StreamAmbiguity]] = ([], [])
        # Stream positions per direction: what `on_data` and `on_gap` gave so far, where
        # the latest piece of data began, and where the message in progress may begin.
        self._fed = [0, 0]
        self._piece_start = [0, 0]
        self._open_from = [0, 0]
        self._server_lost = False
        # Per direction, (stream start, end, record id: "" unknown, None not recorded) of
        # the latest emitted messages.
        self._written: tuple[deque[tuple[int, int, str | None]], ...] = (
            deque(maxlen=WRITTEN_KEPT),
            deque(maxlen=WRITTEN_KEPT),
        )
        stats.connections += 1

    # -- StreamHandler -----------------------------------------------------

    def on_start(self, direction: int, midstream: bool, ts_ns: int) -> None:
        if direction == CLIENT_TO_SERVER:
            self._client_midstream = midstream
            self.client.start(midstream)
            if midstream:
                self._mark_client(Loss.SOME)
        else:
            self.server.start(midstream)
            if midstream:
                self._mark_server(0, Loss.SOME)

    def on_data(self, direction: int, data: bytes, ts_ns: int) -> None:
        fed = self._fed
        start = self._piece_start[direction] = fed[direction]
        fed[direction] = start + len(data)
        reader: MessageReader = self.client if direction == CLIENT_TO_SERVER else self.server
        reader.feed(data, ts_ns)
        if not reader.in_message:
            self._open_from[direction] = fed[direction]

    def on_gap(self, direction: int, length: int, ts_ns: int) -> None:
        reader: MessageReader = self.client if direction == CLIENT_TO_SERVER else self.server
        at_boundary = reader.at_message_boundary
        lost_before, finished_before = reader.lost_between_messages, reader.messages
        self._piece_start[direction] = self._fed[direction]
        self._fed[direction] += length
        reader.gap(length, ts_ns)
        if not reader.in_message:
            self._open_from[direction] = self._fed[direction]
        between = reader.lost_between_messages > lost_before or reader.messages > finished_before
        loss = (
            Loss.AT_LEAST_ONE
            if between and at_boundary and length >= MIN_MESSAGE_BYTES
            else Loss.SOME
        )
        if direction == CLIENT_TO_SERVER:
            self._mark_client(loss)
        else:
            self._server_lost = True
            # Between messages, the marker precedes the next message to finish; inside a
            # body, the message in progress goes on and the marker follows it.
            self._mark_server(reader.messages if between else reader.messages + 1, loss)

    def on_ambiguous(self, ambiguity: StreamAmbiguity, ts_ns: int) -> None:
        """Mark the messages that hold the range: finished ones whose records are not
        emitted yet now, the one in progress (and later ones) when they finish. A range
        inside messages already emitted is counted (`late_ambiguities`) and reported."""
        open_from = self._open_from[ambiguity.direction]
        if ambiguity.start < open_from and not self._mark_finished(ambiguity):
            self._late_ambiguity(ambiguity)
        if ambiguity.end > open_from:
            self._ambiguous[ambiguity.direction].append(ambiguity)

    def on_end(self, direction: int, reason: str, ts_ns: int) -> None:
        if direction == CLIENT_TO_SERVER:
            self.client.end(reason, ts_ns)
            self._client_ended = True
            self._decide()
        else:
            self.server.end(reason, ts_ns)
            self._server_ended = True
            self._decide()

    def on_close(self, reason: str, ts_ns: int) -> None:
        self.client.end(reason, ts_ns)
        self.server.end(reason, ts_ns)
        self._client_ended = self._server_ended = True
        self._decide()
        while self._first < self._next:
            self._first += 1
            self._emit_unanswered(self._first - 1, reason)
        self._stats.skipped_bytes += self.client.skipped_bytes + self.server.skipped_bytes

    def _late_ambiguity(self, ambiguity: StreamAmbiguity) -> None:
        """Bytes of messages already emitted arrived in another version: count it, and
        report it with the ids of the records that hold them."""
        self._stats.late_ambiguities += 1
        held = [
            record_id
            for start, end, record_id in self._written[ambiguity.direction]
            if ambiguity.start < end and ambiguity.end > start
        ]
        if held and all(record_id is _NOT_RECORDED for record_id in held):
            return
        if self._late is not None:
            ids = tuple(record_id for record_id in held if record_id)
            self._late(LateAmbiguity(self.flow, ambiguity, ids))

    # -- reader listeners --------------------------------------------------

    def request_started(self, ts_ns: int) -> None:
        previous = self._slot(self._next - 1)
        if (
            previous is not None
            and previous.response is not None
            and ts_ns < previous.response.last_byte_ns
        ):
            self._mark_pipelined()
        self._requests.append(_Slot(ts_ns))
        self._starts.append(max(ts_ns, self._starts[-1]) if self._starts else ts_ns)
        self._next += 1
        if self._first_request_ts is None:
            self._first_request_ts = ts_ns
        self._decide()

    def request_head(self, method: str, target: str) -> bool:
        slot = self._requests[-1]
        slot.method = method
        slot.keep = self._recorded(method, target)
        return slot.keep

    def request_done(self, message: RequestMessage) -> None:
        self._stats.requests += 1
        message = self._with_ambiguities(CLIENT_TO_SERVER, message)
        if self._requests:
            self._requests[-1].request = message
        self._flush()

    def response_head(self, status: int, ts_ns: int) -> tuple[str, bool]:
        if self._waiting:
            return "", True
        loss = self._server_losses.get(self.server.messages, Loss.NONE)
        lo, hi = self._order_range(max(loss, self._carried_loss))
        hi_time, _ = self._time_bound(ts_ns + self._skew)
        hi = hi_time if hi is None else min(hi, hi_time)
        slot = self._slot(_index(lo)) if _visible(lo) else None
        if slot is None or lo != hi:
            return (slot.method if slot is not None else ""), True
        return slot.method, slot.keep

    def response_done(self, message: ResponseMessage) -> None:
        finished = self.server.messages - 1
        loss = max(self._server_losses.pop(finished, Loss.NONE), self._carried_loss)
        several = self._carried_several or finished in self._server_several
        self._server_several.discard(finished)
        if 100 <= message.status < 200 and message.status != 101:
            self._stats.informational += 1
            self._carried_loss = loss
            self._carried_several = several
            return
        self._carried_loss = Loss.NONE
        self._carried_several = False
        self._stats.responses += 1
        message = self._with_ambiguities(SERVER_TO_CLIENT, message)
        if self.server.upgraded:
            self._stats.upgraded += 1
            self.client.upgrade()
        self._waiting.append(_Pending(message, loss, several))
        self._decide()

    # -- loss markers --------------------------------------------------------

    def _mark_client(self, loss: Loss) -> None:
        if self._next in self._client_losses:
            self._client_several.add(self._next)
        self._client_losses[self._next] = max(self._client_losses.get(self._next, loss), loss)

    def _mark_server(self, message: int, loss: Loss) -> None:
        if message in self._server_losses:
            self._server_several.add(message)
        self._server_losses[message] = max(self._server_losses.get(message, loss), loss)

    def _mark_pipelined(self) -> None:
        if not self._pipelined:
            self._pipelined = True
            self._stats.pipelined_connections += 1

    def _with_ambiguities(self, direction: int, message: _Message) -> _Message:
        """`message`, just finished, with its stream span and the ambiguous ranges in it.

        The reassembler reports a range before delivering its bytes, or as soon as a
        differing copy of delivered bytes arrives (`on_ambiguous`). The message spans
        from the end of the previous one (where the piece that finished it began, or
        where its direction stood when no message was in progress) to the end of the
        piece that finished it: a range in a piece two messages share marks both.
        """
        span = (self._open_from[direction], self._fed[direction])
        self._open_from[direction] = self._piece_start[direction]
        pending = self._ambiguous[direction]
        if not pending:
            return replace(message, stream_span=span)
        found = tuple(a for a in pending if a.start < span[1])
        pending[:] = [a for a in pending if a.start >= span[1]]
        return replace(message, stream_span=span, ambiguities=message.ambiguities + found)

    def _mark_finished(self, ambiguity: StreamAmbiguity) -> bool:
        """Add `ambiguity` to the finished messages not emitted yet that it overlaps;
        whether there was one."""
        marked = False
        unemitted = self._requests[self._first - self._base :]
        if ambiguity.direction == CLIENT_TO_SERVER:
            for slot in unemitted:
                if slot.request is not None and _overlaps(slot.request, ambiguity):
                    slot.request = _marked(slot.request, ambiguity)
                    marked = True
            return marked
        for slot in unemitted:
            if slot.response is not None and _overlaps(slot.response, ambiguity):
                slot.response = _marked(slot.response, ambiguity)
                marked = True
        for at, pending in enumerate(self._waiting):
            if _overlaps(pending.response, ambiguity):
                self._waiting[at] = replace(pending, response=_marked(pending.response, ambiguity))
                marked = True
        return marked

    # -- pairing -----------------------------------------------------------

    def _succ_lo(self, position: int) -> int:
        """The earliest position of the request after the one at `position`."""
        if not _visible(position):
            return position  # a marker may hide more than one request
        following = _index(position) + 1
        return 2 * following if following in self._client_losses else 2 * following + 1

    def _succ_hi(self, position: int) -> int:
        """The latest position of the request after the one at `position`."""
        if not _visible(position):
            return position + 1
        following = _index(position) + 1
        if self._client_losses.get(following) is Loss.AT_LEAST_ONE:
            return 2 * following
        return 2 * following + 1

    def _order_range(self, loss_before: Loss) -> tuple[int, int | None]:
        """Positions the next response may answer by order alone (None: no upper bound)."""
        lo = self._succ_lo(self._lo)
        if loss_before is Loss.AT_LEAST_ONE:
            lo = self._succ_lo(lo)
        if loss_before is not Loss.NONE:
            return lo, None
        return lo, self._succ_hi(self._hi)

    def _slot(self, index: int) -> _Slot | None:
        """Request `index` if it is not emitted yet."""
        if self._first <= index < self._next:
            return self._requests[index - self._base]
        return None

    def _span(self, lo: int, hi: int) -> range:
        """The indices of the requests not emitted yet whose positions are in [lo, hi]."""
        return range(max(lo // 2, self._first), min((hi - 1) // 2, self._next - 1) + 1)

    def _time_bound(self, limit: int) -> tuple[int, bool]:
        """The last position whose request may have begun by capture time `limit`, and
        whether that is final (a later request was seen, or the client side ended)."""
        begun = self._base + bisect_right(self._starts, limit)
        last = begun - 1
        final = self._client_ended or begun < self._next
        following = last + 1
        if following in self._client_losses:
            return 2 * following, final
        return 2 * last + 1, final

    def _decide(self) -> None:
        """Pair the waiting responses, in order, as far as what is known allows."""
        while self._waiting and self._decide_one(self._waiting[0]):
            self._waiting.popleft()
        self._flush()

    def _decide_one(self, pending: _Pending) -> bool:
        """Decide the first waiting response; False: not yet (it waits for more)."""
        response = pending.response
        lo, hi_order = self._order_range(pending.loss_before)
        hi_time, final = self._time_bound(response.first_byte_ns + self._skew)
        time_limited = hi_order is None or hi_order > hi_time
        hi = hi_time if hi_order is None or time_limited else hi_order
        # A range bounded by time alone may still grow while later requests can appear.
        settled = final or not time_limited
        if lo == hi and settled:
            if _visible(lo) and self._slot(_index(lo)) is not None:
                self._pair(lo, response)
            else:
                self._orphan(response, "its request was lost in a gap")
                self._set_range(lo, hi, response)
            return True
        if lo > hi:
            if not settled:
                return False
            self._orphan(response, "no request fits this response in order and time")
            return True
        # The latest request begun before the response: strictly before its first byte, or
        # within the skew after it but not within the skew before its end (there, it is
        # likelier the next request, sent once this response was read).
        first, last = response.first_byte_ns, response.last_byte_ns
        latest, latest_final = self._time_bound(
            min(first + self._skew, max(first, last - self._skew)) - 1
        )
        if not latest_final:
            return False
        chosen = self._one_at_a_time(lo, hi, latest, pending)
        if chosen is not None:
            self._pair(chosen, response)
            return True
        if not settled:
            return False
        if not self._span(lo, hi):
            self._orphan(response, "its request was lost in a gap")
            self._set_range(lo, hi, response)
            return True
        refuted = self._skew_refuted(lo, hi, response)
        if refuted is None:
            return False
        if not refuted:
            self._unpaired(lo, hi, response)
        elif _visible(lo):
            self._orphan(response, "no request fits this response in order and time")
        else:
            self._orphan(response, "its request was lost in a gap")
            self._set_range(lo, lo, response)
        return True

    def _one_at_a_time(self, lo: int, hi: int, latest: int, pending: _Pending) -> int | None:
        """The request a connection not pipelined says is answered (None: it says nothing).

        The client waited for the previous response to end before it sent the request
        this answers, and for this one before sending the next: so this answers the
        `latest` request begun before it (see `_decide_one` for the skew), when that
        request is visible, unanswered, in the range and begun after the previous
        response ended. When the previous response could not be paired, or a response
        was lost before this one, a client that pipelined while the messages showing it
        were lost reads the same: then no other visible request may be in the range and
        none may be hidden right after `latest`, or, after a loss with the previous
        response paired, every other request in the range must have begun after it.
        """
        if self._pipelined:
            return None
        index = (latest - 1) // 2
        position = 2 * index + 1
        slot = self._slot(index)
        if slot is None or slot.response is not None or not lo <= position <= hi:
            return None
        end = self._last_response_end
        if end is not None and slot.first_ts < end:
            return None
        uncertain = self._lo < self._hi
        if not uncertain:
            # The count must agree: a client that pipelined ahead of a lost request and a
            # client that waited, with one more response lost, read alike by time alone.
            return position if position == self._counted(pending) else None
        others = self._span(lo, position - 1)
        if (uncertain and (others or not _visible(lo))) or index + 1 in self._client_losses:
            return None
        if others and (end is None or self._requests[others[0] - self._base].first_ts < end):
            return None
        return position

    def _counted(self, pending: _Pending) -> int | None:
        """The position `pending` answers if every marker that hides at least one message
        hides exactly one and every other marker none, counted from a paired predecessor
        (None: a marker made by several gaps is on the way, so not even that is guessed)."""
        if pending.several_gaps:
            return None
        position = self._lo
        for _ in range(2 if pending.loss_before is Loss.AT_LEAST_ONE else 1):
            if not _visible(position):
                if _index(position) in self._client_several:
                    return None
                position += 1
                continue
            following = _index(position) + 1
            if following in self._client_several:
                return None
            hidden = self._client_losses.get(following) is Loss.AT_LEAST_ONE
            position = 2 * following if hidden else 2 * following + 1
        return position

    def _skew_refuted(self, lo: int, hi: int, response: ResponseMessage) -> bool | None:
        """Whether the visible requests in the range, all begun after the response did
        (within the skew), are answered by the next response instead: it began after them
        and has no later request to answer (None: not known yet)."""
        span = self._span(lo, hi)
        if self._requests[span[0] - self._base].first_ts <= response.first_byte_ns:
            return False
        if len(self._waiting) < 2:
            return False if self._server_ended else None
        following = self._waiting[1].response
        last = span[-1]
        if (
            self._waiting[1].loss_before is not Loss.NONE
            or following.first_byte_ns < self._requests[last - self._base].first_ts
        ):
            return False
        later = self._slot(last + 1)
        if later is None:
            return True if self._client_ended or last + 1 < self._next else None
        return later.first_ts > following.first_byte_ns + self._skew

    def _set_range(self, lo: int, hi: int, response: ResponseMessage) -> None:
        self._lo, self._hi = lo, hi
        self._last_response_end = response.last_byte_ns

    def _pair(self, position: int, response: ResponseMessage) -> None:
        index = _index(position)
        self._requests[index - self._base].response = response
        following = self._slot(index + 1)
        if following is not None and following.first_ts < response.last_byte_ns:
            self._mark_pipelined()
        self._set_range(position, position, response)

    def _unpaired(self, lo: int, hi: int, response: ResponseMessage) -> None:
        span = self._span(lo, hi)
        self._unknown.append((span[0], span[-1]))
        hidden = " and requests lost in gaps" if not (_visible(lo) and _visible(hi)) else ""
        self._stats.unpaired_responses += 1
        self._emit_response_alone(
            response,
            Problem(
                ProblemKind.REQUEST_UNKNOWN,
                f"after lost messages this answers one of {len(span)} requests{hidden}",
            ),
        )
        self._set_range(lo, hi, response)

    def _orphan(self, response: ResponseMessage, reason: str) -> None:
        self._stats.orphan_responses += 1
        first = self._first_request_ts
        if self._client_midstream and (first is None or response.first_byte_ns < first):
            problem = Problem(ProblemKind.MIDSTREAM, "the capture began after this request")
        else:
            problem = Problem(ProblemKind.NO_REQUEST, reason)
        self._emit_response_alone(response, problem)

    def _emit_response_alone(self, response: ResponseMessage, problem: Problem) -> None:
        self._stats.exchanges += 1
        record_id = self._sink(Exchange(self.flow, None, response, (problem,))) or ""
        self._written[SERVER_TO_CLIENT].append((*response.stream_span, record_id))

    def _flush(self) -> None:
        """Emit requests in order while each is whole and answered or past all answers."""
        while self._first < self._next:
            index = self._first
            slot = self._requests[index - self._base]
            if slot.request is None or (slot.response is None and 2 * index + 1 > self._lo):
                break
            self._first += 1
            self._emit_unanswered(index, None)
        done = self._first - self._base
        if done > 64 and done * 2 > len(self._requests):
            del self._requests[:done]
            del self._starts[:done]
            self._base = self._first
        for index in [i for i in self._client_losses if 2 * i < self._lo]:
            del self._client_losses[index]
            self._client_several.discard(index)

    def _emit_unanswered(self, index: int, ending: str | None) -> None:
        """Emit request `index`, with why it has no response if it has none; `ending`: the
        connection's close reason (None: the connection goes on)."""
        slot = self._requests[index - self._base]
        if slot.response is not None:
            self._emit(slot, ())
            return
        self._stats.unanswered_requests += 1
        unknown = self._unknown
        while unknown and unknown[0][1] < index:
            unknown.popleft()
        if unknown and unknown[0][0] <= index:
            problem = Problem(
                ProblemKind.RESPONSE_UNKNOWN,
                "its response is one of those that could not be paired after lost messages",
            )
        elif self._server_lost:
            problem = Problem(ProblemKind.RESPONSE_LOST, "the response was lost in a gap")
        elif ending is None:
            problem = Problem(
                ProblemKind.NO_RESPONSE, "the responses that followed answer later requests"
            )
        else:
            problem = Problem(
                ProblemKind.NO_RESPONSE, f"no response before the connection ended ({ending})"
            )
        self._emit(slot, (problem,))

    def _emit(self, slot: _Slot, problems: tuple[Problem, ...]) -> None:
        record_id: str | None = _NOT_RECORDED
        if not slot.keep:
            self._stats.not_recorded += 1
        else:
            self._stats.exchanges += 1
            record_id = self._sink(Exchange(self.flow, slot.request, slot.response, problems))
            record_id = record_id or ""
        for direction, message in (
            (CLIENT_TO_SERVER, slot.request),
            (SERVER_TO_CLIENT, slot.response),
        ):
            if message is not None:
                self._written[direction].append((*message.stream_span, record_id))

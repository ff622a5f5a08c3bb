"""TCP stream reassembly for a passive observer, sans-IO.

Segments go in (`Reassembler.receive`), ordered byte streams come out through a
`StreamHandler` per flow: `on_start`, `on_data`, `on_gap`, `on_ambiguous`,
`on_end`, `on_close`. The reassembler never sees a socket; time is the capture
time of the segments.

The prover controls every byte the tap sees, so every policy below answers one
question: which bytes did the client's TCP stack accept? (Ptacek & Newsham's
insertion and evasion attacks; the choices follow Linux, the usual client, and
the stream engines of Suricata and Zeek.) What the decoder already refused
(bad checksums, IP lengths past the frame: `collector.capture.decode`) never
gets here.

- **Sequence space.** Each direction's stream position is a 64-bit offset from
  its first byte; 32-bit sequence numbers are unwrapped against the next
  expected position, so streams longer than 4 GiB and ISNs near 2**32 work.
- **TTL / hop limit.** A direction's value is established by its first
  segment (its SYN when seen). A later segment of that direction carrying
  another value is counted (`ttl_departures`) and ignored whole, payload,
  flags and all: a copy that expires before the client, or that came from
  elsewhere, never decides a stream's bytes. (A route change in the middle of
  a connection therefore ends in gaps: loss is visible, a wrong `complete` is not.)
- **Conflicting overlaps are ambiguous.** A copy of bytes the stream already
  holds is compared with it: with the recently delivered tail
  (`overlap_check_bytes`, kept per direction in at most 1.25 times that and
  not counted in `max_buffered_bytes`: `max_flows` bounds it; older bytes are
  past any client's retransmission window) and with buffered out-of-order
  copies. The copy that reaches the
  stream's next position first is delivered (for the same start, the one
  captured first); every buffered copy it overlaps is compared *before* the
  bytes are delivered, so the handler hears `on_ambiguous` ahead of the
  `on_data` that carries them, and a later retransmission that differs from
  delivered bytes is reported as soon as it arrives. Either way the handler
  gets a `StreamAmbiguity` with the SHA-256 of both versions (the delivered
  one first) and `overlap_conflicts` counts it. Identical copies are only
  counted (`retransmitted_bytes`); an exact duplicate of a buffered segment
  is not buffered twice.
- **Holes become explicit gaps.** Out-of-order data is buffered in a heap
  (O(log n) per segment). A hole that does not fill is declared lost when the
  direction buffers more than `window_bytes` beyond it, when it is older than
  `gap_timeout_ns` of capture time (60 s by default: longer than TCP's
  retransmission backoff, so a segment that arrives seconds late is not a
  gap), when all buffers together exceed `max_buffered_bytes` (the direction
  buffering most is flushed until the total is back under 7/8 of the cap;
  `memory_cap_hits` counts it), or when the flow ends. Buffered bytes are
  counted with `SEGMENT_OVERHEAD` per segment, what a segment costs in Python
  beyond its payload. The handler then gets `on_gap(length)` and the stream
  goes on after it. The timeout runs from the later of the first buffered
  segment's arrival and the stream's last move, so a segment planted far
  ahead cannot time out a stream that still flows. Payload that starts more
  than `window_bytes` past the next expected byte is outside any receive
  window: counted (`out_of_window_segments`) and ignored, unless the stream
  has not moved for `gap_timeout_ns` (the tap lost more than a window: the
  far bytes are buffered, and the hole before them times out in turn).
- **Midstream pickup.** A direction whose SYN was not seen starts at the first
  byte seen (its handshake peer's ACK is used when available); `on_start`
  tells the handler whether the stream start is known.
- **RST** (RFC 5961 §3, as Linux applies it) ends the flow only when its
  sequence number is exactly where the sender's stream stands: the next
  expected byte, the highest byte seen, or just past its FIN; a
  RST from a side that has sent nothing must acknowledge what its peer sent
  (the answer to a SYN). Any other RST is counted (`ignored_resets`) and
  ignored: Linux answers it with a challenge ACK and keeps the connection.
  The tap checks exact positions, not a window: it may have missed bytes,
  but a RST it cannot place is one it cannot trust.
- **FIN** ends a direction once every byte before it was delivered or
  declared lost *and the peer acknowledged it* (an ACK at or past the FIN):
  a forged FIN the client never received must not complete a close-delimited
  answer. A FIN before the next expected byte (inside bytes already
  delivered) or more than `window_bytes` ahead is counted (`ignored_fins`)
  and ignored. Bytes that arrive past a FIN not yet acknowledged make the
  end ambiguous (`on_ambiguous` over those bytes, the stream going on with
  them the first version, the end the second) and the FIN is dropped; so
  does a FIN before bytes already buffered (reported once per direction).
  Bytes past an acknowledged FIN are counted (`data_after_fin`) and ignored,
  as a closed receiver ignores them. The second FIN of a close, when its
  segment acknowledges the first, counts as acknowledged: the last ACK of a
  connection is a pure ACK, which capture filters often drop (appliance/CAPTURE.md),
  and the side that closed first has said all it will. A flow that ends any
  other way (RST, idle timeout,
  eviction, `flush()`) ends its directions with that reason, so a
  close-delimited body whose FIN was never acknowledged is truncated.
- **SYN.** A SYN (or SYN-ACK) with another initial sequence number on an open
  flow is counted (`ignored_syns`) and ignored (RFC 5961 §4), unless the
  sender's direction already ended or the flow was quiet for
  `closed_linger_ns`: then it is a new connection on a reused port.
- **Ends.** RST, idle timeout (`idle_timeout_ns`), eviction (`max_flows`)
  and `flush()` end the flow. Segments of a recently closed flow (other than a
  new SYN) are counted as `late_segments` and ignored for `closed_linger_ns`.

What the tap cannot see: a prover that forges the *client's* packets too
(ACKs, FINs, RSTs toward the server) is indistinguishable from the client;
when copies reach the tap in another order than the client (reordering
between tap and client), the tap keeps the first it saw and reports the
difference as ambiguity; a differing copy that arrives only after the HTTP
layer emitted the record of the message it belongs to is counted
(`overlap_conflicts`, and `late_ambiguities` in the HTTP layer) and can no
longer change that record (nor mark any other): it becomes an amendment record
naming it (see `collector.http.exchange` and `collector.records`).
"""

from __future__ import annotations

import hashlib
import heapq
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from collector.capture.decode import TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN, TcpSegment

CLIENT_TO_SERVER = 0
SERVER_TO_CLIENT = 1
_MASK = 0xFFFFFFFF
_CONTROL = TCP_SYN | TCP_FIN | TCP_RST
_HALF = 0x80000000
#: Python memory of one buffered segment beyond its payload (heap entry tuple, bytes
#: header, ints, heap and index slots): what a 1-byte segment costs.
SEGMENT_OVERHEAD = 176


@dataclass(frozen=True, slots=True)
class FlowInfo:
    """The connection a stream pair belongs to; the client is the side that opened it."""

    ip_version: int
    client_ip: bytes
    client_port: int
    server_ip: bytes
    server_port: int
    vlans: tuple[int, ...]
    first_ts_ns: int


@dataclass(frozen=True, slots=True)
class StreamAmbiguity:
    """Bytes [start, end) of one direction's stream were seen in more than one version.

    Offsets count from the direction's first byte, as the handler counts what
    `on_data` and `on_gap` gave it. `variants` are SHA-256 digests, the
    version the stream delivers (or delivered) first; when a FIN and bytes
    past it contradict each other, the stream goes on with the bytes and the
    empty stream end is the second version.
    """

    direction: int
    start: int
    end: int
    variants: tuple[bytes, ...]


class StreamHandler(Protocol):
    """Receives the reassembled byte streams of one flow."""

    def on_start(self, direction: int, midstream: bool, ts_ns: int) -> None: ...

    def on_data(self, direction: int, data: bytes, ts_ns: int) -> None: ...

    def on_gap(self, direction: int, length: int, ts_ns: int) -> None: ...

    def on_ambiguous(self, ambiguity: StreamAmbiguity, ts_ns: int) -> None: ...

    def on_end(self, direction: int, reason: str, ts_ns: int) -> None: ...

    def on_close(self, reason: str, ts_ns: int) -> None: ...


HandlerFactory = Callable[[FlowInfo], StreamHandler]


@dataclass(frozen=True, slots=True)
class ReassemblyLimits:
    """Windows, timeouts and memory caps (times in capture-clock nanoseconds)."""

    gap_timeout_ns: int = 60_000_000_000
    window_bytes: int = 8 * 1024 * 1024
    max_buffered_bytes: int = 512 * 1024 * 1024
    idle_timeout_ns: int = 300_000_000_000
    max_flows: int = 100_000
    closed_linger_ns: int = 30_000_000_000
    overlap_check_bytes: int = 65_536
    server_ports: frozenset[int] = frozenset({8000})


@dataclass(slots=True)
class ReassemblyStats:
    """Counters of everything the reassembler decided."""

    segments: int = 0
    flows_opened: int = 0
    flows_closed: int = 0
    midstream_directions: int = 0
    ignored_segments: int = 0
    late_segments: int = 0
    out_of_order_segments: int = 0
    out_of_window_segments: int = 0
    retransmitted_bytes: int = 0
    overlap_conflicts: int = 0
    ambiguous_bytes: int = 0
    ttl_departures: int = 0
    ignored_resets: int = 0
    ignored_fins: int = 0
    ignored_syns: int = 0
    data_after_fin: int = 0
    gaps: int = 0
    gap_bytes: int = 0
    window_gaps: int = 0
    timeout_gaps: int = 0
    memory_cap_hits: int = 0
    flows_evicted: int = 0
    idle_closed: int = 0
    resets: int = 0
    #: Buffered out-of-order bytes of all flows, `SEGMENT_OVERHEAD` per segment included.
    buffered_bytes: int = 0
    close_reasons: dict[str, int] = field(default_factory=dict)


# A buffered segment: (stream position, arrival order, payload, capture time).
_Entry = tuple[int, int, bytes, int]


class _Half:
    """One direction of a flow."""

    __slots__ = (
        "advanced_at",
        "base",
        "direction",
        "ended",
        "fin_acked",
        "fin_at",
        "fin_contested",
        "first_at",
        "heap",
        "high",
        "hole_since",
        "midstream",
        "next",
        "pending_bytes",
        "syn",
        "tail",
        "tail_start",
        "ttl",
    )

    def __init__(self, direction: int) -> None:
        self.direction = direction
        self.base: int | None = None
        self.syn = False
        self.midstream = False
        self.ttl: int | None = None
        self.next = 0
        # Capture time the stream position last moved (or its first segment arrived).
        self.advanced_at = 0
        # The highest stream position any segment of this direction reached.
        self.high = 0
        self.heap: list[_Entry] = []
        # The payload first buffered at each start position (exact duplicates stop here).
        self.first_at: dict[int, bytes] = {}
        self.pending_bytes = 0
        self.fin_at: int | None = None
        self.fin_acked = False
        self.fin_contested = False
        self.ended = False
        self.hole_since: int | None = None
        # The last delivered bytes, from stream position `tail_start` up to `next`.
        self.tail = bytearray()
        self.tail_start = 0


FlowKey = tuple[bytes, bytes, int, int, tuple[int, ...]]


class _Flow:
    __slots__ = (
        "client_ip",
        "client_port",
        "established",
        "fin_seen",
        "halves",
        "handler",
        "info",
        "keys",
        "last_ts",
    )

    def __init__(self, info: FlowInfo, handler: StreamHandler, keys: tuple[FlowKey, FlowKey]):
        self.info = info
        self.last_ts = info.first_ts_ns
        # Both directions' first sequence numbers are known (no more learning from ACKs).
        self.established = False
        # A FIN was seen: pure ACKs may acknowledge it, so they leave the fast path.
        self.fin_seen = False
        self.client_ip = info.client_ip
        self.client_port = info.client_port
        self.handler = handler
        self.halves = (_Half(CLIENT_TO_SERVER), _Half(SERVER_TO_CLIENT))
        # (client-to-server key, server-to-client key)
        self.keys = keys


def _digest(data: bytes | bytearray) -> bytes:
    return hashlib.sha256(data).digest()


def _buffered_range(heap: list[_Entry], lo: int, hi: int) -> bytes:
    """The buffered bytes in [lo, hi), the first copy of each, holes left out."""
    out = bytearray()
    cursor = lo
    for start, _, data, _ in sorted(heap):
        stop = min(hi, start + len(data))
        if stop <= cursor:
            continue
        if start >= hi:
            break
        out += data[max(cursor, start) - start : stop - start]
        cursor = stop
    return bytes(out)


def _unwrap(seq: int, base: int, near: int) -> int:
    """The stream position of sequence number `seq`, the one closest to position `near`."""
    rel = (seq - base) & _MASK
    return near + ((rel - (near & _MASK) + _HALF) & _MASK) - _HALF


class Reassembler:
    """All flows of one capture; feed it segments in capture order."""

    def __init__(self, factory: HandlerFactory, limits: ReassemblyLimits | None = None) -> None:
        self._factory = factory
        self.limits = limits or ReassemblyLimits()
        self.stats = ReassemblyStats()
        self._flows: dict[FlowKey, _Flow] = {}
        # Flows by last activity, least recent first.
        self._lru: OrderedDict[FlowKey, _Flow] = OrderedDict()
        self._closed: OrderedDict[FlowKey, int] = OrderedDict()
        self._holes: set[tuple[_Flow, int]] = set()
        self._now = 0
        self._next_sweep = 0
        self._arrivals = 0
        self._sweep_every = max(1, min(self.limits.gap_timeout_ns // 4, 250_000_000))

    @property
    def open_flows(self) -> int:
        return len(self._lru)

    # -- input -------------------------------------------------------------

    def receive(self, seg: TcpSegment) -> None:
        """Take one segment (any order, duplicates welcome)."""
        stats = self.stats
        stats.segments += 1
        # One unpack instead of an attribute load per field (hot path).
        ts, src, dst, sport, dport, seq, ack, flags, payload, vlans, ttl = seg
        if ts > self._now:  # noqa: PLR1730 (hot path: max() costs a call)
            self._now = ts
        key = (src, dst, sport, dport, vlans)
        flow = self._flows.get(key)
        if (
            flow is not None
            and flow.established
            and not payload
            and not flags & _CONTROL
            and not flow.fin_seen
        ):
            # A pure ACK of a flow past its handshake: only the flow's activity changes.
            self._lru.move_to_end(flow.keys[0])
            flow.last_ts = ts
            if ts >= self._next_sweep:
                self.advance(ts)
            return
        if flow is not None and flags & TCP_SYN:
            flow = self._syn_on_open_flow(flow, seg)
            if flow is None and key in self._flows:
                return
        if flow is None:
            if key in self._closed and not (flags & TCP_SYN and not flags & TCP_ACK):
                stats.late_segments += 1
                return
            if not payload and not flags & TCP_SYN:
                stats.ignored_segments += 1
                return
            flow = self._open(seg, key)
        if sport == flow.client_port and src == flow.client_ip:
            direction = CLIENT_TO_SERVER
        else:
            direction = SERVER_TO_CLIENT
        half = flow.halves[direction]
        if half.ttl is None:
            half.ttl = ttl
            half.advanced_at = ts
        elif ttl != half.ttl:
            stats.ttl_departures += 1
            return
        self._lru.move_to_end(flow.keys[0])
        flow.last_ts = ts
        if flags & TCP_RST:
            if self._rst_acceptable(flow, direction, seg):
                stats.resets += 1
                self._close(flow, "rst", ts)
            else:
                stats.ignored_resets += 1
            return
        if flags & TCP_SYN:
            if half.base is None:
                half.base = (seq + 1) & _MASK
                half.syn = True
                flow.handler.on_start(direction, False, ts)
            if flags & TCP_ACK:
                self._learn_peer_base(flow, direction, ack, ts)
            seq = (seq + 1) & _MASK
        elif half.base is None:
            half.base = seq
            half.midstream = True
            stats.midstream_directions += 1
            flow.handler.on_start(direction, True, ts)
        elif flags & TCP_ACK and half.syn and half.next == 0:
            self._learn_peer_base(flow, direction, ack, ts)
        if not flow.established and flow.halves[1 - direction].base is not None:
            flow.established = True
        next_pos = half.next
        # _unwrap, inlined (hot path).
        pos = next_pos + (((seq - half.base) - next_pos + _HALF) & _MASK) - _HALF
        if payload:
            if pos == next_pos and not half.heap and half.fin_at is None and not half.ended:
                # In order, nothing buffered, no FIN: the common case, delivered at once.
                end = pos + len(payload)
                if end > half.high:  # noqa: PLR1730 (hot path: max() costs a call)
                    half.high = end
                self._deliver(flow, half, payload, ts)
                half.advanced_at = ts
                if half.hole_since is not None:
                    self._settle(flow, half, ts)
            else:
                self._payload(flow, half, pos, payload, ts)
        if flags & TCP_ACK and flow.fin_seen:
            self._ack(flow, direction, ack, ts)
        if flags & TCP_FIN:
            self._fin(flow, half, pos + len(payload), ack, ts)
        if ts >= self._next_sweep:
            self.advance(ts)

    def advance(self, now_ns: int) -> None:
        """Apply the time-based rules (gap timeout, idle timeout) up to `now_ns`."""
        self._now = max(self._now, now_ns)
        now = self._now
        if now < self._next_sweep:
            return
        self._next_sweep = now + self._sweep_every
        limits = self.limits
        for flow, direction in list(self._holes):
            half = flow.halves[direction]
            if half.hole_since is not None and now - half.hole_since >= limits.gap_timeout_ns:
                self.stats.timeout_gaps += 1
                self._declare_gap(flow, half, now)
        idle_before = now - limits.idle_timeout_ns
        while self._lru:
            flow = next(iter(self._lru.values()))
            if flow.last_ts > idle_before:
                break
            self.stats.idle_closed += 1
            self._close(flow, "idle", now)
        linger_before = now - limits.closed_linger_ns
        while self._closed:
            key, closed_at = next(iter(self._closed.items()))
            if closed_at > linger_before:
                break
            del self._closed[key]

    def flush(self, reason: str = "shutdown") -> None:
        """End every flow (end of a capture file, or shutdown)."""
        for flow in list(self._lru.values()):
            self._close(flow, reason, self._now)

    # -- internals: flows ----------------------------------------------------

    def _open(self, seg: TcpSegment, key: FlowKey) -> _Flow:
        stats = self.stats
        if len(self._lru) >= self.limits.max_flows:
            stats.flows_evicted += 1
            self._close(next(iter(self._lru.values())), "evicted", seg.ts_ns)
        flags = seg.flags
        ports = self.limits.server_ports
        if flags & TCP_SYN:
            sender_is_client = not flags & TCP_ACK
        elif seg.dport in ports or seg.sport in ports:
            sender_is_client = seg.dport in ports
        else:
            sender_is_client = seg.dport < seg.sport
        version = 4 if len(seg.src) == 4 else 6
        if sender_is_client:
            info = FlowInfo(version, seg.src, seg.sport, seg.dst, seg.dport, seg.vlans, seg.ts_ns)
        else:
            info = FlowInfo(version, seg.dst, seg.dport, seg.src, seg.sport, seg.vlans, seg.ts_ns)
        reverse: FlowKey = (seg.dst, seg.src, seg.dport, seg.sport, seg.vlans)
        client_key = key if sender_is_client else reverse
        flow = _Flow(info, self._factory(info), (client_key, reverse if sender_is_client else key))
        self._flows[key] = flow
        self._flows[reverse] = flow
        self._lru[client_key] = flow
        self._closed.pop(key, None)
        self._closed.pop(reverse, None)
        stats.flows_opened += 1
        return flow

    def _syn_on_open_flow(self, flow: _Flow, seg: TcpSegment) -> _Flow | None:
        """A SYN on a known 4-tuple: this flow, a new connection (None, the flow closed),
        or a SYN to ignore (None, the flow still open)."""
        is_client = seg.sport == flow.client_port and seg.src == flow.client_ip
        half = flow.halves[0 if is_client else 1]
        if half.base is None or (seg.seq + 1) & _MASK == half.base:
            return flow
        quiet = seg.ts_ns - flow.last_ts >= self.limits.closed_linger_ns
        if not seg.flags & TCP_ACK and (half.ended or quiet):
            self._close(flow, "reused", seg.ts_ns)
            return None
        self.stats.ignored_syns += 1
        return None

    def _learn_peer_base(self, flow: _Flow, direction: int, ack: int, ts: int) -> None:
        peer = flow.halves[1 - direction]
        if peer.base is None:
            peer.base = ack
            peer.syn = True
            flow.handler.on_start(1 - direction, False, ts)

    def _rst_acceptable(self, flow: _Flow, direction: int, seg: TcpSegment) -> bool:
        half = flow.halves[direction]
        peer = flow.halves[1 - direction]
        if half.base is None:
            # Nothing sent yet (a refused SYN): the RST must acknowledge what the peer sent.
            if not seg.flags & TCP_ACK or peer.base is None:
                return False
            sent = peer.next + (1 if peer.fin_at is not None else 0)
            return _unwrap(seg.ack, peer.base, peer.next) in (peer.next, sent, peer.high)
        pos = _unwrap(seg.seq, half.base, half.next)
        if pos in {half.next, half.high}:
            return True
        return half.fin_at is not None and pos == half.fin_at + 1

    # -- internals: bytes --------------------------------------------------

    def _payload(self, flow: _Flow, half: _Half, pos: int, payload: bytes, ts: int) -> None:
        stats = self.stats
        end = pos + len(payload)
        if half.ended:
            stats.data_after_fin += max(0, end - half.next)
            return
        fin_at = half.fin_at
        if fin_at is not None and end > fin_at:
            beyond = payload[max(0, fin_at - pos) :]
            if half.fin_acked:
                stats.data_after_fin += len(beyond)
                payload = payload[: len(payload) - len(beyond)]
                end = fin_at
                if not payload:
                    return
            else:
                # Bytes past a FIN nobody acknowledged: the client may have seen either end.
                start = max(fin_at, pos)
                self._ambiguous(
                    flow,
                    StreamAmbiguity(half.direction, start, end, (_digest(beyond), _digest(b""))),
                    ts,
                )
                half.fin_at = None
        half.high = max(half.high, end)
        next_pos = half.next
        if end <= next_pos:
            stats.retransmitted_bytes += len(payload)
            self._check_delivered(flow, half, pos, payload, ts)
        elif pos <= next_pos:
            if pos < next_pos:
                stats.retransmitted_bytes += next_pos - pos
                self._check_delivered(flow, half, pos, payload[: next_pos - pos], ts)
                payload = payload[next_pos - pos :]
            self._run(flow, half, payload, ts)
            half.advanced_at = ts
            self._settle(flow, half, ts)
        elif (
            pos - next_pos > self.limits.window_bytes
            and ts - half.advanced_at < self.limits.gap_timeout_ns
        ):
            stats.out_of_window_segments += 1
        else:
            stats.out_of_order_segments += 1
            self._buffer(flow, half, pos, payload, ts)

    def _run(self, flow: _Flow, half: _Half, data: bytes, ts: int) -> None:
        """Deliver `data` (it starts at `half.next`), then every buffered run that follows.

        Buffered copies that overlap a run are compared with it before it is
        delivered; their bytes past the run are put back to be the next run.
        """
        heap = half.heap
        stats = self.stats
        while True:
            start = half.next
            end = start + len(data)
            while heap and heap[0][0] < end:
                other_start, order, other, other_ts = self._pop(half)
                stop = min(end, other_start + len(other))
                if other_start < stop:
                    mine = data[other_start - start : stop - start]
                    theirs = other[: stop - other_start]
                    stats.retransmitted_bytes += stop - other_start
                    if mine != theirs:
                        variants = (_digest(mine), _digest(theirs))
                        self._ambiguous(
                            flow, StreamAmbiguity(half.direction, other_start, stop, variants), ts
                        )
                if other_start + len(other) > end:
                    self._push(half, (end, order, other[end - other_start :], other_ts))
            self._deliver(flow, half, data, ts)
            if not heap or heap[0][0] != half.next:
                return
            _, _, data, ts = self._pop(half)

    def _deliver(self, flow: _Flow, half: _Half, data: bytes, ts: int) -> None:
        half.next += len(data)
        limit = self.limits.overlap_check_bytes
        if limit:
            tail = half.tail
            tail += data
            excess = len(tail) - limit
            # Trimmed in steps of a quarter: at most 1.25 x the limit per direction.
            if excess > limit >> 2:
                del tail[:excess]
                half.tail_start += excess
        else:
            half.tail_start = half.next
        flow.handler.on_data(half.direction, data, ts)

    def _check_delivered(self, flow: _Flow, half: _Half, pos: int, data: bytes, ts: int) -> None:
        """Compare a copy of delivered bytes with the delivered tail (older bytes: unchecked)."""
        lo = max(pos, half.tail_start)
        hi = pos + len(data)
        if lo >= hi:
            return
        kept = half.tail[lo - half.tail_start : hi - half.tail_start]
        other = data[lo - pos :]
        if kept != other:
            variants = (_digest(kept), _digest(other))
            self._ambiguous(flow, StreamAmbiguity(half.direction, lo, hi, variants), ts)

    def _ambiguous(self, flow: _Flow, ambiguity: StreamAmbiguity, ts: int) -> None:
        self.stats.overlap_conflicts += 1
        self.stats.ambiguous_bytes += ambiguity.end - ambiguity.start
        flow.handler.on_ambiguous(ambiguity, ts)

    def _buffer(self, flow: _Flow, half: _Half, pos: int, data: bytes, ts: int) -> None:
        first = half.first_at.get(pos)
        if first is not None and len(first) >= len(data) and first.startswith(data):
            self.stats.retransmitted_bytes += len(data)
            return
        self._arrivals += 1
        self._push(half, (pos, self._arrivals, data, ts))
        if first is None:
            half.first_at[pos] = data
        if half.hole_since is None:
            half.hole_since = ts
            self._holes.add((flow, half.direction))
        limits = self.limits
        while half.pending_bytes > limits.window_bytes and half.heap:
            self.stats.window_gaps += 1
            self._declare_gap(flow, half, ts)
        if self.stats.buffered_bytes > limits.max_buffered_bytes:
            self._relieve_memory(ts)

    def _push(self, half: _Half, entry: _Entry) -> None:
        heapq.heappush(half.heap, entry)
        cost = len(entry[2]) + SEGMENT_OVERHEAD
        half.pending_bytes += cost
        self.stats.buffered_bytes += cost

    def _pop(self, half: _Half) -> _Entry:
        entry = heapq.heappop(half.heap)
        cost = len(entry[2]) + SEGMENT_OVERHEAD
        half.pending_bytes -= cost
        self.stats.buffered_bytes -= cost
        if half.first_at.get(entry[0]) is entry[2]:
            del half.first_at[entry[0]]
        return entry

    def _settle(self, flow: _Flow, half: _Half, ts: int) -> None:
        """After the stream moved: restart the hole clock, or end the direction at its FIN."""
        if half.heap:
            # The hole's clock runs from the later of its first buffered segment and the
            # stream's last move: a segment far ahead cannot time out a stream that flows.
            half.hole_since = max(half.heap[0][3], half.advanced_at)
            self._holes.add((flow, half.direction))
        elif half.fin_at is not None and half.next < half.fin_at:
            if half.hole_since is None:
                half.hole_since = ts
            self._holes.add((flow, half.direction))
        else:
            half.hole_since = None
            self._holes.discard((flow, half.direction))
        if half.fin_acked and half.fin_at is not None and half.next >= half.fin_at:
            self._end_half(flow, half, "fin", ts)

    def _declare_gap(self, flow: _Flow, half: _Half, ts: int) -> None:
        if half.heap:
            target = half.heap[0][0]
        elif half.fin_at is not None and half.fin_at > half.next:
            target = half.fin_at
        else:
            half.hole_since = None
            self._holes.discard((flow, half.direction))
            return
        length = target - half.next
        self.stats.gaps += 1
        self.stats.gap_bytes += length
        half.next = target
        half.advanced_at = ts
        half.tail.clear()
        half.tail_start = target
        flow.handler.on_gap(half.direction, length, ts)
        if half.heap and half.heap[0][0] == half.next:
            _, _, data, data_ts = self._pop(half)
            self._run(flow, half, data, data_ts)
        self._settle(flow, half, ts)

    def _relieve_memory(self, ts: int) -> None:
        stats = self.stats
        target = self.limits.max_buffered_bytes * 7 // 8
        while stats.buffered_bytes > target and self._holes:
            flow, direction = max(self._holes, key=lambda h: h[0].halves[h[1]].pending_bytes)
            half = flow.halves[direction]
            if not half.heap:
                break
            stats.memory_cap_hits += 1
            self._declare_gap(flow, half, ts)

    # -- internals: ends ---------------------------------------------------

    def _fin(self, flow: _Flow, half: _Half, fin_pos: int, ack: int, ts: int) -> None:
        if half.ended or half.fin_at == fin_pos:
            return
        if (
            half.fin_at is not None
            or fin_pos < half.next
            or fin_pos - half.next > self.limits.window_bytes
        ):
            self.stats.ignored_fins += 1
            return
        if fin_pos < half.high:
            # Bytes past this FIN are buffered already: the client may have stopped here.
            self.stats.ignored_fins += 1
            if not half.fin_contested:
                half.fin_contested = True
                beyond = _buffered_range(half.heap, fin_pos, half.high)
                variants = (_digest(beyond), _digest(b""))
                self._ambiguous(
                    flow, StreamAmbiguity(half.direction, fin_pos, half.high, variants), ts
                )
            return
        half.fin_at = fin_pos
        flow.fin_seen = True
        peer = flow.halves[1 - half.direction]
        if peer.ended and peer.fin_acked and peer.fin_at is not None and peer.base is not None:
            # The second FIN of a close, acknowledging the first: the last ACK is often
            # kept out of the capture (a BPF filter without pure ACKs), so this closes.
            half.fin_acked = _unwrap(ack, peer.base, peer.fin_at) > peer.fin_at
        self._settle(flow, half, ts)

    def _ack(self, flow: _Flow, direction: int, ack: int, ts: int) -> None:
        """An acknowledgement from `direction`: it may confirm its peer's FIN."""
        peer = flow.halves[1 - direction]
        if peer.fin_at is None or peer.fin_acked or peer.ended or peer.base is None:
            return
        if _unwrap(ack, peer.base, peer.fin_at) > peer.fin_at:
            peer.fin_acked = True
            self._settle(flow, peer, ts)

    def _end_half(self, flow: _Flow, half: _Half, reason: str, ts: int) -> None:
        if half.ended:
            return
        half.ended = True
        self._holes.discard((flow, half.direction))
        flow.handler.on_end(half.direction, reason, ts)
        other = flow.halves[1 - half.direction]
        if other.ended:
            self._close(flow, reason, ts)

    def _close(self, flow: _Flow, reason: str, ts: int) -> None:
        client_key = flow.keys[0]
        if self._lru.pop(client_key, None) is None:
            return
        for key in flow.keys:
            self._flows.pop(key, None)
            self._closed[key] = ts
        for direction in (CLIENT_TO_SERVER, SERVER_TO_CLIENT):
            half = flow.halves[direction]
            while not half.ended and (
                half.heap
                or (half.fin_acked and half.fin_at is not None and half.fin_at > half.next)
            ):
                self._declare_gap(flow, half, ts)
            self._holes.discard((flow, direction))
        for direction in (CLIENT_TO_SERVER, SERVER_TO_CLIENT):
            half = flow.halves[direction]
            if not half.ended:
                half.ended = True
                flow.handler.on_end(direction, reason, ts)
        stats = self.stats
        stats.flows_closed += 1
        stats.close_reasons[reason] = stats.close_reasons.get(reason, 0) + 1
        flow.handler.on_close(reason, ts)


def reassemble(segments: Iterable[TcpSegment], factory: HandlerFactory) -> Reassembler:
    """Run `segments` through a fresh reassembler and flush it (tests, small files)."""
    reassembler = Reassembler(factory)
    for seg in segments:
        reassembler.receive(seg)
    reassembler.flush()
    return reassembler

"""TCP stream reassembly for a passive observer, sans-IO.

Segments go in (`Reassembler.receive`), ordered byte streams come out through a
`StreamHandler` per flow: `on_start`, `on_data`, `on_gap`, `on_end`, `on_close`.
The reassembler never sees a socket; time is the capture time of the segments.

Policies (a tap cannot ask for a retransmission, so it must decide):

- **Sequence space.** Each direction's stream position is a 64-bit offset from
  its first byte; 32-bit sequence numbers are unwrapped against the next
  expected position, so streams longer than 4 GiB and ISNs near 2**32 work.
- **Overlaps: first copy wins.** Bytes already delivered or already buffered
  are never replaced. Retransmitted bytes are compared with the recently
  delivered tail (`overlap_check_bytes`) and with buffered copies; a mismatch
  increments `ReassemblyStats.overlap_conflicts`.
- **Holes become explicit gaps.** Out-of-order data is buffered. A hole that
  does not fill is declared lost when the direction buffers more than
  `window_bytes` beyond it, when it is older than `gap_timeout_ns` of capture
  time, when all buffers together exceed `max_buffered_bytes` (the direction
  buffering most is flushed; `memory_cap_hits` counts it), or when the flow
  ends. The handler then gets `on_gap(length)` and the stream goes on after it.
- **Midstream pickup.** A direction whose SYN was not seen starts at the first
  byte seen (its handshake peer's ACK is used when available); `on_start`
  tells the handler whether the stream start is known.
- **Checksums are not validated** (offload leaves them unfilled on egress copies).
- **Ends.** FIN ends a direction once every byte before it was delivered or
  declared lost; RST, idle timeout (`idle_timeout_ns`), eviction (`max_flows`)
  and `flush()` end the flow. Segments of a recently closed flow (other than a
  new SYN) are counted as `late_segments` and ignored for `closed_linger_ns`.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from collector.capture.decode import TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN, TcpSegment

CLIENT_TO_SERVER = 0
SERVER_TO_CLIENT = 1
_MASK = 0xFFFFFFFF
_CONTROL = TCP_SYN | TCP_FIN | TCP_RST
_HALF = 0x80000000


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


class StreamHandler(Protocol):
    """Receives the reassembled byte streams of one flow."""

    def on_start(self, direction: int, midstream: bool, ts_ns: int) -> None: ...

    def on_data(self, direction: int, data: bytes, ts_ns: int) -> None: ...

    def on_gap(self, direction: int, length: int, ts_ns: int) -> None: ...

    def on_end(self, direction: int, reason: str, ts_ns: int) -> None: ...

    def on_close(self, reason: str, ts_ns: int) -> None: ...


HandlerFactory = Callable[[FlowInfo], StreamHandler]


@dataclass(frozen=True, slots=True)
class ReassemblyLimits:
    """Windows, timeouts and memory caps (times in capture-clock nanoseconds)."""

    gap_timeout_ns: int = 2_000_000_000
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
    retransmitted_bytes: int = 0
    overlap_conflicts: int = 0
    gaps: int = 0
    gap_bytes: int = 0
    window_gaps: int = 0
    timeout_gaps: int = 0
    memory_cap_hits: int = 0
    flows_evicted: int = 0
    idle_closed: int = 0
    resets: int = 0
    buffered_bytes: int = 0
    close_reasons: dict[str, int] = field(default_factory=dict)


class _Half:
    """One direction of a flow."""

    __slots__ = (
        "base",
        "ended",
        "fin_at",
        "hole_since",
        "midstream",
        "next",
        "pending",
        "pending_bytes",
        "recent",
        "recent_bytes",
        "syn",
    )

    def __init__(self) -> None:
        self.base: int | None = None
        self.syn = False
        self.midstream = False
        self.next = 0
        self.pending: dict[int, tuple[bytes, int]] = {}
        self.pending_bytes = 0
        self.fin_at: int | None = None
        self.ended = False
        self.hole_since: int | None = None
        self.recent: deque[tuple[int, bytes]] = deque()
        self.recent_bytes = 0


FlowKey = tuple[bytes, bytes, int, int, tuple[int, ...]]


class _Flow:
    __slots__ = (
        "client_ip",
        "client_port",
        "established",
        "halves",
        "handler",
        "info",
        "keys",
        "last_ts",
        "starts",
    )

    def __init__(self, info: FlowInfo, handler: StreamHandler, keys: tuple[FlowKey, FlowKey]):
        self.info = info
        self.last_ts = info.first_ts_ns
        # Both directions' first sequence numbers are known (no more learning from ACKs).
        self.established = False
        self.client_ip = info.client_ip
        self.client_port = info.client_port
        self.handler = handler
        self.halves = (_Half(), _Half())
        # Sorted start positions of each half's buffered segments.
        self.starts: tuple[list[int], list[int]] = ([], [])
        # (client-to-server key, server-to-client key)
        self.keys = keys


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
        self._sweep_every = max(1, min(self.limits.gap_timeout_ns // 4, 250_000_000))

    @property
    def open_flows(self) -> int:
        return len(self._lru)

    # -- input -------------------------------------------------------------

    def receive(self, seg: TcpSegment) -> None:
        """Take one segment (any order, duplicates welcome)."""
        stats = self.stats
        stats.segments += 1
        ts = seg.ts_ns
        if ts > self._now:  # noqa: PLR1730 (hot path: max() costs a call)
            self._now = ts
        key = (seg.src, seg.dst, seg.sport, seg.dport, seg.vlans)
        flow = self._flows.get(key)
        flags = seg.flags
        if flow is not None and flow.established and not seg.payload and not flags & _CONTROL:
            # A pure ACK of a flow past its handshake: only the flow's activity changes.
            self._lru.move_to_end(flow.keys[0])
            flow.last_ts = ts
            if ts >= self._next_sweep:
                self.advance(ts)
            return
        if flow is not None and flags & TCP_SYN and not flags & TCP_ACK:
            flow = self._maybe_reused(flow, seg)
        if flow is None:
            if key in self._closed and not (flags & TCP_SYN and not flags & TCP_ACK):
                stats.late_segments += 1
                return
            if not seg.payload and not flags & TCP_SYN:
                stats.ignored_segments += 1
                return
            flow = self._open(seg, key)
        else:
            self._lru.move_to_end(flow.keys[0])
        flow.last_ts = ts
        if seg.sport == flow.client_port and seg.src == flow.client_ip:
            direction = CLIENT_TO_SERVER
        else:
            direction = SERVER_TO_CLIENT
        if flags & TCP_RST:
            stats.resets += 1
            self._close(flow, "rst", ts)
            return
        half = flow.halves[direction]
        seq = seg.seq
        if flags & TCP_SYN:
            if half.base is None:
                half.base = (seq + 1) & _MASK
                half.syn = True
                flow.handler.on_start(direction, False, ts)
            if flags & TCP_ACK:
                self._learn_peer_base(flow, direction, seg.ack, ts)
            seq = (seq + 1) & _MASK
        elif half.base is None:
            half.base = seq
            half.midstream = True
            stats.midstream_directions += 1
            flow.handler.on_start(direction, True, ts)
        elif flags & TCP_ACK and half.syn and half.next == 0:
            self._learn_peer_base(flow, direction, seg.ack, ts)
        next_pos = half.next
        rel = (seq - half.base) & _MASK
        pos = next_pos + ((rel - (next_pos & _MASK) + _HALF) & _MASK) - _HALF
        payload = seg.payload
        if payload:
            end = pos + len(payload)
            if end <= next_pos:
                stats.retransmitted_bytes += len(payload)
                self._check_delivered(half, pos, payload)
            elif pos <= next_pos:
                if pos < next_pos:
                    stats.retransmitted_bytes += next_pos - pos
                    self._check_delivered(half, pos, payload[: next_pos - pos])
                    payload = payload[next_pos - pos :]
                self._deliver(flow, direction, half, payload, ts)
                if flow.starts[direction]:
                    self._drain(flow, direction, half)
            else:
                stats.out_of_order_segments += 1
                self._buffer(flow, direction, pos, payload, ts)
        if not flow.established and flow.halves[1 - direction].base is not None:
            flow.established = True
        if flags & TCP_FIN and half.fin_at is None:
            half.fin_at = pos + len(seg.payload)
        if half.fin_at is not None:
            if half.next >= half.fin_at:
                self._end_half(flow, direction, half, "fin", ts)
            elif half.hole_since is None:
                half.hole_since = ts
                self._holes.add((flow, direction))
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
                self._declare_gap(flow, direction, half, now)
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

    # -- internals ---------------------------------------------------------

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
        if sender_is_client:
            info = FlowInfo(
                4 if len(seg.src) == 4 else 6,
                seg.src,
                seg.sport,
                seg.dst,
                seg.dport,
                seg.vlans,
                seg.ts_ns,
            )
        else:
            info = FlowInfo(
                4 if len(seg.src) == 4 else 6,
                seg.dst,
                seg.dport,
                seg.src,
                seg.sport,
                seg.vlans,
                seg.ts_ns,
            )
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

    def _maybe_reused(self, flow: _Flow, seg: TcpSegment) -> _Flow | None:
        """A new SYN on a known 4-tuple: the same connection, or a new one (port reuse)."""
        is_client = seg.sport == flow.client_port and seg.src == flow.client_ip
        half = flow.halves[0 if is_client else 1]
        if half.base is None or (half.syn and (seg.seq + 1) & _MASK == half.base):
            return flow
        self._close(flow, "reused", seg.ts_ns)
        return None

    def _learn_peer_base(self, flow: _Flow, direction: int, ack: int, ts: int) -> None:
        peer = flow.halves[1 - direction]
        if peer.base is None:
            peer.base = ack
            peer.syn = True
            flow.handler.on_start(1 - direction, False, ts)

    def _deliver(self, flow: _Flow, direction: int, half: _Half, data: bytes, ts: int) -> None:
        pos = half.next
        half.next = pos + len(data)
        limit = self.limits.overlap_check_bytes
        if limit:
            recent = half.recent
            recent.append((pos, data))
            half.recent_bytes += len(data)
            while half.recent_bytes - len(recent[0][1]) >= limit:
                half.recent_bytes -= len(recent.popleft()[1])
        flow.handler.on_data(direction, data, ts)

    def _check_delivered(self, half: _Half, pos: int, data: bytes) -> None:
        end = pos + len(data)
        for start, chunk in reversed(half.recent):
            stop = start + len(chunk)
            if stop <= pos:
                return
            if start >= end:
                continue
            lo, hi = max(pos, start), min(end, stop)
            if chunk[lo - start : hi - start] != data[lo - pos : hi - pos]:
                self.stats.overlap_conflicts += 1
                return

    def _buffer(self, flow: _Flow, direction: int, pos: int, data: bytes, ts: int) -> None:
        half = flow.halves[direction]
        starts = flow.starts[direction]
        pending = half.pending
        end = pos + len(data)
        pieces: list[tuple[int, bytes]] = []
        cursor = pos
        i = max(0, bisect.bisect_right(starts, pos) - 1)
        while i < len(starts) and starts[i] < end:
            start = starts[i]
            chunk = pending[start][0]
            stop = start + len(chunk)
            i += 1
            if stop <= cursor:
                continue
            if start > cursor:
                pieces.append((cursor, data[cursor - pos : start - pos]))
            lo, hi = max(cursor, start), min(end, stop)
            if chunk[lo - start : hi - start] != data[lo - pos : hi - pos]:
                self.stats.overlap_conflicts += 1
            self.stats.retransmitted_bytes += hi - lo
            cursor = max(cursor, stop)
        if cursor < end:
            pieces.append((cursor, data[cursor - pos :] if cursor > pos else data))
        added = 0
        for start, chunk in pieces:
            bisect.insort(starts, start)
            pending[start] = (chunk, ts)
            added += len(chunk)
        half.pending_bytes += added
        self.stats.buffered_bytes += added
        if half.hole_since is None:
            half.hole_since = ts
            self._holes.add((flow, direction))
        if half.pending_bytes > self.limits.window_bytes:
            self.stats.window_gaps += 1
            self._declare_gap(flow, direction, half, ts)
        if self.stats.buffered_bytes > self.limits.max_buffered_bytes:
            self._relieve_memory(ts)

    def _drain(self, flow: _Flow, direction: int, half: _Half) -> None:
        starts = flow.starts[direction]
        pending = half.pending
        stats = self.stats
        while starts and starts[0] <= half.next:
            start = starts.pop(0)
            chunk, ts = pending.pop(start)
            half.pending_bytes -= len(chunk)
            stats.buffered_bytes -= len(chunk)
            skip = half.next - start
            if skip >= len(chunk):
                continue
            self._deliver(flow, direction, half, chunk[skip:] if skip else chunk, ts)
        if starts:
            half.hole_since = pending[starts[0]][1]
        elif half.fin_at is None or half.next >= half.fin_at:
            half.hole_since = None
            self._holes.discard((flow, direction))

    def _declare_gap(self, flow: _Flow, direction: int, half: _Half, ts: int) -> None:
        starts = flow.starts[direction]
        if starts:
            target = starts[0]
        elif half.fin_at is not None and half.fin_at > half.next:
            target = half.fin_at
        else:
            half.hole_since = None
            self._holes.discard((flow, direction))
            return
        length = target - half.next
        self.stats.gaps += 1
        self.stats.gap_bytes += length
        half.next = target
        half.recent.clear()
        half.recent_bytes = 0
        flow.handler.on_gap(direction, length, ts)
        self._drain(flow, direction, half)
        if half.fin_at is not None and half.next >= half.fin_at:
            self._end_half(flow, direction, half, "fin", ts)

    def _relieve_memory(self, ts: int) -> None:
        stats = self.stats
        while stats.buffered_bytes > self.limits.max_buffered_bytes and self._holes:
            flow, direction = max(self._holes, key=lambda h: h[0].halves[h[1]].pending_bytes)
            half = flow.halves[direction]
            if not half.pending_bytes:
                break
            stats.memory_cap_hits += 1
            self._declare_gap(flow, direction, half, ts)

    def _end_half(self, flow: _Flow, direction: int, half: _Half, reason: str, ts: int) -> None:
        if half.ended:
            return
        half.ended = True
        self._holes.discard((flow, direction))
        flow.handler.on_end(direction, reason, ts)
        other = flow.halves[1 - direction]
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
            while flow.starts[direction] or (
                half.fin_at is not None and half.fin_at > half.next and not half.ended
            ):
                self._declare_gap(flow, direction, half, ts)
                if half.ended:
                    break
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

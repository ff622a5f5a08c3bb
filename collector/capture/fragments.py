"""IPv4 and IPv6 fragment reassembly for a passive observer, with bounded memory and time.

A fragment goes in (`FragmentReassembler.add`) with the key of its datagram;
when the last missing piece arrives the whole datagram's payload comes out.
Time is capture time. The policies follow what the receiving Linux host does,
so the tap keeps what the client keeps:

- **Overlaps drop the datagram.** A fragment that overlaps another one only in
  part, or repeats one with different bytes, or a second last fragment that
  moves the end, drops the whole datagram (`CONFLICT`, counted by the
  decoder): Linux discards IPv4 datagrams with overlapping fragments and
  RFC 5722 makes it the rule for IPv6. A repeat with the same bytes is a
  duplicate and ignored. The tap does not carry ambiguity below TCP: a
  dropped datagram is a hole in the TCP stream, so the record shows a gap
  (never `complete`) unless TCP retransmits the bytes whole.
- **Fragments whose TTL (hop limit) differs from the first one's** are a
  conflict too: a copy that expires before the client must not complete a
  datagram the client never sees.
- **Bounded.** A datagram holds at most `max_fragments` pieces and
  `max_datagram_bytes` bytes (past either: dropped, `OVER_CAP`); all held
  fragments together cost at most `max_bytes`, counted with a fixed overhead
  per fragment (`FRAGMENT_OVERHEAD`): past it the oldest datagrams are evicted.
  A datagram not complete `timeout_ns` after its first fragment (Linux's
  `ipfrag_time`, 30 s) is expired. Work per fragment is bounded by
  `max_fragments`.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass

#: Python memory of one held fragment beyond its payload (tuple, bytes header, list slot).
FRAGMENT_OVERHEAD = 160

FragmentKey = tuple[object, ...]


@dataclass(frozen=True, slots=True)
class FragmentLimits:
    """Caps and timeout of fragment reassembly (times in capture-clock nanoseconds)."""

    timeout_ns: int = 30_000_000_000
    max_bytes: int = 64 * 1024 * 1024
    max_fragments: int = 64
    max_datagram_bytes: int = 65_535


class FragmentOutcome(enum.Enum):
    """What became of one fragment."""

    HELD = "held"  # kept, the datagram is not complete yet
    COMPLETE = "complete"  # it completed its datagram
    DUPLICATE = "duplicate"  # the same bytes at the same place again: ignored
    CONFLICT = "conflict"  # it overlaps differently: the datagram is dropped
    OVER_CAP = "over_cap"  # the datagram grew past its caps: dropped
    MALFORMED = "malformed"  # a non-final fragment whose length is not a multiple of 8


@dataclass(frozen=True, slots=True)
class Fragment:
    """One fragment: `offset` in bytes into its datagram, `more` its more-fragments flag."""

    key: FragmentKey
    ts_ns: int
    offset: int
    more: bool
    ttl: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Datagram:
    """A reassembled datagram's payload (what follows the fragment header or IPv4 header)."""

    payload: bytes
    ttl: int


class _Pending:
    __slots__ = ("cost", "first_ts", "pieces", "received", "total", "ttl")

    def __init__(self, ts: int, ttl: int) -> None:
        self.first_ts = ts
        self.ttl = ttl
        self.pieces: list[tuple[int, bytes]] = []
        self.received = 0
        self.total: int | None = None
        self.cost = 0


class FragmentReassembler:
    """The datagrams in reassembly of one capture; feed fragments in capture order."""

    def __init__(self, limits: FragmentLimits | None = None) -> None:
        self.limits = limits or FragmentLimits()
        # Datagrams by first arrival, oldest first (expiry and eviction take the head).
        self._pending: OrderedDict[FragmentKey, _Pending] = OrderedDict()
        self.held_bytes = 0
        self.expired = 0
        self.evicted = 0

    def add(self, fragment: Fragment) -> tuple[FragmentOutcome, Datagram | None]:
        """Take one fragment; the datagram comes back with `COMPLETE`."""
        self._expire(fragment.ts_ns)
        limits = self.limits
        key, data = fragment.key, fragment.data
        end = fragment.offset + len(data)
        if fragment.more and len(data) % 8:
            return FragmentOutcome.MALFORMED, None
        pending = self._pending.get(key)
        if pending is None:
            pending = self._pending[key] = _Pending(fragment.ts_ns, fragment.ttl)
        outcome = self._place(pending, fragment, end)
        if outcome is FragmentOutcome.HELD and (
            len(pending.pieces) > limits.max_fragments or end > limits.max_datagram_bytes
        ):
            outcome = FragmentOutcome.OVER_CAP
        if outcome in (FragmentOutcome.CONFLICT, FragmentOutcome.OVER_CAP):
            self._drop(key)
            return outcome, None
        if outcome is FragmentOutcome.DUPLICATE:
            return outcome, None
        cost = len(data) + FRAGMENT_OVERHEAD
        pending.cost += cost
        self.held_bytes += cost
        if pending.total is not None and pending.received == pending.total:
            self._drop(key)
            pending.pieces.sort()
            payload = b"".join(piece for _, piece in pending.pieces)
            return FragmentOutcome.COMPLETE, Datagram(payload, pending.ttl)
        while self.held_bytes > limits.max_bytes and self._pending:
            self.evicted += 1
            self._drop(next(iter(self._pending)))
        return FragmentOutcome.HELD, None

    @staticmethod
    def _place(pending: _Pending, fragment: Fragment, end: int) -> FragmentOutcome:
        """Add `fragment` to `pending` unless it repeats or contradicts what is held."""
        offset, data = fragment.offset, fragment.data
        if fragment.ttl != pending.ttl:
            return FragmentOutcome.CONFLICT
        if not fragment.more:
            if pending.total is not None and pending.total != end:
                return FragmentOutcome.CONFLICT
            pending.total = end
        if pending.total is not None and end > pending.total:
            return FragmentOutcome.CONFLICT
        for start, piece in pending.pieces:
            stop = start + len(piece)
            if pending.total is not None and stop > pending.total:
                return FragmentOutcome.CONFLICT
            if start < end and offset < stop:
                if start == offset and stop == end and piece == data:
                    return FragmentOutcome.DUPLICATE
                return FragmentOutcome.CONFLICT
        pending.pieces.append((offset, data))
        pending.received += len(data)
        return FragmentOutcome.HELD

    def _drop(self, key: FragmentKey) -> None:
        pending = self._pending.pop(key)
        self.held_bytes -= pending.cost

    def _expire(self, now: int) -> None:
        before = now - self.limits.timeout_ns
        while self._pending:
            key, pending = next(iter(self._pending.items()))
            if pending.first_ts > before:
                return
            self.expired += 1
            self._drop(key)

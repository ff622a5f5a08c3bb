"""A bounded, thread-safe store of recent readings, per target, searchable by time."""

from __future__ import annotations

import bisect
import threading

from verifierd.meter.readings import Reading


class ReadingRing:
    """The last `capacity` readings of each target, kept in end-time order.

    Readings of one target must arrive in time order and must not overlap (each sampler's readings
    do, by construction); one that ends at or before the previous one is refused. Trimming is
    amortised: a target's list grows to twice `capacity` and is then cut back to `capacity`.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._capacity = capacity
        self._lock = threading.Lock()
        self._ends: dict[str, list[int]] = {}
        self._items: dict[str, list[Reading]] = {}

    def add(self, reading: Reading) -> bool:
        """Keep `reading`; False if it is out of order for its target (it is then dropped)."""
        with self._lock:
            ends = self._ends.setdefault(reading.target, [])
            items = self._items.setdefault(reading.target, [])
            if ends and reading.end_ns <= ends[-1]:
                return False
            ends.append(reading.end_ns)
            items.append(reading)
            if len(items) > 2 * self._capacity:
                cut = len(items) - self._capacity
                del ends[:cut]
                del items[:cut]
            return True

    def window(self, target: str, start_ns: int, end_ns: int) -> list[Reading]:
        """The readings of `target` whose intervals overlap [start_ns, end_ns], in order."""
        with self._lock:
            ends = self._ends.get(target)
            items = self._items.get(target)
            if not ends or not items:
                return []
            out: list[Reading] = []
            for i in range(bisect.bisect_right(ends, start_ns), len(items)):
                if items[i].start_ns >= end_ns:
                    break
                out.append(items[i])
            return out

    def latest_end(self, target: str) -> int | None:
        """End time of the newest reading of `target`, None if it has none."""
        with self._lock:
            ends = self._ends.get(target)
            return ends[-1] if ends else None

    def oldest_start(self, target: str) -> int | None:
        """Start time of the oldest reading still kept for `target`."""
        with self._lock:
            items = self._items.get(target)
            return items[0].start_ns if items else None

    def targets(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(sorted(self._items))

    def __len__(self) -> int:
        with self._lock:
            return sum(len(items) for items in self._items.values())

"""Verdicts per second over a sliding window, fed by the store's verdict listener."""

from __future__ import annotations

import threading
from collections import deque

DEFAULT_WINDOW_NS = 60 * 1_000_000_000


class RateWindow:
    """Counts events in the last ``window_ns``; thread-safe."""

    def __init__(self, window_ns: int = DEFAULT_WINDOW_NS) -> None:
        if window_ns <= 0:
            raise ValueError("window_ns must be positive")
        self._window_ns = window_ns
        self._events: deque[tuple[int, int]] = deque()
        self._total = 0
        self._lock = threading.Lock()

    def add(self, count: int, now_ns: int) -> None:
        with self._lock:
            self._events.append((now_ns, count))
            self._total += count
            self._expire(now_ns)

    def per_second(self, now_ns: int) -> float:
        with self._lock:
            self._expire(now_ns)
            return self._total / (self._window_ns / 1e9)

    def _expire(self, now_ns: int) -> None:
        while self._events and self._events[0][0] <= now_ns - self._window_ns:
            _, count = self._events.popleft()
            self._total -= count

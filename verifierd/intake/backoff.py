"""Exponential backoff with full jitter for reconnecting to a collector.

Pure arithmetic: the caller sleeps. `next_delay()` grows the ceiling by `factor` from
`initial_s` up to `maximum_s` and draws uniformly below it ("full jitter", so many
verifiers restarted together do not reconnect in lockstep); `reset()` after a stream
that made progress.
"""

from __future__ import annotations

import random


class Backoff:
    def __init__(
        self,
        *,
        initial_s: float = 0.05,
        maximum_s: float = 5.0,
        factor: float = 2.0,
        rng: random.Random | None = None,
    ) -> None:
        if not 0 < initial_s <= maximum_s or factor < 1:
            raise ValueError("need 0 < initial_s <= maximum_s and factor >= 1")
        self._initial = initial_s
        self._maximum = maximum_s
        self._factor = factor
        self._rng = rng or random.Random()
        self._ceiling = initial_s
        self.attempts = 0

    def next_delay(self) -> float:
        """Seconds to wait before the next attempt; in [initial_s / 2, current ceiling]."""
        ceiling = self._ceiling
        self._ceiling = min(self._maximum, ceiling * self._factor)
        self.attempts += 1
        return self._rng.uniform(min(self._initial / 2, ceiling), ceiling)

    def reset(self) -> None:
        self._ceiling = self._initial
        self.attempts = 0

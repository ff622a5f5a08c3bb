"""Sliding windows as buckets: which bucket a verdict falls in, which buckets a window holds.

A window of W seconds is kept in :data:`BUCKETS` buckets of W / BUCKETS each. At time t it
covers the bucket t falls in and the BUCKETS - 1 before it: between W (1 - 1/BUCKETS) and W
seconds of verdicts. Buckets older than that are dropped as verdicts arrive.
"""

from __future__ import annotations

from dataclasses import dataclass

BUCKETS = 60


@dataclass(frozen=True)
class Window:
    seconds: int

    @property
    def bucket_ns(self) -> int:
        return self.seconds * 1_000_000_000 // BUCKETS

    def bucket(self, at_ns: int) -> int:
        """The index of the bucket ``at_ns`` falls in."""
        return at_ns // self.bucket_ns

    def oldest(self, now_ns: int) -> int:
        """The index of the oldest bucket the window still covers at ``now_ns``."""
        return max(0, self.bucket(now_ns) - BUCKETS + 1)

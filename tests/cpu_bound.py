"""A CPU-time bound around one call, so a parser that hangs or goes super-linear fails a test.

`ITIMER_PROF` counts this process's CPU time (user and system), so a busy shared
machine does not trip it the way a wall-clock deadline would; when it expires
the handler raises in the main thread, which also breaks a Python loop that
would never end. `budget` gives the bound for an input of n bytes: a constant
for start-up plus a per-byte allowance far below any linear parser's rate.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

PER_BYTE_S = 2e-6
BASE_S = 0.5


class CpuBoundExceededError(AssertionError):
    """The call used more CPU time than its bound."""


def budget(size: int, per_byte_s: float = PER_BYTE_S) -> float:
    """The CPU seconds allowed for `size` bytes of input."""
    return BASE_S + size * per_byte_s


@contextmanager
def cpu_bound(seconds: float) -> Iterator[None]:
    """Raise `CpuBoundExceededError` inside the block once it has used `seconds` of CPU."""

    def expired(_signum: int, _frame: FrameType | None) -> None:
        raise CpuBoundExceededError(f"over {seconds:.2f} s of CPU time")

    previous = signal.signal(signal.SIGPROF, expired)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)

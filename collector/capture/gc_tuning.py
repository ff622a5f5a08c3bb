"""Python's cyclic garbage collector, tuned for the capture loop.

Each packet allocates a few short-lived tuples, bytes and events that never form
cycles (reference counting frees them); with CPython's default threshold (a
young collection every 700 container allocations) the collector ran about every
second SSE event and took ~8% of `collector replay`'s CPU. Inside
`tuned_for_capture`, everything loaded before (modules, config, protobuf
descriptors) is out of the collector's sight (`gc.freeze`) and the young
generation is collected every `YOUNG_THRESHOLD` allocations instead: cycles are
still collected, a little later. On exit the previous settings come back (tests
run `replay` in their own process).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

YOUNG_THRESHOLD = 20_000


@contextmanager
def tuned_for_capture() -> Iterator[None]:
    """The capture loop's collector settings for the duration of the block."""
    before = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()

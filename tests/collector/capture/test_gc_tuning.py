"""The capture loop's garbage-collector settings hold inside the block and are undone after."""

from __future__ import annotations

import gc

from collector.capture.gc_tuning import YOUNG_THRESHOLD, tuned_for_capture


def test_the_young_threshold_is_raised_inside_and_everything_restored_after() -> None:
    before = gc.get_threshold()
    with tuned_for_capture():
        assert gc.get_threshold() == (YOUNG_THRESHOLD, *before[1:])
        assert gc.get_freeze_count() > 0
        cycle: list[object] = []
        cycle.append(cycle)
        del cycle
        assert gc.collect() >= 1, "cycles made inside are still collected"
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0

"""The logprobs tolerance chosen from honest responses' logprobs deviations."""

from __future__ import annotations

import numpy as np
import pytest

from verifierd.calibration import CalibrationError, calibrate, logprobs_tolerance_floor

HONEST = [np.zeros(20), np.zeros(30)]


def test_floors_follow_the_dtype() -> None:
    assert logprobs_tolerance_floor("float32") == 1e-3
    assert logprobs_tolerance_floor("bfloat16") == 0.25
    assert logprobs_tolerance_floor("float16") == 2.0**-5
    # A shift of half a nat is beyond every floor.
    assert max(logprobs_tolerance_floor(d) for d in ("float32", "bfloat16", "float16")) < 0.5


def test_without_logprobs_traffic_the_floor_sets_the_tolerance() -> None:
    cal = calibrate(HONEST, target_fpr=1e-3, sample_rate=1.0, min_logprobs_tolerance=0.25)
    assert cal.settings.logprobs_tolerance == 0.25
    assert (cal.logprobs_responses, cal.max_logprobs_deviation) == (0, 0.0)


def test_honest_deviations_times_safety_above_the_floor() -> None:
    cal = calibrate(HONEST, target_fpr=1e-3, sample_rate=1.0, logprobs_deviations=[2e-6, 0.01])
    assert cal.settings.logprobs_tolerance == pytest.approx(0.015)
    assert (cal.logprobs_responses, cal.max_logprobs_deviation) == (2, 0.01)
    exact = calibrate(HONEST, target_fpr=1e-3, sample_rate=1.0, logprobs_deviations=[1e-6])
    assert exact.settings.logprobs_tolerance == 1e-3


def test_bad_deviations_are_refused() -> None:
    for bad in ([-1.0], [float("nan")], [float("inf")]):
        with pytest.raises(CalibrationError):
            calibrate(HONEST, target_fpr=1e-3, sample_rate=1.0, logprobs_deviations=bad)

"""Calibration of Δmax and threshold from honest margins."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verifierd.calibration import UNCLIPPED, CalibrationError, calibrate, threshold_floor


def test_exact_float32_traffic_gets_the_floors() -> None:
    honest = [np.zeros(50), np.zeros(120), np.zeros(7)]
    cal = calibrate(honest, target_fpr=1e-3, sample_rate=0.5)
    assert (cal.settings.delta_max, cal.settings.threshold) == (1.0, 1e-5)
    assert cal.settings.sample_rate == 0.5
    assert (cal.false_positives, cal.rule, cal.tokens, cal.responses) == (0, "maximum", 177, 3)


def test_bfloat16_like_traffic() -> None:
    rng = np.random.default_rng(1)
    honest = []
    for _ in range(40):
        m = np.where(rng.random(200) < 0.03, rng.uniform(0, 1.5, 200), 0.0)
        m[rng.integers(0, 200)] = UNCLIPPED  # one token outside the nucleus
        honest.append(m)
    cal = calibrate(honest, target_fpr=1e-3, sample_rate=1.0)
    assert cal.max_margin < 1.5
    assert cal.settings.delta_max == pytest.approx(cal.max_margin)
    assert cal.out_of_mask_rate == pytest.approx(1 / 200)
    assert cal.settings.threshold == pytest.approx(cal.max_score * 1.5)
    assert cal.false_positives == 0


def test_large_samples_use_the_quantile() -> None:
    rng = np.random.default_rng(2)
    honest = [rng.exponential(0.01, 100) for _ in range(2000)]
    cal = calibrate(honest, target_fpr=0.005, sample_rate=1.0, safety=1.0, min_threshold=0)
    assert cal.rule == "quantile"
    assert 0 < cal.false_positives <= 0.005 * 2000


def test_too_little_traffic() -> None:
    with pytest.raises(CalibrationError):
        calibrate([np.zeros(3)], target_fpr=0.01, sample_rate=1)
    with pytest.raises(CalibrationError):
        calibrate([np.zeros(3), np.zeros(0)], target_fpr=0.01, sample_rate=1)
    with pytest.raises(CalibrationError):
        calibrate([np.zeros(3)] * 3, target_fpr=0, sample_rate=1)


@settings(deadline=None)
@given(
    st.lists(
        st.lists(st.one_of(st.floats(0, 20), st.just(UNCLIPPED)), min_size=1, max_size=40),
        min_size=2,
        max_size=20,
    )
)
def test_small_samples_never_fail_their_own_honest_traffic(margins: list[list[float]]) -> None:
    cal = calibrate([np.array(m) for m in margins], target_fpr=1e-4, sample_rate=1)
    assert cal.false_positives == 0
    for m in margins:
        score = np.minimum(np.array(m), cal.settings.delta_max).mean()
        assert score <= cal.settings.threshold


def test_a_reduced_precision_floor_lets_a_response_carry_one_rounding_flip() -> None:
    # A bfloat16 sample without a single flip (as a tiny model's run can be) must not
    # set a threshold that one near-tie flip in a later 100-token response exceeds.
    exact = [np.zeros(300) for _ in range(50)]
    floor = threshold_floor("bfloat16")
    settings = calibrate(exact, target_fpr=1e-3, sample_rate=1.0, min_threshold=floor).settings
    flipped = np.zeros(100)
    flipped[37] = 2.0**-5
    assert flipped.mean() <= settings.threshold
    assert threshold_floor("float32") == 1e-5 < threshold_floor("float16") < floor

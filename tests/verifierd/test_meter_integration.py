"""The integration maths and the ring, against synthetic series whose integrals are known."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from verifierd.meter.integration import (
    Point,
    apportion,
    counter_increase,
    integrate_intervals,
    integrate_points,
)
from verifierd.meter.readings import Reading
from verifierd.meter.ring import ReadingRing

S = 1_000_000_000  # ns per second

activities = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
durations = st.integers(min_value=1, max_value=2 * S)


def tiling(start_ns: int, lengths: list[int], values: list[float]) -> list[Reading]:
    """Back-to-back readings of one target starting at start_ns."""
    out = []
    t = start_ns
    for length, value in zip(lengths, values, strict=True):
        out.append(Reading("gpu0", t, t + length, value))
        t += length
    return out


def exact_step_integral(readings: list[Reading], lo: int, hi: int) -> float:
    total = 0.0
    for r in readings:
        overlap = max(0, min(r.end_ns, hi) - max(r.start_ns, lo))
        total += (r.activity or 0.0) * overlap
    return total / S


@given(
    st.lists(st.tuples(durations, activities), min_size=1, max_size=40),
    st.floats(min_value=0, max_value=1),
    st.floats(min_value=0, max_value=1),
)
def test_step_rule_is_exact_on_a_tiling(parts: list[tuple[int, float]], a: float, b: float) -> None:
    readings = tiling(10 * S, [p[0] for p in parts], [p[1] for p in parts])
    first, last = readings[0].start_ns, readings[-1].end_ns
    lo = first + int((last - first) * min(a, b))
    hi = first + int((last - first) * max(a, b))
    result = integrate_intervals(readings, lo, hi, lambda r: r.activity)
    assert result.value == pytest.approx(exact_step_integral(readings, lo, hi), abs=1e-9)
    assert result.covered_seconds == pytest.approx((hi - lo) / S, abs=1e-9)


@given(st.lists(st.tuples(durations, activities), min_size=1, max_size=30), st.data())
def test_step_rule_is_additive(parts: list[tuple[int, float]], data: st.DataObject) -> None:
    readings = tiling(0, [p[0] for p in parts], [p[1] for p in parts])
    end = readings[-1].end_ns
    cuts = sorted(data.draw(st.lists(st.integers(0, end), min_size=3, max_size=3)))
    whole = integrate_intervals(readings, cuts[0], cuts[2], lambda r: r.activity)
    left = integrate_intervals(readings, cuts[0], cuts[1], lambda r: r.activity)
    right = integrate_intervals(readings, cuts[1], cuts[2], lambda r: r.activity)
    assert whole.value == pytest.approx(left.value + right.value, abs=1e-9)


def test_constant_activity_over_ten_seconds_at_ten_hertz() -> None:
    readings = tiling(0, [S // 10] * 100, [0.625] * 100)
    result = integrate_intervals(readings, 0, 10 * S, lambda r: r.activity)
    assert result.value == pytest.approx(6.25)
    assert result.covered_seconds == pytest.approx(10.0)


def test_window_edges_cut_readings_proportionally() -> None:
    readings = [Reading("gpu0", 0, S, 1.0), Reading("gpu0", S, 2 * S, 0.5)]
    result = integrate_intervals(readings, S // 2, S + S // 2, lambda r: r.activity)
    assert result.value == pytest.approx(0.5 * 1.0 + 0.5 * 0.5)


def test_unmeasured_metric_counts_as_uncovered() -> None:
    readings = [Reading("gpu0", 0, S, None, sm=0.3), Reading("gpu0", S, 2 * S, 0.4, sm=None)]
    main = integrate_intervals(readings, 0, 2 * S, lambda r: r.activity)
    sm = integrate_intervals(readings, 0, 2 * S, lambda r: r.sm)
    assert (main.value, main.covered_seconds) == pytest.approx((0.4, 1.0))
    assert (sm.value, sm.covered_seconds) == pytest.approx((0.3, 1.0))


def test_gap_between_readings_is_uncovered() -> None:
    readings = [Reading("gpu0", 0, S, 1.0), Reading("gpu0", 3 * S, 4 * S, 1.0)]
    result = integrate_intervals(readings, 0, 4 * S, lambda r: r.activity)
    assert result.value == pytest.approx(2.0)
    assert result.covered_seconds == pytest.approx(2.0)


def test_reversed_window_is_an_error() -> None:
    with pytest.raises(ValueError):
        integrate_intervals([], 2, 1, lambda r: 0.0)
    with pytest.raises(ValueError):
        integrate_points([], 2, 1)
    with pytest.raises(ValueError):
        counter_increase([], 2, 1)


@given(
    st.floats(min_value=0, max_value=1),
    st.floats(min_value=-0.01, max_value=0.01),
    st.integers(min_value=2, max_value=200),
    st.floats(min_value=0, max_value=1),
    st.floats(min_value=0, max_value=1),
)
def test_trapezoid_is_exact_for_linear_gauges(
    intercept: float, slope_per_s: float, n: int, a: float, b: float
) -> None:
    step = S // 5
    points = [Point(i * step, intercept + slope_per_s * i * step / S) for i in range(n)]
    end = points[-1].t_ns
    lo, hi = int(end * min(a, b)), int(end * max(a, b))

    def antiderivative(t_ns: int) -> float:
        t = t_ns / S
        return intercept * t + slope_per_s * t * t / 2

    result = integrate_points(points, lo, hi)
    assert result.value == pytest.approx(antiderivative(hi) - antiderivative(lo), abs=1e-9)
    assert result.covered_seconds == pytest.approx((hi - lo) / S, abs=1e-9)


def test_trapezoid_of_a_sampled_sine_converges() -> None:
    # Tensor activity swinging between 0 and 1 with a 2 s period, sampled at 10 Hz for 20 s:
    # the exact mean is 0.5, so the integral is 10 activity-seconds.
    points = [
        Point(i * S // 10, 0.5 + 0.5 * math.sin(2 * math.pi * (i / 10) / 2)) for i in range(201)
    ]
    assert integrate_points(points, 0, 20 * S).value == pytest.approx(10.0, rel=1e-3)


def test_trapezoid_skips_gaps_longer_than_allowed() -> None:
    points = [Point(0, 1.0), Point(S, 1.0), Point(10 * S, 1.0), Point(11 * S, 1.0)]
    result = integrate_points(points, 0, 11 * S, max_gap_ns=2 * S)
    assert result.value == pytest.approx(2.0)
    assert result.covered_seconds == pytest.approx(2.0)
    assert integrate_points(points, 0, 11 * S).value == pytest.approx(11.0)


def test_unsorted_points_are_refused() -> None:
    with pytest.raises(ValueError):
        integrate_points([Point(2, 0.0), Point(1, 0.0)], 0, 3)
    with pytest.raises(ValueError):
        counter_increase([Point(2, 0.0), Point(1, 0.0)], 0, 3)


@given(
    st.lists(st.floats(min_value=0, max_value=5), min_size=2, max_size=60),
    st.integers(min_value=0, max_value=59),
)
def test_counter_increase_sums_growth_and_survives_a_reset(
    growth: list[float], reset_at: int
) -> None:
    # A counter growing by `growth[i]` per second, restarted from zero at one point.
    values = []
    total = 0.0
    for i, g in enumerate(growth):
        total = g if i == reset_at else total + g
        values.append(total)
    # A reset is seen only as a drop (as for Prometheus): a restart that lands at or above the
    # old value is indistinguishable from growth.
    assume(not 0 < reset_at < len(values) or values[reset_at] < values[reset_at - 1])
    points = [Point(i * S, v) for i, v in enumerate(values)]
    expected = sum(growth[1:])
    result = counter_increase(points, 0, points[-1].t_ns)
    assert result.value == pytest.approx(expected, abs=1e-6)


def test_counter_increase_prorates_cut_steps() -> None:
    points = [Point(0, 0.0), Point(2 * S, 4.0), Point(4 * S, 4.0)]
    assert counter_increase(points, S, 3 * S).value == pytest.approx(2.0)
    assert counter_increase(points, 5 * S, 6 * S).covered_seconds == 0.0


@given(
    st.floats(min_value=0, max_value=1e6, allow_nan=False),
    st.lists(st.integers(min_value=0, max_value=10_000), min_size=1, max_size=50),
)
def test_apportion_preserves_the_total_and_the_proportions(
    total: float, weights: list[int]
) -> None:
    shares = apportion(total, [float(w) for w in weights])
    assert len(shares) == len(weights)
    assert sum(shares) == pytest.approx(total, rel=1e-9, abs=1e-9)
    weight_sum = sum(weights)
    for share, weight in zip(shares, weights, strict=True):
        expected = total / len(weights) if weight_sum == 0 else total * weight / weight_sum
        assert share == pytest.approx(expected, rel=1e-9, abs=1e-9)


def test_apportion_refuses_negative_weights() -> None:
    with pytest.raises(ValueError):
        apportion(1.0, [1.0, -1.0])
    assert apportion(1.0, []) == ()


def test_ring_finds_the_readings_of_a_window() -> None:
    ring = ReadingRing(capacity=1000)
    for r in tiling(0, [S // 10] * 50, [0.1 * (i % 10) for i in range(50)]):
        assert ring.add(r)
    found = ring.window("gpu0", S // 4, S // 2)
    assert [r.start_ns for r in found] == [2 * S // 10, 3 * S // 10, 4 * S // 10]
    assert ring.window("gpu1", 0, S) == []
    assert ring.latest_end("gpu0") == 5 * S
    assert ring.targets() == ("gpu0",)


def test_ring_refuses_out_of_order_readings() -> None:
    ring = ReadingRing(capacity=10)
    assert ring.add(Reading("gpu0", 0, S, 1.0))
    assert not ring.add(Reading("gpu0", 0, S // 2, 1.0))
    assert len(ring) == 1


@given(st.integers(min_value=1, max_value=20), st.integers(min_value=1, max_value=200))
def test_ring_keeps_at_least_the_last_capacity_readings(capacity: int, n: int) -> None:
    ring = ReadingRing(capacity)
    for r in tiling(0, [S] * n, [0.5] * n):
        ring.add(r)
    kept = ring.window("gpu0", 0, n * S)
    assert min(n, capacity) <= len(kept) <= 2 * capacity
    assert kept[-1].end_ns == n * S
    oldest = ring.oldest_start("gpu0")
    assert oldest is not None and oldest <= (n - min(n, capacity)) * S

"""Activity x time: the integrals behind every compute cost. Pure functions, no I/O.

Three shapes of series, three rules:

* **Interval means** (NVML GPM, NVML utilisation, CPU-counter differences): each value is the
  mean activity over its own interval (start, end]. `integrate_intervals` uses the *step rule*:
  the mean holds over the whole interval, so the integral over [t0, t1] is
  sum(a_i * |(s_i, e_i] ∩ [t0, t1]|). It is exact when the window's edges fall on interval
  edges; an edge that cuts an interval assumes the activity was uniform inside it, an error of
  at most a_i times the cut part, i.e. one sampling period per edge at worst.
* **Gauge points** (a Prometheus range vector of DCGM_FI_PROF_PIPE_TENSOR_ACTIVE):
  `integrate_points` uses the *trapezoid rule* between consecutive points, interpolating linearly
  at the window's edges. Time before the first point, after the last, or inside a gap longer than
  `max_gap_ns` is uncovered and adds nothing.
* **Counter points** (activity-seconds or CPU-seconds totals): `counter_increase` sums the steps
  between consecutive points, taking a drop as a counter reset (the new value counts from zero,
  as Prometheus' increase() does), and prorates the steps that the window's edges cut, which
  assumes the counter grew uniformly between two points (the step rule on its rate).

Every integral reports how much of the window its samples covered, so callers can tell a quiet
device from a missing one.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar


class HasInterval(Protocol):
    """Anything with an interval (start_ns, end_ns], e.g. a Reading."""

    @property
    def start_ns(self) -> int: ...

    @property
    def end_ns(self) -> int: ...


R = TypeVar("R", bound=HasInterval)


@dataclass(frozen=True, slots=True)
class Point:
    """One sample of a gauge or counter at time t_ns."""

    t_ns: int
    value: float


@dataclass(frozen=True, slots=True)
class Integral:
    """An integral in activity-seconds and the seconds of the window its samples covered."""

    value: float
    covered_seconds: float


def _check_window(start_ns: int, end_ns: int) -> None:
    if end_ns < start_ns:
        raise ValueError(f"window ends before it starts: [{start_ns}, {end_ns}]")


def integrate_intervals(
    items: Iterable[R], start_ns: int, end_ns: int, value: Callable[[R], float | None]
) -> Integral:
    """Step-rule integral over [start_ns, end_ns] of interval means.

    `items` are disjoint intervals of one target (their order does not matter); `value` picks the
    metric, None meaning "not measured" (the interval then counts as uncovered).
    """
    _check_window(start_ns, end_ns)
    area_ns = 0.0
    covered_ns = 0
    for item in items:
        overlap = min(item.end_ns, end_ns) - max(item.start_ns, start_ns)
        if overlap <= 0:
            continue
        v = value(item)
        if v is None:
            continue
        area_ns += v * overlap
        covered_ns += overlap
    return Integral(value=area_ns / 1e9, covered_seconds=covered_ns / 1e9)


def _interpolate(a: Point, b: Point, t_ns: int) -> float:
    if b.t_ns == a.t_ns:
        return b.value
    return a.value + (b.value - a.value) * (t_ns - a.t_ns) / (b.t_ns - a.t_ns)


def integrate_points(
    points: Sequence[Point], start_ns: int, end_ns: int, max_gap_ns: int | None = None
) -> Integral:
    """Trapezoid-rule integral over [start_ns, end_ns] of a gauge sampled at `points`.

    `points` must be sorted by time. A pair of consecutive points further apart than
    `max_gap_ns` is a gap: it is not integrated across.
    """
    _check_window(start_ns, end_ns)
    area_ns = 0.0
    covered_ns = 0
    for a, b in itertools.pairwise(points):
        if b.t_ns < a.t_ns:
            raise ValueError("points are not sorted by time")
        if max_gap_ns is not None and b.t_ns - a.t_ns > max_gap_ns:
            continue
        lo, hi = max(a.t_ns, start_ns), min(b.t_ns, end_ns)
        if hi <= lo:
            continue
        area_ns += (_interpolate(a, b, lo) + _interpolate(a, b, hi)) / 2 * (hi - lo)
        covered_ns += hi - lo
    return Integral(value=area_ns / 1e9, covered_seconds=covered_ns / 1e9)


def counter_increase(points: Sequence[Point], start_ns: int, end_ns: int) -> Integral:
    """How much a cumulative counter grew over [start_ns, end_ns], resets allowed.

    `points` must be sorted by time. The result's `value` is in the counter's unit (for our
    counters, activity-seconds or CPU-seconds).
    """
    _check_window(start_ns, end_ns)
    increase = 0.0
    covered_ns = 0
    for a, b in itertools.pairwise(points):
        if b.t_ns < a.t_ns:
            raise ValueError("points are not sorted by time")
        lo, hi = max(a.t_ns, start_ns), min(b.t_ns, end_ns)
        if hi <= lo:
            continue
        step = b.value - a.value if b.value >= a.value else b.value
        increase += step * (hi - lo) / (b.t_ns - a.t_ns)
        covered_ns += hi - lo
    return Integral(value=increase, covered_seconds=covered_ns / 1e9)


def apportion(total: float, weights: Sequence[float]) -> tuple[float, ...]:
    """Split `total` in proportion to non-negative `weights` (equal shares when all are zero).

    Used to give each verdict of a batch its share of the batch's cost by token count.
    """
    if any(w < 0 for w in weights):
        raise ValueError("weights must be non-negative")
    if not weights:
        return ()
    weight_sum = sum(weights)
    if weight_sum == 0:
        return tuple(total / len(weights) for _ in weights)
    return tuple(total * w / weight_sum for w in weights)

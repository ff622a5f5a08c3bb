"""A simulated Hopper GPU behind the GpmApi seam, to produce realistic GPM recordings.

GPM samples are snapshots of cumulative hardware counters; nvmlGpmMetricsGet divides the growth
of a counter between two snapshots by the elapsed time. `SimulatedGpmGpus` does the same over a
piecewise-constant activity profile, so its metrics are exactly what a GPU running that profile
would report (plus optional measurement noise), and the integral of the profile is known. Wrapped
in RecordingGpmApi it yields recordings in the same format a real GPU gives (gpu_check.py writes
one from the H200 to compare).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from verifierd.meter.nvml_gpm import DRAM_BW_UTIL, SM_UTIL, TENSOR_UTIL, GpmMetricResult

S = 1_000_000_000


@dataclass(frozen=True)
class Phase:
    """`seconds` of constant activity (fractions 0..1)."""

    seconds: float
    tensor: float
    sm: float
    dram: float


def profile_integral(phases: Sequence[Phase], start_s: float, end_s: float) -> float:
    """Exact tensor activity-seconds of the profile over [start_s, end_s] (from profile start)."""
    total = 0.0
    t = 0.0
    for phase in phases:
        lo, hi = max(t, start_s), min(t + phase.seconds, end_s)
        if hi > lo:
            total += phase.tensor * (hi - lo)
        t += phase.seconds
    return total


class SimulatedGpmGpus:
    """GpmApi over simulated GPUs that all run `phases` from `start_ns`; the clock advances by
    `period_ns` (plus uniform jitter) at every take_sample of GPU 0."""

    def __init__(
        self,
        phases: Sequence[Phase],
        start_ns: int,
        *,
        gpus: int = 1,
        period_ns: int = S // 10,
        jitter_ns: int = 0,
        seed: int = 0,
        unsupported_metrics: Sequence[int] = (),
    ) -> None:
        self._phases = list(phases)
        self._start = start_ns
        self._gpus = gpus
        self._period = period_ns
        self._jitter = jitter_ns
        self._rng = random.Random(seed)
        self._unsupported = set(unsupported_metrics)
        self._now = start_ns
        self._first = True
        self._buffers: dict[tuple[int, int], int] = {}

    def _cumulative(self, t_ns: int, field: str) -> float:
        """Activity-ns of `field` accumulated from start to t_ns."""
        elapsed = t_ns - self._start
        total = 0.0
        t = 0
        for phase in self._phases:
            length = round(phase.seconds * S)
            part = max(0, min(elapsed - t, length))
            total += getattr(phase, field) * part
            t += length
        return total

    def device_count(self) -> int:
        return self._gpus

    def is_supported(self, gpu: int) -> bool:
        return True

    def take_sample(self, gpu: int, slot: int) -> int:
        if gpu == 0:
            if self._first:
                self._first = False
            else:
                self._now += self._period + self._rng.randint(-self._jitter, self._jitter)
        t = self._now + gpu * 20_000
        self._buffers[(gpu, slot)] = t
        return t

    def metrics(
        self, gpu: int, earlier: int, later: int, metric_ids: Sequence[int]
    ) -> tuple[GpmMetricResult, ...]:
        t1, t2 = self._buffers[(gpu, earlier)], self._buffers[(gpu, later)]
        fields = {TENSOR_UTIL: "tensor", SM_UTIL: "sm", DRAM_BW_UTIL: "dram"}
        out = []
        for metric_id in metric_ids:
            if metric_id in self._unsupported:
                out.append(GpmMetricResult(metric_id, 3, 0.0))
                continue
            field = fields[metric_id]
            growth = self._cumulative(t2, field) - self._cumulative(t1, field)
            out.append(GpmMetricResult(metric_id, 0, 100.0 * growth / (t2 - t1)))
        return tuple(out)

    def close(self) -> None:
        pass

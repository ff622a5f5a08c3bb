"""The prover meter: the prover's GPU (or CPU) activity as Prometheus metrics, where DCGM's
exporter is not deployed.

It runs beside the prover (`verifierd prover-meter`), samples with the same samplers as
verifierd's meter (NVML GPM, NVML utilisation, or CPU-seconds of process trees and cgroups),
and exports, per target ("gpu0", "pid1234", "cgroup:/sys/fs/cgroup/x") and method:

    veritap_prover_activity_ratio           gauge    latest mean activity (0..1, or cores busy)
    veritap_prover_activity_seconds_total   counter  activity integrated since start
    veritap_prover_sm_active_ratio, veritap_prover_sm_active_seconds_total          (nvml-gpm)
    veritap_prover_dram_active_ratio, veritap_prover_dram_active_seconds_total      (GPUs)

The counters are exact integrals of every reading (10 Hz by default), so their increase between
any two scrapes is the activity in between, whatever the scrape interval: integrate those rather
than the gauges (a 1 s scrape of a 100 ms gauge is a sample, not an average).

It also keeps the recent history of those series and answers Prometheus' range-query API for
them (GET or POST /api/v1/query_range with a bare selector: `name` or `name{label="value",...}`),
so `verifierd vca --prometheus http://PROVER-METER` works with no Prometheus server in between.
"""

from __future__ import annotations

import bisect
import logging
import math
import re
import threading
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge
from prometheus_client.exposition import generate_latest
from veritap.runtime_metrics import register_runtime_metrics

from verifierd.meter.integration import Point
from verifierd.meter.readings import Reading
from verifierd.meter.sampling import Meter
from verifierd.vca import Series

log = logging.getLogger(__name__)

PREFIX = "veritap_prover_"
ACTIVITY_RATIO = PREFIX + "activity_ratio"
ACTIVITY_TOTAL = PREFIX + "activity_seconds_total"
SM_RATIO = PREFIX + "sm_active_ratio"
SM_TOTAL = PREFIX + "sm_active_seconds_total"
DRAM_RATIO = PREFIX + "dram_active_ratio"
DRAM_TOTAL = PREFIX + "dram_active_seconds_total"
# Prometheus' default lookback: a range query sees a sample for this long after it was taken.
LOOKBACK_NS = 300 * 10**9
MAX_POINTS = 11_000

Labels = tuple[tuple[str, str], ...]

_SELECTOR = re.compile(r"^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{(.*)\})?\s*$", re.DOTALL)
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')


class SelectorError(ValueError):
    """A query the prover meter cannot answer (it knows bare selectors with = matchers only)."""


def parse_selector(text: str) -> tuple[str, Labels]:
    """`name{a="x",b="y"}` -> ("name", (("a", "x"), ("b", "y")))."""
    match = _SELECTOR.match(text)
    if match is None:
        raise SelectorError(f"not a bare series selector: {text!r}")
    name, body = match.group(1), match.group(2)
    matchers: list[tuple[str, str]] = []
    rest = body or ""
    while rest.strip():
        m = _MATCHER.match(rest)
        if m is None:
            raise SelectorError(f'only label="value" matchers are supported: {text!r}')
        value = m.group(2).replace('\\"', '"').replace("\\\\", "\\")
        matchers.append((m.group(1), value))
        rest = rest[m.end() :]
    return name, tuple(matchers)


@dataclass(slots=True)
class _History:
    times: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)


class SeriesHistory:
    """The last `capacity` points of each series, by metric name and labels. Thread-safe."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._lock = threading.Lock()
        self._series: dict[tuple[str, Labels], _History] = {}

    def add(self, name: str, labels: Labels, t_ns: int, value: float) -> None:
        with self._lock:
            history = self._series.setdefault((name, labels), _History())
            if history.times and t_ns <= history.times[-1]:
                return
            history.times.append(t_ns)
            history.values.append(value)
            if len(history.times) > 2 * self._capacity:
                cut = len(history.times) - self._capacity
                del history.times[:cut]
                del history.values[:cut]

    def range(
        self, name: str, matchers: Labels, start_ns: int, end_ns: int, step_ns: int
    ) -> list[Series]:
        """Each matching series evaluated every `step_ns` from start to end, as Prometheus
        does: the newest value at or before each step, if no older than the lookback."""
        wanted = set(matchers)
        out: list[Series] = []
        with self._lock:
            for (series_name, labels), history in sorted(self._series.items()):
                if series_name != name or not wanted <= set(labels):
                    continue
                points: list[Point] = []
                for t in range(start_ns, end_ns + 1, step_ns):
                    i = bisect.bisect_right(history.times, t) - 1
                    if i >= 0 and t - history.times[i] <= LOOKBACK_NS:
                        points.append(Point(t, history.values[i]))
                if points:
                    out.append(Series((("__name__", name), *labels), tuple(points)))
        return out


class ProverMeter:
    """Exports a Meter's readings as Prometheus metrics and keeps their history."""

    def __init__(self, meter: Meter, history_capacity: int = 36_000) -> None:
        self.meter = meter
        self.registry = CollectorRegistry()
        r = self.registry
        register_runtime_metrics(r, "prover-meter")
        labels = ["target", "method"]
        self._activity = Gauge(
            ACTIVITY_RATIO,
            "Latest mean activity of a prover target: tensor-pipe active fraction (nvml-gpm), "
            "GPU busy fraction (nvml-utilization) or cores busy (cpu-seconds).",
            labels,
            registry=r,
        )
        self._activity_total = Counter(
            ACTIVITY_TOTAL.removesuffix("_total"),
            "Activity of a prover target integrated over time: GPU-seconds at full activity, or "
            "CPU-seconds.",
            labels,
            registry=r,
        )
        self._sm = Gauge(
            SM_RATIO, "Latest fraction of SMs busy (nvml-gpm).", ["target"], registry=r
        )
        self._sm_total = Counter(
            SM_TOTAL.removesuffix("_total"),
            "SM activity integrated over time (nvml-gpm).",
            ["target"],
            registry=r,
        )
        self._dram = Gauge(
            DRAM_RATIO, "Latest fraction of DRAM bandwidth used.", ["target"], registry=r
        )
        self._dram_total = Counter(
            DRAM_TOTAL.removesuffix("_total"),
            "DRAM bandwidth use integrated over time.",
            ["target"],
            registry=r,
        )
        self._history = SeriesHistory(history_capacity)
        self._totals: dict[tuple[str, Labels], float] = {}
        meter.subscribe(self.record)

    def _count(
        self, counter: Counter, name: str, labels: Labels, t_ns: int, increment: float
    ) -> None:
        counter.labels(**dict(labels)).inc(increment)
        total = self._totals.get((name, labels), 0.0) + increment
        self._totals[(name, labels)] = total
        self._history.add(name, labels, t_ns, total)

    def record(self, reading: Reading) -> None:
        """Export one reading (the meter calls this from its sampling thread)."""
        method = str(self.meter.method)
        with_method: Labels = (("method", method), ("target", reading.target))
        target_only: Labels = (("target", reading.target),)
        t = reading.end_ns
        if reading.activity is not None:
            self._activity.labels(target=reading.target, method=method).set(reading.activity)
            self._history.add(ACTIVITY_RATIO, with_method, t, reading.activity)
            self._count(
                self._activity_total,
                ACTIVITY_TOTAL,
                with_method,
                t,
                reading.activity * reading.seconds,
            )
        if reading.sm is not None:
            self._sm.labels(target=reading.target).set(reading.sm)
            self._history.add(SM_RATIO, target_only, t, reading.sm)
            self._count(self._sm_total, SM_TOTAL, target_only, t, reading.sm * reading.seconds)
        if reading.dram is not None:
            self._dram.labels(target=reading.target).set(reading.dram)
            self._history.add(DRAM_RATIO, target_only, t, reading.dram)
            self._count(
                self._dram_total, DRAM_TOTAL, target_only, t, reading.dram * reading.seconds
            )

    def query_range(self, query: str, start_ns: int, end_ns: int, step_ns: int) -> list[Series]:
        """A Prometheus range query over the kept history (bare selectors only)."""
        if step_ns <= 0 or end_ns < start_ns:
            raise SelectorError("need step > 0 and end >= start")
        if (end_ns - start_ns) // step_ns + 1 > MAX_POINTS:
            raise SelectorError(f"more than {MAX_POINTS} points per series; raise the step")
        name, matchers = parse_selector(query)
        return self._history.range(name, matchers, start_ns, end_ns, step_ns)

    def app(self) -> web.Application:
        """/metrics, /api/v1/query_range and /-/ready."""
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_route("*", "/api/v1/query_range", self._query_range)
        app.router.add_get("/-/ready", self._ready)
        return app

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _ready(self, request: web.Request) -> web.Response:
        return web.Response(text="ready\n")

    async def _query_range(self, request: web.Request) -> web.Response:
        params = dict(request.query)
        if request.method == "POST":
            params.update({k: str(v) for k, v in (await request.post()).items()})
        try:
            start = _seconds_to_ns(params["start"])
            end = _seconds_to_ns(params["end"])
            step = _seconds_to_ns(params["step"])
            result = self.query_range(params["query"], start, end, step)
        except KeyError as exc:
            return _bad_data(f"missing parameter {exc}")
        except (ValueError, SelectorError) as exc:
            return _bad_data(str(exc))
        matrix = [
            {
                "metric": dict(series.labels),
                "values": [[p.t_ns / 1e9, repr(p.value)] for p in series.points],
            }
            for series in result
        ]
        return web.json_response(
            {"status": "success", "data": {"resultType": "matrix", "result": matrix}}
        )


def _seconds_to_ns(text: str) -> int:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"not a finite time: {text!r}")
    return round(value * 1e9)


def _bad_data(message: str) -> web.Response:
    return web.json_response(
        {"status": "error", "errorType": "bad_data", "error": message}, status=400
    )

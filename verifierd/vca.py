"""Verifier compute advantage (VCA): how much less compute verifying a response costs than
generating it.

For one commitment over a window:

    VCA = (prover activity-seconds / tokens the prover generated)
          / (verifier activity-seconds / tokens the verifier checked)

The verifier side comes from the cost log (verifierd.cost_log): every engine batch's metered
activity, its verified tokens and the capture times of its records. The prover side comes from
Prometheus' HTTP API (`query_range`): by default DCGM's DCGM_FI_PROF_PIPE_TENSOR_ACTIVE gauge
(0..1 per GPU), integrated with the trapezoid rule; or the counters of `verifierd prover-meter`
(veritap_prover_activity_seconds_total, activity-seconds per GPU or CPU-seconds of a process
tree), whose increase over the window is the integral. The prover meter answers the same
query_range API itself, so no Prometheus server is needed to read it.

The prover's activity is measured over the span of the selected batches' traffic (from the
first request to the last response, clipped to the asked window), or over the asked window. When
several commitments share the window, the prover's activity is split among them in proportion to
the tokens each generated (the prover query cannot tell models apart unless it is written to).
Tokens the prover generated = verified completion tokens / the commitment's sample rate (exact at
rate 1). Like is compared with like: tensor activity with nvml-gpm, GPU busy time with
nvml-utilization, CPU-seconds with cpu-seconds; anything else is said in the report's notes.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

from verifierd.cost_log import BatchCost, CostLog
from verifierd.errors import VerifierdError
from verifierd.meter.integration import Point, counter_increase, integrate_points
from verifierd.meter.readings import Method

DCGM_TENSOR_ACTIVE = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"
PROVER_ACTIVITY_TOTAL = "veritap_prover_activity_seconds_total"
# Prometheus refuses range queries of more than 11,000 points per series.
MAX_POINTS_PER_QUERY = 10_000


class VcaError(VerifierdError):
    """The prover's activity could not be read (Prometheus unreachable, bad query, no data)."""


class SeriesKind(enum.StrEnum):
    """How a Prometheus series is integrated over time."""

    GAUGE = "gauge"  # an activity ratio: trapezoid rule
    COUNTER = "counter"  # a running total of activity-seconds: increase


class Measure(enum.StrEnum):
    """What an activity figure measures, so unlike quantities are never silently compared."""

    GPU_TENSOR_ACTIVE = "gpu-tensor-active"
    GPU_BUSY = "gpu-busy"
    CPU_SECONDS = "cpu-seconds"
    CUSTOM = "custom"


MEASURE_OF_METHOD: dict[Method, Measure] = {
    Method.NVML_GPM: Measure.GPU_TENSOR_ACTIVE,
    Method.NVML_UTILIZATION: Measure.GPU_BUSY,
    Method.CPU_SECONDS: Measure.CPU_SECONDS,
}


@dataclass(frozen=True, slots=True)
class ProverQuery:
    """A PromQL expression whose series, integrated over time and summed, give the prover's
    activity-seconds."""

    query: str
    kind: SeriesKind
    measure: Measure
    step_s: float = 1.0

    def __post_init__(self) -> None:
        if not self.query.strip():
            raise ValueError("the prover query is empty")
        if self.step_s <= 0:
            raise ValueError(f"step must be positive: {self.step_s}")


PRESETS: dict[str, ProverQuery] = {
    "dcgm": ProverQuery(DCGM_TENSOR_ACTIVE, SeriesKind.GAUGE, Measure.GPU_TENSOR_ACTIVE),
    "nvml-gpm": ProverQuery(
        f'{PROVER_ACTIVITY_TOTAL}{{method="nvml-gpm"}}',
        SeriesKind.COUNTER,
        Measure.GPU_TENSOR_ACTIVE,
    ),
    "nvml-utilization": ProverQuery(
        f'{PROVER_ACTIVITY_TOTAL}{{method="nvml-utilization"}}',
        SeriesKind.COUNTER,
        Measure.GPU_BUSY,
    ),
    "cpu": ProverQuery(
        f'{PROVER_ACTIVITY_TOTAL}{{method="cpu-seconds"}}',
        SeriesKind.COUNTER,
        Measure.CPU_SECONDS,
    ),
}


def prover_query(name: str, batches: Sequence[BatchCost]) -> ProverQuery:
    """The PRESETS query called `name`; "auto" picks the prover meter's CPU counters when every
    batch was metered in CPU-seconds (a CPU host compares CPU with CPU), else DCGM."""
    if name == "auto":
        cpu = bool(batches) and all(b.method is Method.CPU_SECONDS for b in batches)
        name = "cpu" if cpu else "dcgm"
    return PRESETS[name]


@dataclass(frozen=True, slots=True)
class Series:
    """One series of a range query: its labels and its (time, value) points."""

    labels: tuple[tuple[str, str], ...]
    points: tuple[Point, ...]


def parse_matrix(body: object) -> list[Series]:
    """The series of a Prometheus query_range JSON answer; VcaError for an error answer or for
    anything that is not a range vector."""
    if not isinstance(body, dict):
        raise VcaError("Prometheus answered with something other than a JSON object")
    if body.get("status") != "success":
        raise VcaError(
            f"Prometheus refused the query: {body.get('errorType', '?')}: {body.get('error', '')}"
        )
    data = body.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "matrix":
        raise VcaError("Prometheus did not answer with a range vector (resultType matrix)")
    try:
        return [_series(item) for item in data.get("result", [])]
    except (AttributeError, TypeError, ValueError, OverflowError) as exc:
        raise VcaError(f"malformed range vector from Prometheus: {exc}") from exc


def _series(item: dict[str, object]) -> Series:
    metric = item.get("metric", {})
    values = item.get("values", [])
    if not isinstance(metric, dict) or not isinstance(values, list):
        raise TypeError("a series needs a metric object and a values list")
    labels = tuple(sorted((str(k), str(v)) for k, v in metric.items()))
    points: list[Point] = []
    for t, value in values:
        v = float(value)
        t_ns = round(float(t) * 1e9)
        if math.isfinite(v):
            if points and t_ns <= points[-1].t_ns:
                raise ValueError("sample times do not increase")
            points.append(Point(t_ns, v))
    return Series(labels, tuple(points))


class PrometheusClient:
    """The part of Prometheus' HTTP API that VCA needs: range queries."""

    def __init__(self, base_url: str, session: aiohttp.ClientSession) -> None:
        self._base = base_url.rstrip("/")
        self._session = session

    @property
    def base_url(self) -> str:
        return self._base

    async def query_range(
        self, query: str, start_ns: int, end_ns: int, step_s: float
    ) -> list[Series]:
        """Evaluate `query` every `step_s` seconds from start to end (split into requests of at
        most MAX_POINTS_PER_QUERY points) and merge the pieces of each series."""
        step_ns = round(step_s * 1e9)
        chunk_ns = step_ns * MAX_POINTS_PER_QUERY
        merged: dict[tuple[tuple[str, str], ...], list[Point]] = {}
        lo = start_ns
        while True:
            hi = min(end_ns, lo + chunk_ns)
            for series in await self._query_range_once(query, lo, hi, step_s):
                points = merged.setdefault(series.labels, [])
                for point in series.points:
                    if not points or point.t_ns > points[-1].t_ns:
                        points.append(point)
            if hi >= end_ns:
                break
            lo = hi
        return [Series(labels, tuple(points)) for labels, points in merged.items()]

    async def _query_range_once(
        self, query: str, start_ns: int, end_ns: int, step_s: float
    ) -> list[Series]:
        params = {
            "query": query,
            "start": f"{start_ns / 1e9:.3f}",
            "end": f"{end_ns / 1e9:.3f}",
            "step": f"{step_s:g}",
        }
        url = f"{self._base}/api/v1/query_range"
        try:
            async with self._session.get(url, params=params) as response:
                try:
                    body = await response.json(content_type=None)
                except ValueError as exc:
                    raise VcaError(f"{url} answered HTTP {response.status} without JSON") from exc
        except aiohttp.ClientError as exc:
            raise VcaError(f"cannot query {url}: {exc}") from exc
        return parse_matrix(body)


@dataclass(frozen=True, slots=True)
class ProverActivity:
    """The prover's activity over [start_ns, end_ns], summed over the query's series."""

    source: str
    query: ProverQuery
    start_ns: int
    end_ns: int
    activity_seconds: float
    covered_seconds: float
    series: int

    @property
    def coverage(self) -> float:
        total = (self.end_ns - self.start_ns) / 1e9 * self.series
        return 0.0 if total <= 0 else min(1.0, self.covered_seconds / total)


async def measure_prover(
    client: PrometheusClient, query: ProverQuery, start_ns: int, end_ns: int
) -> ProverActivity:
    """Integrate the prover query over [start_ns, end_ns]."""
    step_ns = round(query.step_s * 1e9)
    # Evaluate one step past the end so the last interval reaches it; integration clips.
    steps = max(1, math.ceil((end_ns - start_ns) / step_ns))
    series = await client.query_range(
        query.query, start_ns, start_ns + steps * step_ns, query.step_s
    )
    activity = 0.0
    covered = 0.0
    for one in series:
        if query.kind is SeriesKind.GAUGE:
            part = integrate_points(one.points, start_ns, end_ns, max_gap_ns=2 * step_ns)
        else:
            part = counter_increase(one.points, start_ns, end_ns)
        activity += part.value
        covered += part.covered_seconds
    return ProverActivity(
        source=client.base_url,
        query=query,
        start_ns=start_ns,
        end_ns=end_ns,
        activity_seconds=activity,
        covered_seconds=covered,
        series=len(series),
    )


class ProverWindow(enum.StrEnum):
    """Over which time the prover's activity is integrated."""

    TRAFFIC = "traffic"  # first request to last response of the selected batches' records
    GIVEN = "given"  # the --from/--to window as asked


@dataclass(frozen=True, slots=True)
class VcaRow:
    """The VCA of one commitment (or of all, `commitment_id` "*"), metered one way."""

    commitment_id: str
    method: Method
    batches: int
    records: int
    prompt_tokens: int
    verified_tokens: int
    generated_tokens: float
    verifier_activity_seconds: float
    verifier_coverage: float
    prover_activity_seconds: float
    vca: float | None


@dataclass(frozen=True, slots=True)
class VcaReport:
    from_ns: int
    to_ns: int
    prover: ProverActivity | None
    rows: tuple[VcaRow, ...]
    total: VcaRow | None
    notes: tuple[str, ...]


def traffic_span(batches: Sequence[BatchCost], from_ns: int, to_ns: int) -> tuple[int, int]:
    """First request to last response of the batches' records, clipped to [from_ns, to_ns]."""
    if not batches:
        return from_ns, to_ns
    start = max(from_ns, min(b.traffic_start_ns for b in batches))
    end = min(to_ns, max(b.traffic_end_ns for b in batches))
    return start, max(start, end)


def _vca(prover_s: float, generated: float, verifier_s: float, verified: int) -> float | None:
    if generated <= 0 or verified <= 0 or verifier_s <= 0:
        return None
    return (prover_s / generated) / (verifier_s / verified)


def _row(
    commitment_id: str, method: Method, batches: Sequence[BatchCost], prover_s: float | None
) -> VcaRow:
    verified = sum(b.completion_tokens for b in batches)
    generated = sum(b.completion_tokens / b.sample_rate for b in batches)
    verifier_s = sum(b.activity_seconds for b in batches)
    window = sum((b.end_ns - b.start_ns) / 1e9 * len(b.targets) for b in batches)
    covered = sum(b.covered_seconds for b in batches)
    return VcaRow(
        commitment_id=commitment_id,
        method=method,
        batches=len(batches),
        records=sum(b.records for b in batches),
        prompt_tokens=sum(b.prompt_tokens for b in batches),
        verified_tokens=verified,
        generated_tokens=generated,
        verifier_activity_seconds=verifier_s,
        verifier_coverage=1.0 if window <= 0 else min(1.0, covered / window),
        prover_activity_seconds=0.0 if prover_s is None else prover_s,
        vca=None if prover_s is None else _vca(prover_s, generated, verifier_s, verified),
    )


def build_report(
    batches: Sequence[BatchCost], prover: ProverActivity | None, from_ns: int, to_ns: int
) -> VcaReport:
    """The VCA report from the selected batches and the prover's activity (pure)."""
    groups: dict[tuple[str, Method], list[BatchCost]] = {}
    for batch in batches:
        groups.setdefault((batch.commitment_id, batch.method), []).append(batch)
    generated_all = sum(b.completion_tokens / b.sample_rate for b in batches)
    # Without a prover series there is nothing to compare with (not "zero prover work").
    prover_s = prover.activity_seconds if prover is not None and prover.series else None
    notes: list[str] = []
    rows = []
    for (commitment_id, method), group in sorted(groups.items()):
        generated = sum(b.completion_tokens / b.sample_rate for b in group)
        share = None
        if prover_s is not None:
            share = prover_s * generated / generated_all if generated_all > 0 else 0.0
        rows.append(_row(commitment_id, method, group, share))
    methods = {m for _, m in groups}
    total = None
    if len(methods) == 1 and rows:
        total = _row("*", next(iter(methods)), batches, prover_s)
    elif len(methods) > 1:
        notes.append(
            "batches were metered in different ways ("
            + ", ".join(sorted(methods))
            + "): no total, and the prover's share of each is not like for like"
        )
    if not batches:
        notes.append("no verified batch in the window")
    if len(rows) > 1:
        notes.append("prover activity split across commitments by generated tokens")
    if any(b.sample_rate < 1 for b in batches):
        notes.append("generated tokens estimated as verified tokens / sample rate")
    if Method.CPU_SECONDS in methods:
        notes.append(
            "cpu-seconds: CPU time of the prover's process tree against the verifier's engine "
            "processes, not GPU activity"
        )
    if prover is None:
        notes.append("no prover measurement: VCA unknown")
    else:
        for method in methods:
            if MEASURE_OF_METHOD[method] != prover.query.measure:
                notes.append(
                    f"prover measures {prover.query.measure}, verifier {method} "
                    f"({MEASURE_OF_METHOD[method]}): not like for like"
                )
        if prover.series == 0:
            notes.append(f"the prover query returned no series: {prover.query.query}")
        elif prover.coverage < 0.9:
            notes.append(f"prover samples cover {prover.coverage:.0%} of the window")
    for row in rows:
        if row.verifier_coverage < 0.9:
            notes.append(
                f"{row.commitment_id[:12]}: meter readings cover {row.verifier_coverage:.0%} "
                "of its batches"
            )
    return VcaReport(from_ns, to_ns, prover, tuple(rows), total, tuple(notes))


async def vca_report(
    cost_log: CostLog,
    client: PrometheusClient | None,
    query: ProverQuery,
    from_ns: int,
    to_ns: int,
    *,
    commitment_id: str | None = None,
    window: ProverWindow = ProverWindow.TRAFFIC,
) -> VcaReport:
    """Read the batches of [from_ns, to_ns] from the cost log, measure the prover, report."""
    batches = cost_log.between(from_ns, to_ns, commitment_id)
    prover = None
    if client is not None:
        if window is ProverWindow.TRAFFIC:
            start, end = traffic_span(batches, from_ns, to_ns)
        else:
            start, end = from_ns, to_ns
        prover = await measure_prover(client, query, start, end)
    return build_report(batches, prover, from_ns, to_ns)

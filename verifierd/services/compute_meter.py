"""The compute meter as one of the daemon's services: what each engine batch cost.

engines.device "cuda": NVML GPM on engines.gpu_indices at 10 Hz (NVML utilisation on GPUs
without GPM). "cpu": CPU-seconds of the engine processes, i.e. the process trees of the
daemon's children, each followed from within a second of its start. The service plugs a
`BatchCostRecorder` into the pipeline: for every engine batch the pipeline gets a ComputeCost
(which it shares out onto the batch's verdicts by tokens), the cost log (STATE_DIR/costs) gets a
BatchCost for `verifierd vca`, and METRICS gets the activity. When the meter cannot work (a
CUDA host without NVML) or the cost log cannot open, the service says why in the log and the
daemon runs without costs.

With `[metrics] prover_url` set, a `VcaGauge` recomputes the VCA of the batches whose traffic
ended in the last `vca_window_s` every `vca_interval_s` -- the same report as `verifierd vca
--from=-WINDOW`, from this cost log and the prover's activity read from that Prometheus (or
prover meter) -- and sets METRICS.vca per commitment and method.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence

import aiohttp
from veritap.v1 import verifier_pb2

from verifierd.api.sources import VcaFigure
from verifierd.config import MetricsConfig
from verifierd.cost_log import BatchCost, CostLog, CostLogError, cost_log_dir
from verifierd.daemon import DaemonContext
from verifierd.meter.cpu import CpuSampler
from verifierd.meter.errors import MeterUnavailableError
from verifierd.meter.readings import Method
from verifierd.meter.sampling import Meter, Sampler
from verifierd.meter.selection import open_gpu_sampler
from verifierd.metrics import METRICS, VerifierMetrics
from verifierd.pipeline import EngineBatch
from verifierd.vca import (
    PrometheusClient,
    ProverActivity,
    VcaError,
    VcaReport,
    build_report,
    measure_prover,
    prover_query,
    traffic_span,
)

log = logging.getLogger(__name__)

INTERVAL_S = 0.1


class BatchCostRecorder:
    """The pipeline's BatchMeter: meters a batch, logs its cost, returns its ComputeCost."""

    def __init__(self, meter: Meter, cost_log: CostLog, metrics: VerifierMetrics) -> None:
        self._meter = meter
        self._log = cost_log
        self._metrics = metrics
        self._lock = threading.Lock()
        self._closed = False

    def measure(self, batch: EngineBatch) -> verifier_pb2.ComputeCost | None:
        with self._lock:
            if self._closed:
                return None
            meter = self._meter
            targets = meter.targets_for(gpus=batch.engine.gpus, pids=batch.engine.pids)
            if meter.method is Method.CPU_SECONDS:
                meter.tick()  # a CPU sample right now closes the window exactly
            cost = meter.cost(batch.start_ns, batch.end_ns, targets)
            self._log.append(
                BatchCost.from_window(
                    cost,
                    batch_id=batch.batch_id,
                    commitment_id=batch.commitment_id,
                    records=batch.records,
                    prompt_tokens=batch.prompt_tokens,
                    completion_tokens=batch.completion_tokens,
                    traffic_start_ns=batch.traffic_start_ns,
                    traffic_end_ns=batch.traffic_end_ns,
                    sample_rate=batch.sample_rate,
                )
            )
        labels = {"commitment": batch.commitment_id}
        self._metrics.batch_activity_seconds.labels(**labels, method=str(cost.method)).inc(
            cost.activity_seconds
        )
        if cost.coverage < 0.9:
            log.warning(
                "batch only partly metered",
                extra={"batch_id": batch.batch_id, "coverage": round(cost.coverage, 3)},
            )
        return verifier_pb2.ComputeCost(
            method=str(cost.method),
            activity_seconds=cost.activity_seconds,
            window_start_ns=cost.start_ns,
            window_end_ns=cost.end_ns,
        )

    def between(self, from_ns: int, to_ns: int) -> list[BatchCost]:
        """The logged batches whose traffic ended in [from_ns, to_ns] (none once closed)."""
        with self._lock:
            return [] if self._closed else self._log.between(from_ns, to_ns)

    def close(self) -> None:
        """Stop the meter and close the cost log; later batches get no cost."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._meter.stop()
            self._log.close()


class VcaGauge:
    """The VCA of the recent window, recomputed every `vca_interval_s` into `metrics.vca`.

    `batches(from_ns, to_ns)` gives the cost log's batches whose traffic ended in the window.
    """

    def __init__(
        self,
        batches: Callable[[int, int], list[BatchCost]],
        client: PrometheusClient,
        config: MetricsConfig,
        metrics: VerifierMetrics,
    ) -> None:
        self._batches = batches
        self._client = client
        self._config = config
        self._metrics = metrics
        self._problem = ""
        #: The last report (GetStats shows its total through `figure`).
        self.latest: VcaReport | None = None

    def figure(self) -> VcaFigure | None:
        """The last report's VCA over all commitments (None while unknown)."""
        total = None if self.latest is None else self.latest.total
        if total is None or total.vca is None:
            return None
        return VcaFigure(total.vca, str(total.method))

    async def refresh(self, now_ns: int | None = None) -> VcaReport:
        """One report over [now - vca_window_s, now]; exported, kept in `latest`, returned."""
        to_ns = time.time_ns() if now_ns is None else now_ns
        from_ns = to_ns - round(self._config.vca_window_s * 1e9)
        batches = await asyncio.to_thread(self._batches, from_ns, to_ns)
        prover = await self._prover(batches, from_ns, to_ns) if batches else None
        report = build_report(batches, prover, from_ns, to_ns)
        self._metrics.set_vca(report.rows)
        self.latest = report
        return report

    async def _prover(
        self, batches: Sequence[BatchCost], from_ns: int, to_ns: int
    ) -> ProverActivity | None:
        query = prover_query(self._config.prover, batches)
        start, end = traffic_span(batches, from_ns, to_ns)
        try:
            prover = await measure_prover(self._client, query, start, end)
        except VcaError as exc:
            self._say(str(exc))
            return None
        self._say("" if prover.series else f"the prover query returned no series: {query.query}")
        return prover

    def _say(self, problem: str) -> None:
        """Log a prover problem (or its end) once, not at every refresh."""
        if problem != self._problem:
            if problem:
                log.warning("vca gauge: no prover reading", extra={"reason": problem})
            else:
                log.info("vca gauge: prover readings back", extra={"url": self._client.base_url})
            self._problem = problem

    async def run(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception:
                log.exception("vca gauge refresh failed")
            await asyncio.sleep(self._config.vca_interval_s)


class ComputeMeterService:
    name = "compute-meter"

    def __init__(self, context: DaemonContext) -> None:
        self._context = context
        self._recorder: BatchCostRecorder | None = None
        self._session: aiohttp.ClientSession | None = None
        self._vca_task: asyncio.Task[None] | None = None
        self.vca: VcaGauge | None = None

    def _sampler(self) -> Sampler:
        engines = self._context.config.engines
        if engines.device == "cpu":
            return CpuSampler(follow_children_of=os.getpid())
        sampler, skipped = open_gpu_sampler(engines.gpu_indices or None)
        for reason in skipped:
            log.info("GPU metering falls back", extra={"reason": reason})
        return sampler

    async def start(self) -> None:
        try:
            sampler = self._sampler()
        except MeterUnavailableError as exc:
            log.warning("no compute meter: batches get no cost", extra={"reason": str(exc)})
            return
        meter = Meter(sampler, interval_s=INTERVAL_S)
        try:
            cost_log = CostLog.open(cost_log_dir(self._context.config.state_dir))
        except CostLogError as exc:
            sampler.close()
            log.warning("no cost log: batches get no cost", extra={"reason": str(exc)})
            return
        meter.subscribe(METRICS.reading_callback(meter))
        meter.start()
        self._recorder = BatchCostRecorder(meter, cost_log, METRICS)
        self._context.pipeline.set_batch_meter(self._recorder)
        log.info("compute meter running", extra={"method": str(meter.method)})
        metrics = self._context.config.metrics
        if metrics.prover_url:
            timeout = aiohttp.ClientTimeout(total=max(1.0, min(30.0, metrics.vca_interval_s)))
            self._session = aiohttp.ClientSession(timeout=timeout)
            client = PrometheusClient(metrics.prover_url, self._session)
            self.vca = VcaGauge(self._recorder.between, client, metrics, METRICS)
            self._vca_task = asyncio.create_task(self.vca.run(), name="vca-gauge")

    async def vca_figure(self) -> VcaFigure | None:
        """GetStats' VCA: the gauge's latest figure (None without a prover to read)."""
        return None if self.vca is None else self.vca.figure()

    async def stop(self) -> None:
        if self._vca_task is not None:
            self._vca_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._vca_task
            self._vca_task = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._recorder is not None:
            self._recorder.close()
            self._recorder = None


def create(context: DaemonContext) -> ComputeMeterService:
    return ComputeMeterService(context)

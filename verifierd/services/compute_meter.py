"""The compute meter as one of the daemon's services: what each engine batch cost.

engines.device "cuda": NVML GPM on engines.gpu_indices at 10 Hz (NVML utilisation on GPUs
without GPM). "cpu": CPU-seconds of the engine processes, i.e. the process trees of the
daemon's children, each followed from within a second of its start. The service plugs a
`BatchCostRecorder` into the pipeline: for every engine batch the pipeline gets a ComputeCost
(which it shares out onto the batch's verdicts by tokens), the cost log (STATE_DIR/costs) gets a
BatchCost for `verifierd vca`, and METRICS gets the activity. When the meter cannot work (a
CUDA host without NVML) or the cost log cannot open, the service says why in the log and the
daemon runs without costs.
"""

from __future__ import annotations

import logging
import os
import threading

from veritap.v1 import verifier_pb2

from verifierd.cost_log import BatchCost, CostLog, CostLogError, cost_log_dir
from verifierd.daemon import DaemonContext
from verifierd.meter.cpu import CpuSampler
from verifierd.meter.errors import MeterUnavailableError
from verifierd.meter.readings import Method
from verifierd.meter.sampling import Meter, Sampler
from verifierd.meter.selection import open_gpu_sampler
from verifierd.metrics import METRICS, VerifierMetrics
from verifierd.pipeline import EngineBatch

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
        self._metrics.batch_records.labels(**labels).observe(batch.records)
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

    def close(self) -> None:
        """Stop the meter and close the cost log; later batches get no cost."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._meter.stop()
            self._log.close()


class ComputeMeterService:
    name = "compute-meter"

    def __init__(self, context: DaemonContext) -> None:
        self._context = context
        self._recorder: BatchCostRecorder | None = None

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

    async def stop(self) -> None:
        if self._recorder is not None:
            self._recorder.close()
            self._recorder = None


def create(context: DaemonContext) -> ComputeMeterService:
    return ComputeMeterService(context)

"""GPU activity from NVML GPM (Hopper and newer): tensor, SM and DRAM-bandwidth utilisation.

GPM works on pairs of samples: nvmlGpmSampleGet() reads the GPU's performance counters into a
buffer, and nvmlGpmMetricsGet() turns two buffers into metrics averaged over the time between
them. NVML wants those two samples more than 100 ms apart (its counters refresh internally at
that rate), so the sampler keeps two buffers per GPU, alternates between them, and refuses to
compute metrics over a shorter gap (`MIN_GAP_NS`: 99 ms, one millisecond of slack so that a
10 Hz schedule's jitter does not drop every other interval).

The metrics read are NVML_GPM_METRIC_ANY_TENSOR_UTIL (the reading's `activity`: the same
quantity as DCGM's DCGM_FI_PROF_PIPE_TENSOR_ACTIVE), NVML_GPM_METRIC_SM_UTIL and
NVML_GPM_METRIC_DRAM_BW_UTIL, each 0..100 % from NVML and stored as a 0..1 fraction.

All pynvml calls sit behind `GpmApi`; `PynvmlGpmApi` is the real one, `RecordingGpmApi` records
what a real one answered, `ReplayGpmApi` plays a recording back (see nvml_recording).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pynvml

from verifierd.meter.errors import MeterUnavailableError, NvmlCallError
from verifierd.meter.nvml_library import (
    NVML_ERROR_NOT_SUPPORTED,
    NVML_SUCCESS,
    device_count,
    device_handle,
    nvml_call,
    nvml_close,
    nvml_open,
)
from verifierd.meter.nvml_recording import (
    CallRecorder,
    CallScript,
    JsonValue,
    expect_bool,
    expect_int,
    expect_list,
    expect_number,
)
from verifierd.meter.per_gpu import PerGpuSampler
from verifierd.meter.readings import Method, Reading, gpu_target

log = logging.getLogger(__name__)

TENSOR_UTIL = int(pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL)
SM_UTIL = int(pynvml.NVML_GPM_METRIC_SM_UTIL)
DRAM_BW_UTIL = int(pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL)
METRIC_IDS: tuple[int, ...] = (TENSOR_UTIL, SM_UTIL, DRAM_BW_UTIL)

MIN_GAP_NS = 99_000_000
SLOTS = 2


@dataclass(frozen=True, slots=True)
class GpmMetricResult:
    """One entry of nvmlGpmMetricsGet_t.metrics after the call."""

    metric_id: int
    nvml_return: int
    value: float


class GpmApi(Protocol):
    """The NVML GPM calls the sampler needs, with sample buffers named by (gpu, slot)."""

    def device_count(self) -> int: ...

    def is_supported(self, gpu: int) -> bool:
        """nvmlGpmQueryDeviceSupport(handle).isSupportedDevice."""
        ...

    def take_sample(self, gpu: int, slot: int) -> int:
        """nvmlGpmSampleGet into buffer `slot` of `gpu`; the wall-clock ns it was taken at."""
        ...

    def metrics(
        self, gpu: int, earlier: int, later: int, metric_ids: Sequence[int]
    ) -> tuple[GpmMetricResult, ...]:
        """nvmlGpmMetricsGet over buffers `earlier` then `later` of `gpu`."""
        ...

    def close(self) -> None: ...


class PynvmlGpmApi:
    """The real GpmApi, through pynvml. Raises MeterUnavailableError when NVML cannot load."""

    def __init__(self) -> None:
        nvml_open()
        self._handles: dict[int, Any] = {}
        self._buffers: dict[tuple[int, int], Any] = {}
        self._closed = False

    def _handle(self, gpu: int) -> Any:
        if gpu not in self._handles:
            self._handles[gpu] = device_handle(gpu)
        return self._handles[gpu]

    def device_count(self) -> int:
        return device_count()

    def is_supported(self, gpu: int) -> bool:
        try:
            support = nvml_call(pynvml.nvmlGpmQueryDeviceSupport, self._handle(gpu))
        except NvmlCallError as exc:
            if exc.code == NVML_ERROR_NOT_SUPPORTED:
                return False
            raise
        return bool(support.isSupportedDevice)

    def take_sample(self, gpu: int, slot: int) -> int:
        key = (gpu, slot)
        if key not in self._buffers:
            self._buffers[key] = nvml_call(pynvml.nvmlGpmSampleAlloc)
        before = time.time_ns()
        nvml_call(pynvml.nvmlGpmSampleGet, self._handle(gpu), self._buffers[key])
        return (before + time.time_ns()) // 2

    def metrics(
        self, gpu: int, earlier: int, later: int, metric_ids: Sequence[int]
    ) -> tuple[GpmMetricResult, ...]:
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(metric_ids)
        request.sample1 = self._buffers[(gpu, earlier)]
        request.sample2 = self._buffers[(gpu, later)]
        for i, metric_id in enumerate(metric_ids):
            request.metrics[i].metricId = metric_id
        nvml_call(pynvml.nvmlGpmMetricsGet, request)
        return tuple(
            GpmMetricResult(
                int(request.metrics[i].metricId),
                int(request.metrics[i].nvmlReturn),
                float(request.metrics[i].value),
            )
            for i in range(len(metric_ids))
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for buffer in self._buffers.values():
            try:
                nvml_call(pynvml.nvmlGpmSampleFree, buffer)
            except NvmlCallError:
                log.warning("nvmlGpmSampleFree failed", exc_info=True)
        self._buffers.clear()
        nvml_close()


def _encode_results(results: tuple[GpmMetricResult, ...]) -> JsonValue:
    return [[r.metric_id, r.nvml_return, r.value] for r in results]


def _encode_int(value: int) -> JsonValue:
    return value


def _encode_bool(value: bool) -> JsonValue:
    return value


class RecordingGpmApi:
    """Wraps a GpmApi and records every call and answer into `recorder`."""

    def __init__(self, inner: GpmApi, recorder: CallRecorder) -> None:
        self._inner = inner
        self._recorder = recorder

    def device_count(self) -> int:
        return self._recorder.call("device_count", {}, self._inner.device_count, _encode_int)

    def is_supported(self, gpu: int) -> bool:
        return self._recorder.call(
            "is_supported", {"gpu": gpu}, lambda: self._inner.is_supported(gpu), _encode_bool
        )

    def take_sample(self, gpu: int, slot: int) -> int:
        return self._recorder.call(
            "take_sample",
            {"gpu": gpu, "slot": slot},
            lambda: self._inner.take_sample(gpu, slot),
            _encode_int,
        )

    def metrics(
        self, gpu: int, earlier: int, later: int, metric_ids: Sequence[int]
    ) -> tuple[GpmMetricResult, ...]:
        args: dict[str, int | str] = {
            "gpu": gpu,
            "earlier": earlier,
            "later": later,
            "metric_ids": ",".join(str(m) for m in metric_ids),
        }
        return self._recorder.call(
            "metrics",
            args,
            lambda: self._inner.metrics(gpu, earlier, later, metric_ids),
            _encode_results,
        )

    def close(self) -> None:
        self._inner.close()


class ReplayGpmApi:
    """A GpmApi that answers from a recording (no NVML, no GPU)."""

    def __init__(self, script: CallScript) -> None:
        self._script = script
        self.closed = False

    def device_count(self) -> int:
        return expect_int(self._script.expect("device_count", {}), "device_count")

    def is_supported(self, gpu: int) -> bool:
        return expect_bool(self._script.expect("is_supported", {"gpu": gpu}), "is_supported")

    def take_sample(self, gpu: int, slot: int) -> int:
        result = self._script.expect("take_sample", {"gpu": gpu, "slot": slot})
        return expect_int(result, "take_sample")

    def metrics(
        self, gpu: int, earlier: int, later: int, metric_ids: Sequence[int]
    ) -> tuple[GpmMetricResult, ...]:
        args: dict[str, int | str] = {
            "gpu": gpu,
            "earlier": earlier,
            "later": later,
            "metric_ids": ",".join(str(m) for m in metric_ids),
        }
        rows = expect_list(self._script.expect("metrics", args), "metrics")
        out: list[GpmMetricResult] = []
        for row in rows:
            fields = expect_list(row, "metrics row")
            if len(fields) != 3:
                raise NvmlCallError(NVML_ERROR_NOT_SUPPORTED, f"bad recorded row {row!r}")
            out.append(
                GpmMetricResult(
                    expect_int(fields[0], "metric id"),
                    expect_int(fields[1], "nvml return"),
                    expect_number(fields[2], "metric value"),
                )
            )
        return tuple(out)

    def close(self) -> None:
        self.closed = True


@dataclass(slots=True)
class _GpuState:
    """The sampler's memory of one GPU: which buffer holds the previous sample, and when."""

    prev_slot: int = SLOTS - 1
    prev_t_ns: int | None = None

    @property
    def next_slot(self) -> int:
        return (self.prev_slot + 1) % SLOTS


def _fraction(result: GpmMetricResult) -> float | None:
    if result.nvml_return != NVML_SUCCESS or not math.isfinite(result.value):
        return None
    return min(1.0, max(0.0, result.value / 100.0))


class GpmSampler(PerGpuSampler):
    """Sampler over NVML GPM; each read() yields one Reading per GPU (after the first)."""

    def __init__(self, api: GpmApi, gpus: Sequence[int] | None = None) -> None:
        super().__init__(api.device_count(), gpus)
        unsupported = [g for g in self.gpus if not api.is_supported(g)]
        if unsupported:
            raise MeterUnavailableError(f"GPM not supported on GPU(s) {unsupported}")
        self._api = api
        self._state = {gpu: _GpuState() for gpu in self.gpus}
        self._missing_warned: set[tuple[int, int]] = set()

    @property
    def method(self) -> Method:
        return Method.NVML_GPM

    @property
    def min_interval_s(self) -> float:
        return 0.1

    def read(self) -> list[Reading]:
        out: list[Reading] = []
        for gpu in self._gpus:
            reading = self._read_gpu(gpu, self._state[gpu])
            if reading is not None:
                out.append(reading)
        return out

    def _read_gpu(self, gpu: int, state: _GpuState) -> Reading | None:
        slot = state.next_slot
        try:
            t_ns = self._api.take_sample(gpu, slot)
        except NvmlCallError as exc:
            log.warning("GPM sample failed", extra={"gpu": gpu, "nvml_return": exc.code})
            state.prev_t_ns = None
            return None
        prev_t = state.prev_t_ns
        if prev_t is None or t_ns < prev_t:
            state.prev_slot, state.prev_t_ns = slot, t_ns
            return None
        if t_ns - prev_t < MIN_GAP_NS:
            # Too close for GPM: keep the earlier sample; this buffer is overwritten next time.
            return None
        earlier = state.prev_slot
        state.prev_slot, state.prev_t_ns = slot, t_ns
        try:
            results = self._api.metrics(gpu, earlier, slot, METRIC_IDS)
        except NvmlCallError as exc:
            log.warning("GPM metrics failed", extra={"gpu": gpu, "nvml_return": exc.code})
            return None
        values: dict[int, float | None] = {}
        for result in results:
            values[result.metric_id] = _fraction(result)
            if (
                values[result.metric_id] is None
                and (gpu, result.metric_id) not in self._missing_warned
            ):
                self._missing_warned.add((gpu, result.metric_id))
                log.warning(
                    "GPM metric not available",
                    extra={
                        "gpu": gpu,
                        "metric_id": result.metric_id,
                        "nvml_return": result.nvml_return,
                    },
                )
        return Reading(
            target=gpu_target(gpu),
            start_ns=prev_t,
            end_ns=t_ns,
            activity=values.get(TENSOR_UTIL),
            sm=values.get(SM_UTIL),
            dram=values.get(DRAM_BW_UTIL),
        )

    def close(self) -> None:
        self._api.close()

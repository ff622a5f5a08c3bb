"""GPU activity from nvmlDeviceGetUtilizationRates, for GPUs without GPM (before Hopper).

NVML's "gpu" utilisation is the percentage of time over its last sample period (1/6 s to 1 s
depending on the product) during which at least one kernel was running; "memory" is the
percentage of that time device memory was read or written. Both are coarser than GPM: a kernel
that keeps a single SM busy counts as 100 %, so this method overstates the work of small
kernels (decode) against large ones (prefill) and is *not* comparable with tensor-pipe activity.
Each value is taken as the mean over the interval since the previous read (the step rule of
integration); when NVML's own period is longer than ours the readings are a smoothed, slightly
late view of the same activity, which long windows integrate correctly.

Readings carry gpu utilisation as `activity` and memory utilisation as `dram`; no `sm`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pynvml

from verifierd.meter.errors import MeterUnavailableError, NvmlCallError
from verifierd.meter.nvml_library import (
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
    expect_int,
    expect_list,
    expect_number,
)
from verifierd.meter.per_gpu import PerGpuSampler
from verifierd.meter.readings import Method, Reading, gpu_target

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Utilization:
    """One nvmlDeviceGetUtilizationRates answer and the wall-clock ns it was read at."""

    t_ns: int
    gpu_percent: float
    memory_percent: float


class UtilizationApi(Protocol):
    def device_count(self) -> int: ...

    def utilization(self, gpu: int) -> Utilization: ...

    def close(self) -> None: ...


class PynvmlUtilizationApi:
    """The real UtilizationApi, through pynvml. Raises MeterUnavailableError without NVML."""

    def __init__(self) -> None:
        nvml_open()
        self._handles: dict[int, Any] = {}
        self._closed = False

    def device_count(self) -> int:
        return device_count()

    def utilization(self, gpu: int) -> Utilization:
        if gpu not in self._handles:
            self._handles[gpu] = device_handle(gpu)
        rates = nvml_call(pynvml.nvmlDeviceGetUtilizationRates, self._handles[gpu])
        return Utilization(time.time_ns(), float(rates.gpu), float(rates.memory))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            nvml_close()


def _encode_utilization(value: Utilization) -> JsonValue:
    return [value.t_ns, value.gpu_percent, value.memory_percent]


def _encode_int(value: int) -> JsonValue:
    return value


class RecordingUtilizationApi:
    """Wraps a UtilizationApi and records every call and answer into `recorder`."""

    def __init__(self, inner: UtilizationApi, recorder: CallRecorder) -> None:
        self._inner = inner
        self._recorder = recorder

    def device_count(self) -> int:
        return self._recorder.call("device_count", {}, self._inner.device_count, _encode_int)

    def utilization(self, gpu: int) -> Utilization:
        return self._recorder.call(
            "utilization", {"gpu": gpu}, lambda: self._inner.utilization(gpu), _encode_utilization
        )

    def close(self) -> None:
        self._inner.close()


class ReplayUtilizationApi:
    """A UtilizationApi that answers from a recording."""

    def __init__(self, script: CallScript) -> None:
        self._script = script
        self.closed = False

    def device_count(self) -> int:
        return expect_int(self._script.expect("device_count", {}), "device_count")

    def utilization(self, gpu: int) -> Utilization:
        fields = expect_list(self._script.expect("utilization", {"gpu": gpu}), "utilization")
        if len(fields) != 3:
            raise MeterUnavailableError(f"bad recorded utilization {fields!r}")
        return Utilization(
            expect_int(fields[0], "t_ns"),
            expect_number(fields[1], "gpu percent"),
            expect_number(fields[2], "memory percent"),
        )

    def close(self) -> None:
        self.closed = True


def _fraction(percent: float) -> float:
    return min(1.0, max(0.0, percent / 100.0))


class UtilizationSampler(PerGpuSampler):
    """Sampler over nvmlDeviceGetUtilizationRates: a Reading per GPU per read() after the first."""

    def __init__(self, api: UtilizationApi, gpus: Sequence[int] | None = None) -> None:
        super().__init__(api.device_count(), gpus)
        self._api = api
        self._prev: dict[int, int] = {}

    @property
    def method(self) -> Method:
        return Method.NVML_UTILIZATION

    @property
    def min_interval_s(self) -> float:
        return 0.05

    def read(self) -> list[Reading]:
        out: list[Reading] = []
        for gpu in self._gpus:
            try:
                now = self._api.utilization(gpu)
            except NvmlCallError as exc:
                log.warning("utilization read failed", extra={"gpu": gpu, "nvml_return": exc.code})
                self._prev.pop(gpu, None)
                continue
            prev = self._prev.get(gpu)
            self._prev[gpu] = now.t_ns
            if prev is None or now.t_ns <= prev:
                continue
            out.append(
                Reading(
                    target=gpu_target(gpu),
                    start_ns=prev,
                    end_ns=now.t_ns,
                    activity=_fraction(now.gpu_percent),
                    dram=_fraction(now.memory_percent),
                )
            )
        return out

    def close(self) -> None:
        self._api.close()

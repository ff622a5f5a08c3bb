"""Choosing how to meter: NVML GPM where the GPUs have it, NVML utilisation on older GPUs,
CPU-seconds where there is no NVML at all."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from verifierd.meter.cpu import CpuSampler
from verifierd.meter.errors import MeterUnavailableError
from verifierd.meter.nvml_gpm import GpmSampler, PynvmlGpmApi
from verifierd.meter.nvml_utilization import PynvmlUtilizationApi, UtilizationSampler
from verifierd.meter.readings import Method
from verifierd.meter.sampling import Sampler

log = logging.getLogger(__name__)

AUTO = "auto"
CHOICES: tuple[str, ...] = (AUTO, *(m.value for m in Method))


@dataclass(frozen=True, slots=True)
class MeterSettings:
    """Which sampler to open.

    `method`: "auto" (GPM, else utilisation, else CPU-seconds), or one method by name, which is
    then required. `gpus`: the NVML indices to sample (None: all).
    """

    method: str = AUTO
    gpus: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.method not in CHOICES:
            raise ValueError(f"meter method must be one of {', '.join(CHOICES)}: {self.method!r}")


def _gpm(gpus: Sequence[int] | None) -> Sampler:
    api = PynvmlGpmApi()
    try:
        return GpmSampler(api, gpus)
    except Exception:
        api.close()
        raise


def _utilization(gpus: Sequence[int] | None) -> Sampler:
    api = PynvmlUtilizationApi()
    try:
        return UtilizationSampler(api, gpus)
    except Exception:
        api.close()
        raise


def open_gpu_sampler(gpus: Sequence[int] | None) -> tuple[Sampler, tuple[str, ...]]:
    """NVML GPM on `gpus` (None: all), else NVML utilisation, and why GPM was passed over.

    Raises MeterUnavailableError, naming both reasons, when neither works.
    """
    skipped: list[str] = []
    for method, opener in ((Method.NVML_GPM, _gpm), (Method.NVML_UTILIZATION, _utilization)):
        try:
            return opener(gpus), tuple(skipped)
        except MeterUnavailableError as exc:
            skipped.append(f"{method}: {exc}")
            log.info("meter method unavailable", extra={"method": str(method), "reason": str(exc)})
    raise MeterUnavailableError("; ".join(skipped))


def open_sampler(settings: MeterSettings) -> tuple[Sampler, tuple[str, ...]]:
    """The sampler `settings` ask for and, for "auto", why each better method was passed over.

    Raises MeterUnavailableError when a method named explicitly cannot work here.
    """
    if settings.method == Method.NVML_GPM:
        return _gpm(settings.gpus), ()
    if settings.method == Method.NVML_UTILIZATION:
        return _utilization(settings.gpus), ()
    if settings.method == Method.CPU_SECONDS:
        return CpuSampler(), ()
    try:
        return open_gpu_sampler(settings.gpus)
    except MeterUnavailableError as exc:
        return CpuSampler(), tuple(str(exc).split("; "))

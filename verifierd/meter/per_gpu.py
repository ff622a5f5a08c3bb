"""What the NVML samplers share: the GPUs they read, checked against what NVML sees, and
one metered target per GPU."""

from __future__ import annotations

from collections.abc import Sequence

from verifierd.meter.errors import MeterUnavailableError
from verifierd.meter.readings import gpu_target


class PerGpuSampler:
    """Base of a sampler that yields one Reading per chosen GPU (all of them by default)."""

    def __init__(self, device_count: int, gpus: Sequence[int] | None) -> None:
        if device_count == 0:
            raise MeterUnavailableError("NVML sees no GPU")
        chosen = tuple(range(device_count)) if gpus is None else tuple(gpus)
        outside = [g for g in chosen if not 0 <= g < device_count]
        if outside:
            raise MeterUnavailableError(f"GPU(s) {outside} not present (NVML sees {device_count})")
        self._gpus = chosen

    @property
    def gpus(self) -> tuple[int, ...]:
        return self._gpus

    def targets(self) -> tuple[str, ...]:
        return tuple(gpu_target(g) for g in self._gpus)

    def targets_for(self, gpus: Sequence[int], pids: Sequence[int]) -> tuple[str, ...]:
        """A batch on `gpus` is metered on those GPUs, whichever processes ran it."""
        return tuple(gpu_target(g) for g in gpus)

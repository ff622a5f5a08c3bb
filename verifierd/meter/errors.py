"""The meter's exceptions."""

from __future__ import annotations

from verifierd.errors import VerifierdError


class MeterError(VerifierdError):
    """Base class of every error raised by verifierd.meter."""


class MeterUnavailableError(MeterError):
    """The requested way of metering does not work on this host (no NVML, no GPM, no GPU)."""


class NvmlCallError(MeterError):
    """An NVML call failed; `code` is the nvmlReturn_t value (e.g. 3 = NOT_SUPPORTED)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"NVML error {code}: {message}")
        self.code = code


class ReplayMismatchError(MeterError):
    """A recorded NVML sequence was asked for a call it did not record next."""

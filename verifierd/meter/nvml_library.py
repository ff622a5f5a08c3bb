"""Loading NVML through pynvml (nvidia-ml-py), with its errors turned into the meter's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import pynvml

from verifierd.meter.errors import MeterUnavailableError, NvmlCallError

T = TypeVar("T")

# nvmlReturn_t values the meter looks at.
NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3


def nvml_call(fn: Callable[..., T], *args: Any) -> T:
    """Call a pynvml function; an NVMLError becomes NvmlCallError(code)."""
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        raise NvmlCallError(int(exc.value), str(exc)) from exc


def nvml_open() -> None:
    """nvmlInit(), or MeterUnavailableError saying why (no library, no driver, no permission).

    pynvml counts init calls: each successful nvml_open() needs one nvml_close().
    """
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise MeterUnavailableError(f"NVML unavailable: {exc}") from exc


def nvml_close() -> None:
    try:
        pynvml.nvmlShutdown()
    except pynvml.NVMLError as exc:
        raise NvmlCallError(int(exc.value), str(exc)) from exc


def device_handle(index: int) -> Any:
    return nvml_call(pynvml.nvmlDeviceGetHandleByIndex, index)


def device_count() -> int:
    return int(nvml_call(pynvml.nvmlDeviceGetCount))

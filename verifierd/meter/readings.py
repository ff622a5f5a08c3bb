"""The values the meter produces: readings of activity over an interval, and window costs.

Activity is a rate: for a GPU, the fraction of time (0..1) a unit was busy (tensor pipes for
NVML GPM, "any kernel running" for NVML utilisation); for a process tree or cgroup, the number
of CPU cores busy (CPU-seconds per second, may exceed 1). Integrated over time it becomes
activity-seconds: GPU-seconds at full activity, or CPU-seconds.

Every reading is an average over its own interval (start_ns, end_ns], because that is what both
NVML GPM (two samples, metrics computed between them) and CPU counters (a difference of two
cumulative readings) give. Times are wall-clock nanoseconds (time.time_ns()) so they compare with
record and batch timestamps and with Prometheus.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Method(enum.StrEnum):
    """How activity was measured. The values are the ComputeCost.method strings."""

    NVML_GPM = "nvml-gpm"
    NVML_UTILIZATION = "nvml-utilization"
    CPU_SECONDS = "cpu-seconds"


def gpu_target(index: int) -> str:
    """The target name of GPU `index` (NVML device index)."""
    return f"gpu{index}"


def pid_target(pid: int) -> str:
    """The target name of the process tree rooted at `pid`."""
    return f"pid{pid}"


def cgroup_target(path: str) -> str:
    """The target name of the cgroup at `path` (a directory under /sys/fs/cgroup)."""
    return f"cgroup:{path}"


@dataclass(frozen=True, slots=True)
class Reading:
    """Mean activity of one target over (start_ns, end_ns].

    `activity` is the primary metric of the method (tensor-pipe activity for GPM, GPU busy for
    utilisation, cores busy for CPU). `sm` and `dram` are the SM and DRAM-bandwidth activity where
    the method has them. A metric the device could not report is None.
    """

    target: str
    start_ns: int
    end_ns: int
    activity: float | None
    sm: float | None = None
    dram: float | None = None

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


@dataclass(frozen=True, slots=True)
class WindowCost:
    """Activity integrated over the window [start_ns, end_ns] on a set of targets.

    `covered_seconds` sums, over the targets, the part of the window that readings cover; it is
    `len(targets) * window` when nothing is missing. The integrals count covered time only.
    """

    method: Method
    start_ns: int
    end_ns: int
    targets: tuple[str, ...]
    activity_seconds: float
    sm_seconds: float | None
    dram_seconds: float | None
    covered_seconds: float

    @property
    def window_seconds(self) -> float:
        return max(0, self.end_ns - self.start_ns) / 1e9

    @property
    def coverage(self) -> float:
        """Fraction of (targets x window) that readings covered, 0..1 (1 for an empty window)."""
        total = self.window_seconds * len(self.targets)
        return 1.0 if total <= 0 else min(1.0, self.covered_seconds / total)

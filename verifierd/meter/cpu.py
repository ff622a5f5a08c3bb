"""CPU-seconds of process trees and cgroups: the meter on hosts without a GPU.

A `CpuCounter` is a cumulative CPU-seconds counter that starts at zero when it is created.
`ProcessTreeCounter` follows a process and its descendants with psutil: it adds up, for every
process it has seen in the tree, the growth of that process's user+system time since it was
first seen (processes already running at creation count only their growth from then on; one
that joins the tree later counts from its start, found at the next refresh of the tree's
membership). A process that exits loses its last unsampled moments, and one that lives and dies
between two samples is not seen at all: fine for long-lived engine and server processes.
Reaped children's times (psutil's children_user/children_system) are not added, since that would
count again what was already sampled from the children themselves. `CgroupCounter` reads the
kernel's exact total for a cgroup (v2 cpu.stat usage_usec, or v1 cpuacct.usage).

`CpuSampler` turns counters into readings: activity = CPU-seconds per second (cores busy).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import psutil

from verifierd.meter.errors import MeterError
from verifierd.meter.readings import Method, Reading, cgroup_target, pid_target

log = logging.getLogger(__name__)

_ProcKey = tuple[int, float]


class ProcessGoneError(MeterError):
    """The root of a watched process tree has exited."""


class CpuCounter(Protocol):
    @property
    def target(self) -> str: ...

    def cpu_seconds(self) -> float:
        """CPU-seconds used since the counter was created; raises ProcessGoneError when it ends."""
        ...


class ProcessTreeCounter:
    """Cumulative CPU-seconds of the tree rooted at `pid`; membership refreshed every
    `refresh_every` reads (walking /proc is the expensive part)."""

    def __init__(self, pid: int, refresh_every: int = 10) -> None:
        try:
            self._root = psutil.Process(pid)
            self._root_key: _ProcKey = (pid, self._root.create_time())
        except psutil.Error as exc:
            raise ProcessGoneError(f"no process {pid}: {exc}") from exc
        self._pid = pid
        self._refresh_every = max(1, refresh_every)
        self._reads = 0
        self._members: dict[_ProcKey, psutil.Process] = {}
        self._last: dict[_ProcKey, float] = {}
        self._total = 0.0
        self._refresh(baseline=True)

    @property
    def target(self) -> str:
        return pid_target(self._pid)

    @property
    def pid(self) -> int:
        return self._pid

    def _refresh(self, baseline: bool) -> None:
        try:
            procs = [self._root, *self._root.children(recursive=True)]
        except psutil.Error as exc:
            raise ProcessGoneError(f"process {self._pid} is gone: {exc}") from exc
        for proc in procs:
            try:
                key = (proc.pid, proc.create_time())
            except psutil.Error:
                continue
            if key in self._members:
                continue
            self._members[key] = proc
            if baseline:
                self._last[key] = _own_cpu(proc) or 0.0
            else:
                self._last[key] = 0.0

    def cpu_seconds(self) -> float:
        if self._reads and self._reads % self._refresh_every == 0:
            self._refresh(baseline=False)
        self._reads += 1
        for key, proc in list(self._members.items()):
            used = _own_cpu(proc)
            if used is None:
                del self._members[key]
                self._last.pop(key, None)
                if key == self._root_key:
                    raise ProcessGoneError(f"process {self._pid} exited")
                continue
            growth = used - self._last[key]
            if growth > 0:
                self._total += growth
                self._last[key] = used
        return self._total


def _own_cpu(proc: psutil.Process) -> float | None:
    try:
        times = proc.cpu_times()
    except psutil.Error:
        return None
    return float(times.user + times.system)


class CgroupCounter:
    """Cumulative CPU-seconds of a cgroup, from the kernel's own accounting."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._read_total = self._reader(path)
        self._base = self._read_total()

    @staticmethod
    def _reader(path: Path) -> Callable[[], float]:
        stat = path / "cpu.stat"
        usage = path / "cpuacct.usage"

        def read_v2() -> float:
            for line in stat.read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == "usage_usec":
                    return int(value) / 1e6
            raise MeterError(f"{stat} has no usage_usec")

        def read_v1() -> float:
            return int(usage.read_text().strip()) / 1e9

        if stat.is_file() and "usage_usec" in stat.read_text():
            return read_v2
        if usage.is_file():
            return read_v1
        raise MeterError(f"{path} is not a cgroup with CPU accounting (no cpu.stat usage_usec)")

    @property
    def target(self) -> str:
        return cgroup_target(str(self._path))

    def cpu_seconds(self) -> float:
        try:
            return self._read_total() - self._base
        except OSError as exc:
            raise ProcessGoneError(f"cgroup {self._path} is gone: {exc}") from exc


class CpuSampler:
    """Sampler over CPU counters. Counters can be added and removed while it runs.

    With `follow_children_of=PID` it also starts following, every `discover_every` reads, the
    tree of each new direct child of PID: verifierd passes its own pid, so every engine process
    it spawns is metered from within a second of its start (long before its first batch).
    """

    def __init__(
        self,
        counters: Sequence[CpuCounter] = (),
        clock: Callable[[], int] = time.time_ns,
        follow_children_of: int | None = None,
        discover_every: int = 10,
    ) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._counters: dict[str, CpuCounter] = {c.target: c for c in counters}
        self._prev: dict[str, tuple[int, float]] = {}
        self._parent = follow_children_of
        self._discover_every = max(1, discover_every)
        self._reads = 0

    @property
    def method(self) -> Method:
        return Method.CPU_SECONDS

    @property
    def min_interval_s(self) -> float:
        return 0.02

    def targets(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._counters)

    def add(self, counter: CpuCounter) -> str:
        with self._lock:
            self._counters.setdefault(counter.target, counter)
        return counter.target

    def watch_pid(self, pid: int) -> str:
        """Start following the process tree rooted at `pid` (no-op when already followed)."""
        target = pid_target(pid)
        with self._lock:
            if target in self._counters:
                return target
        return self.add(ProcessTreeCounter(pid))

    def unwatch(self, target: str) -> None:
        with self._lock:
            self._counters.pop(target, None)
            self._prev.pop(target, None)

    def _discover(self) -> None:
        if self._parent is None:
            return
        try:
            children = psutil.Process(self._parent).children(recursive=False)
        except psutil.Error:
            return
        for child in children:
            with contextlib.suppress(ProcessGoneError):
                self.watch_pid(child.pid)

    def _watched_root(self, pid: int) -> str | None:
        """The followed tree that `pid` belongs to: its own, or its nearest followed ancestor's."""
        try:
            proc = psutil.Process(pid)
            chain = [proc, *proc.parents()]
        except psutil.Error:
            return None
        with self._lock:
            for member in chain:
                if pid_target(member.pid) in self._counters:
                    return pid_target(member.pid)
        return None

    def targets_for(self, gpus: Sequence[int], pids: Sequence[int]) -> tuple[str, ...]:
        """The followed trees holding `pids` (each once); a pid in none is followed from now."""
        out: list[str] = []
        for pid in pids:
            target = self._watched_root(pid) or self.watch_pid(pid)
            if target not in out:
                out.append(target)
        return tuple(out)

    def read(self) -> list[Reading]:
        if self._reads % self._discover_every == 0:
            self._discover()
        self._reads += 1
        with self._lock:
            counters = list(self._counters.values())
        out: list[Reading] = []
        for counter in counters:
            try:
                used = counter.cpu_seconds()
            except ProcessGoneError as exc:
                log.info("stopped following", extra={"target": counter.target, "reason": str(exc)})
                self.unwatch(counter.target)
                continue
            now = self._clock()
            with self._lock:
                prev = self._prev.get(counter.target)
                self._prev[counter.target] = (now, used)
            if prev is None or now <= prev[0]:
                continue
            seconds = (now - prev[0]) / 1e9
            out.append(
                Reading(
                    target=counter.target,
                    start_ns=prev[0],
                    end_ns=now,
                    activity=max(0.0, used - prev[1]) / seconds,
                )
            )
        return out

    def close(self) -> None:
        with self._lock:
            self._counters.clear()
            self._prev.clear()

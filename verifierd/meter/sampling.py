"""The running meter: a thread that samples at a fixed rate into a ring, and answers costs.

A `Sampler` (NVML GPM, NVML utilisation or CPU counters) turns one call of `read()` into the
readings completed since its previous call. `Meter` calls it on a monotonic schedule (default
10 Hz) from a daemon thread, keeps the readings in a bounded `ReadingRing`, and answers
"activity integrated over [t0, t1] on targets S" with `cost()`. Costs are computed by
`integration.integrate_intervals` (the step rule), summed over the targets.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from verifierd.meter.integration import integrate_intervals
from verifierd.meter.readings import Method, Reading, WindowCost
from verifierd.meter.ring import ReadingRing

log = logging.getLogger(__name__)

# One hour of 10 Hz readings per target.
DEFAULT_CAPACITY = 36_000


class Sampler(Protocol):
    """One way of measuring activity; see nvml_gpm, nvml_utilization and cpu."""

    @property
    def method(self) -> Method: ...

    @property
    def min_interval_s(self) -> float:
        """The shortest sampling period this sampler can honour."""
        ...

    def targets(self) -> tuple[str, ...]:
        """The targets currently sampled."""
        ...

    def targets_for(self, gpus: Sequence[int], pids: Sequence[int]) -> tuple[str, ...]:
        """The targets that measure an engine owning `gpus` and running as `pids`.

        GPU samplers answer with the GPUs, the CPU sampler with the process trees (and starts
        watching any it was not watching yet).
        """
        ...

    def read(self) -> list[Reading]:
        """Sample every target once; the readings completed since the previous call."""
        ...

    def close(self) -> None: ...


ReadingCallback = Callable[[Reading], None]


class Meter:
    """Samples `sampler` every `interval_s` seconds in a thread and integrates on demand."""

    def __init__(
        self,
        sampler: Sampler,
        interval_s: float = 0.1,
        capacity: int = DEFAULT_CAPACITY,
    ) -> None:
        if interval_s < sampler.min_interval_s:
            raise ValueError(
                f"interval {interval_s}s is shorter than {sampler.method}'s minimum "
                f"{sampler.min_interval_s}s"
            )
        self._sampler = sampler
        self._interval = interval_s
        self._ring = ReadingRing(capacity)
        self._tick_lock = threading.Lock()
        self._new_readings = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._callbacks: list[ReadingCallback] = []

    @property
    def method(self) -> Method:
        return self._sampler.method

    @property
    def interval_s(self) -> float:
        return self._interval

    @property
    def ring(self) -> ReadingRing:
        return self._ring

    def targets(self) -> tuple[str, ...]:
        return self._sampler.targets()

    def targets_for(self, gpus: Sequence[int] = (), pids: Sequence[int] = ()) -> tuple[str, ...]:
        """The targets to meter an engine that owns `gpus` and runs as `pids` (see Sampler)."""
        return self._sampler.targets_for(gpus, pids)

    def subscribe(self, callback: ReadingCallback) -> None:
        """Call `callback` with every new reading, from the sampling thread."""
        self._callbacks.append(callback)

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("meter already started")
        self._thread = threading.Thread(target=self._run, name=f"meter-{self.method}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling and release the sampler (NVML handles, sample buffers)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10 * self._interval + 5)
            self._thread = None
        self._sampler.close()

    def __enter__(self) -> Meter:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def tick(self) -> list[Reading]:
        """Sample now (the thread calls this; so may a caller that wants a sample at an edge)."""
        with self._tick_lock:
            readings = self._sampler.read()
        for reading in readings:
            if not self._ring.add(reading):
                log.warning("out-of-order reading dropped", extra={"target": reading.target})
                continue
            for callback in self._callbacks:
                try:
                    callback(reading)
                except Exception:
                    log.exception("reading callback failed")
        with self._new_readings:
            self._new_readings.notify_all()
        return readings

    def _run(self) -> None:
        next_tick = time.monotonic()
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:
                log.warning("meter tick failed", extra={"method": str(self.method)}, exc_info=True)
            next_tick += self._interval
            now = time.monotonic()
            next_tick = max(next_tick, now)
            if self._stop.wait(next_tick - now):
                break

    def _caught_up(self, targets: Sequence[str], end_ns: int) -> bool:
        for target in targets:
            latest = self._ring.latest_end(target)
            if latest is None or latest < end_ns:
                return False
        return True

    def cost(
        self,
        start_ns: int,
        end_ns: int,
        targets: Sequence[str],
        wait_s: float | None = None,
    ) -> WindowCost:
        """Activity integrated over [start_ns, end_ns] on `targets`, summed.

        While the meter runs, first waits (at most `wait_s`, default three sampling periods) for
        readings that reach `end_ns`, since the window usually ends just before the call. Parts of
        the window no reading covers are reported through `covered_seconds`.
        """
        if end_ns < start_ns:
            raise ValueError(f"window ends before it starts: [{start_ns}, {end_ns}]")
        if self._thread is not None and targets:
            timeout = 3 * self._interval if wait_s is None else wait_s
            deadline = time.monotonic() + timeout
            with self._new_readings:
                while not self._caught_up(targets, end_ns):
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._new_readings.wait(remaining)
        activity = 0.0
        covered = 0.0
        sm: float | None = None
        dram: float | None = None
        for target in targets:
            readings = self._ring.window(target, start_ns, end_ns)
            main = integrate_intervals(readings, start_ns, end_ns, lambda r: r.activity)
            activity += main.value
            covered += main.covered_seconds
            if any(r.sm is not None for r in readings):
                sm_part = integrate_intervals(readings, start_ns, end_ns, lambda r: r.sm)
                sm = (sm or 0.0) + sm_part.value
            if any(r.dram is not None for r in readings):
                dram_part = integrate_intervals(readings, start_ns, end_ns, lambda r: r.dram)
                dram = (dram or 0.0) + dram_part.value
        return WindowCost(
            method=self.method,
            start_ns=start_ns,
            end_ns=end_ns,
            targets=tuple(targets),
            activity_seconds=activity,
            sm_seconds=sm,
            dram_seconds=dram,
            covered_seconds=covered,
        )

"""The CPU-seconds meter against real processes that burn a known amount of CPU."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from verifierd.meter.cpu import CgroupCounter, CpuSampler, ProcessGoneError, ProcessTreeCounter
from verifierd.meter.errors import MeterError
from verifierd.meter.readings import Method
from verifierd.meter.sampling import Meter

BURN_S = 0.5

# Waits for a line on stdin, then burns BURN_S of CPU in itself and in a child it starts, prints
# "done", and both wait for stdin to close (so both are still there to be measured).
CHILD = f"""
import sys, time
end = time.process_time() + {BURN_S}
while time.process_time() < end:
    pass
print("burnt", flush=True)
sys.stdin.read()
"""
TREE = f"""
import subprocess, sys, time
sys.stdin.readline()
child = subprocess.Popen([sys.executable, "-c", {CHILD!r}], stdout=subprocess.PIPE, text=True)
end = time.process_time() + {BURN_S}
while time.process_time() < end:
    pass
child.stdout.readline()
print("done", flush=True)
sys.stdin.read()
child.wait()
"""


@pytest.fixture
def tree() -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", TREE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    yield proc
    if proc.stdin:
        proc.stdin.close()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def go_and_wait(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "done"


def test_process_tree_counter_counts_parent_and_child(tree: subprocess.Popen[str]) -> None:
    time.sleep(0.3)  # let the interpreter start, so the baseline holds its start-up
    counter = ProcessTreeCounter(tree.pid, refresh_every=1)
    assert counter.cpu_seconds() < 0.1
    go_and_wait(tree)
    used = counter.cpu_seconds()
    # Two burns of BURN_S, plus the child's interpreter start-up; the exited child's last
    # moments may be lost between samples.
    assert 2 * BURN_S * 0.8 <= used <= 2 * BURN_S + 0.6


def test_meter_integrates_the_tree_over_a_window(tree: subprocess.Popen[str]) -> None:
    time.sleep(0.3)
    sampler = CpuSampler()
    with Meter(sampler, interval_s=0.05) as meter:
        targets = meter.targets_for(pids=[tree.pid])
        assert targets == (f"pid{tree.pid}",)
        time.sleep(0.2)
        start = time.time_ns()
        go_and_wait(tree)
        end = time.time_ns()
        cost = meter.cost(start, end, targets)
    assert cost.method is Method.CPU_SECONDS
    assert cost.coverage > 0.9
    assert 2 * BURN_S * 0.8 <= cost.activity_seconds <= 2 * BURN_S + 0.6
    assert cost.sm_seconds is None and cost.dram_seconds is None


def test_a_tree_that_exits_stops_being_followed() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    sampler = CpuSampler()
    target = sampler.watch_pid(proc.pid)
    assert sampler.targets() == (target,)
    proc.wait()
    sampler.read()
    assert sampler.targets() == ()
    with pytest.raises(ProcessGoneError):
        sampler.watch_pid(proc.pid)


def test_cgroup_counters_read_v2_and_v1_accounting(tmp_path: Path) -> None:
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.stat").write_text("usage_usec 1000000\nuser_usec 600000\nsystem_usec 400000\n")
    counter = CgroupCounter(v2)
    (v2 / "cpu.stat").write_text("usage_usec 3500000\nuser_usec 2000000\nsystem_usec 1500000\n")
    assert counter.cpu_seconds() == pytest.approx(2.5)
    assert counter.target == f"cgroup:{v2}"

    v1 = tmp_path / "v1"
    v1.mkdir()
    (v1 / "cpuacct.usage").write_text("5000000000\n")
    counter = CgroupCounter(v1)
    (v1 / "cpuacct.usage").write_text("5250000000\n")
    assert counter.cpu_seconds() == pytest.approx(0.25)

    with pytest.raises(MeterError, match="not a cgroup"):
        CgroupCounter(tmp_path)
    gone = CgroupCounter(v2)
    (v2 / "cpu.stat").unlink()
    with pytest.raises(ProcessGoneError):
        gone.cpu_seconds()

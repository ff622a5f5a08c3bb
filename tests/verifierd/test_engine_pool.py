"""The engine pool: child processes, typed messages, failures, eviction, idle unload.

Most tests run the pool against the stand-in backend (tests/verifierd/engine_doubles.py)
in real child processes; test_real_engine_scores_honest_output runs the vLLM backend.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from veritap.v1 import verifier_pb2

from tests.verifierd.commitment_fixtures import commit, make_model_dir
from tests.verifierd.engine_doubles import FACTORY
from verifierd.commitments import Commitment
from verifierd.config import EnginesConfig
from verifierd.difr import SamplingSettings
from verifierd.engine.backend import ScoreRequest
from verifierd.engine.pool import EngineBatchError, EngineCapacityError, EngineLoadError, EnginePool

SAMPLING = SamplingSettings(temperature=1.0, seed=1)


def request(rid: str, output: tuple[int, ...] = (5, 6, 7)) -> ScoreRequest:
    return ScoreRequest(rid, (1, 2, 3), output, SAMPLING)


@pytest.fixture
def pool() -> Iterator[EnginePool]:
    p = EnginePool(EnginesConfig(backend=FACTORY, cpu_memory_budget_gib=2.5, idle_unload_s=60))
    yield p
    p.close()


@pytest.fixture(scope="module")
def commitments(tmp_path_factory: pytest.TempPathFactory) -> list[Commitment]:
    root = tmp_path_factory.mktemp("models")
    return [
        commit(make_model_dir(root / f"m{i}", seed=i), generation_config="vllm") for i in range(3)
    ]


def test_load_score_and_reject(
    pool: EnginePool, commitments: list[Commitment], tmp_path: Path
) -> None:
    c = commitments[0]
    ref = pool.acquire(c, tmp_path)
    assert (ref.version, ref.logits_width) == ("fake 1.0", 4096)
    assert pool.loaded(c.commitment_id)
    assert pool.acquire(c, tmp_path).pids == ref.pids
    scored = pool.score(
        c.commitment_id, [request("a"), request("b/reject"), request("c", (1, 2000))], "p", 5.0
    )
    assert [r.request_id for r in scored.results] == ["a", "c"]
    assert [r.difr.score for r in scored.results] == [0.0, 0.5]
    assert [(r.request_id, r.reason) for r in scored.rejected] == [
        ("b/reject", "refused by request id")
    ]
    assert scored.start_ns <= scored.end_ns
    [status] = pool.status()
    assert status.state == verifier_pb2.ENGINE_STATE_READY


def test_crash_mid_batch_drops_the_engine(
    pool: EnginePool, commitments: list[Commitment], tmp_path: Path
) -> None:
    c = commitments[0]
    pid = pool.acquire(c, tmp_path).pids[0]
    with pytest.raises(EngineBatchError, match="died"):
        pool.score(c.commitment_id, [request("x/crash")], "p", 5.0)
    assert not pool.loaded(c.commitment_id)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    [status] = pool.status()
    assert status.state == verifier_pb2.ENGINE_STATE_FAILED
    assert pool.acquire(c, tmp_path).pids[0] != pid


def test_failed_batch_unloads(
    pool: EnginePool, commitments: list[Commitment], tmp_path: Path
) -> None:
    c = commitments[0]
    pool.acquire(c, tmp_path)
    with pytest.raises(EngineBatchError, match="failed this batch"):
        pool.score(c.commitment_id, [request("y/fail")], "p", 5.0)
    assert not pool.loaded(c.commitment_id)


def test_load_failure(pool: EnginePool, commitments: list[Commitment], tmp_path: Path) -> None:
    broken = tmp_path / "broken-model"
    with pytest.raises(EngineLoadError, match="cannot load a broken model"):
        pool.acquire(commitments[1], broken)
    assert [s.state for s in pool.status()] == [verifier_pb2.ENGINE_STATE_FAILED]


def test_budget_evicts_least_recently_used(
    pool: EnginePool, commitments: list[Commitment], tmp_path: Path
) -> None:
    a, b, c = commitments
    pool.acquire(a, tmp_path)
    pool.acquire(b, tmp_path)
    pool.score(a.commitment_id, [request("a")], "p", 5.0)
    pool.acquire(c, tmp_path)  # 1 GiB KV each in a 2.5 GiB budget: b (least recent) goes
    assert [pool.loaded(x.commitment_id) for x in commitments] == [True, False, True]
    big = EnginePool(EnginesConfig(backend=FACTORY, cpu_memory_budget_gib=0.5))
    with pytest.raises(EngineCapacityError):
        big.acquire(a, tmp_path)


def test_cpu_budget_counts_the_kv_space_of_every_rank(
    commitments: list[Commitment], tmp_path: Path
) -> None:
    two_ranks = dataclasses.replace(commitments[0], tensor_parallel_size=2)
    p = EnginePool(EnginesConfig(backend=FACTORY, cpu_memory_budget_gib=1.5))
    try:
        p.acquire(commitments[1], tmp_path)  # one rank: 1 GiB of KV fits
        with pytest.raises(EngineCapacityError):
            p.acquire(two_ranks, tmp_path)  # two ranks: 2 GiB cannot fit even alone
    finally:
        p.close()


def test_idle_engines_unload(commitments: list[Commitment], tmp_path: Path) -> None:
    pool = EnginePool(EnginesConfig(backend=FACTORY, idle_unload_s=0.5))
    try:
        pid = pool.acquire(commitments[0], tmp_path).pids[0]
        assert pool.unload_idle() == []
        time.sleep(0.6)
        assert pool.unload_idle() == [commitments[0].commitment_id]
        assert pool.status() == []
        psutil.wait_procs([psutil.Process(pid)] if psutil.pid_exists(pid) else [], timeout=5)
        assert not psutil.pid_exists(pid)
    finally:
        pool.close()


_ORPHAN_PARENT = """
import sys, time
from pathlib import Path
from tests.verifierd.commitment_fixtures import commit, make_model_dir
from tests.verifierd.engine_doubles import FACTORY
from verifierd.config import EnginesConfig
from verifierd.engine.pool import EnginePool

if __name__ == "__main__":
    pool = EnginePool(EnginesConfig(backend=FACTORY))
    c = commit(make_model_dir(Path(sys.argv[1])), generation_config="vllm")
    print(pool.acquire(c, Path(sys.argv[1])).pids[0], flush=True)
    time.sleep(600)
"""


def test_engines_die_with_a_killed_daemon(tmp_path: Path) -> None:
    script = tmp_path / "parent.py"
    script.write_text(_ORPHAN_PARENT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), "protos"])}
    parent = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "m")],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert parent.stdout is not None
        engine_pid = int(parent.stdout.readline())
        engine = psutil.Process(engine_pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        engine.wait(10)
    finally:
        parent.kill()
    assert not psutil.pid_exists(engine_pid)


@pytest.mark.vllm
def test_real_engine_scores_honest_output(tmp_path: Path) -> None:
    from verifierd.engine.backend import EngineBackend, EngineSpec, GenerateRequest
    from verifierd.tiny_model import TinyModelSpec, build_tiny_model

    model = build_tiny_model(tmp_path / "tiny", TinyModelSpec(seed=3))
    c = dataclasses.replace(
        commit(model.path, generation_config="vllm", max_model_len=512),
        sampler_profile="vllm-cpu-splitmix",
    )
    prover = EngineBackend.load(
        EngineSpec(model_dir=model.path, max_model_len=512, max_num_batched_tokens=512)
    )
    try:
        prompt = (5, 17, 300, 42)
        [honest] = prover.generate([GenerateRequest("g", prompt, SAMPLING, 40, ignore_eos=True)])
    finally:
        prover.close()
    pool = EnginePool(EnginesConfig())
    try:
        ref = pool.acquire(c, model.path)
        assert ref.logits_width == model.logits_width
        tampered = (
            *honest.output_token_ids[:-1],
            (honest.output_token_ids[-1] + 1) % model.tokenizer_size,
        )
        scored = pool.score(
            c.commitment_id,
            [
                ScoreRequest("honest", prompt, honest.output_token_ids, SAMPLING),
                ScoreRequest("tampered", prompt, tampered, SAMPLING),
            ],
            "vllm-cpu-splitmix",
            5.0,
        )
    finally:
        pool.close()
    good, bad = scored.results
    assert good.difr.score == 0.0 and good.difr.exact_matches == 40
    assert bad.difr.exact_matches == 39 and bad.difr.score > 0


@pytest.mark.parametrize(
    ("config", "block"),
    [
        (EnginesConfig(backend=FACTORY), 32),
        (EnginesConfig(backend=FACTORY, kv_block_size=64), 64),
        (EnginesConfig(backend=FACTORY, device="cuda", gpu_indices=(0,)), None),
        (EnginesConfig(backend=FACTORY, device="cuda", gpu_indices=(0,), kv_block_size=32), 32),
    ],
)
def test_engines_start_with_the_configured_kv_block_size(
    config: EnginesConfig, block: int | None, commitments: list[Commitment], tmp_path: Path
) -> None:
    """32-token blocks on CPU unless configured (the search's prefix-cache reuse);
    vLLM's own default on CUDA."""
    pool = EnginePool(config)
    try:
        assert pool.spec_for(commitments[0], tmp_path).kv_block_size == block
    finally:
        pool.close()

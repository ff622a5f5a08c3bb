"""The engine pool counts its loads (by outcome, with time to ready) and unloads (by reason)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from veritap.v1 import verifier_pb2

from tests.verifierd.commitment_fixtures import commit, make_model_dir
from tests.verifierd.engine_doubles import FACTORY
from verifierd.config import EnginesConfig
from verifierd.difr import SamplingSettings
from verifierd.engine.backend import ScoreRequest
from verifierd.engine.pool import EngineBatchError, EngineLoadError, EnginePool
from verifierd.metrics import VerifierMetrics


def test_loads_and_unloads_are_counted(tmp_path: Path) -> None:
    a, b, c = (commit(make_model_dir(tmp_path / f"m{i}", seed=i)) for i in range(3))
    metrics = VerifierMetrics()

    def value(name: str, **labels: str) -> float:
        return metrics.registry.get_sample_value(f"veritap_verifier_{name}", labels) or 0.0

    # 1 GiB of KV cache each in a 2.5 GiB budget: two engines fit.
    config = EnginesConfig(backend=FACTORY, cpu_memory_budget_gib=2.5, idle_unload_s=60)
    pool = EnginePool(config, metrics)
    try:
        pool.acquire(a, tmp_path)
        assert value("engine_loads_total", commitment=a.commitment_id, outcome="ok") == 1
        assert value("engine_load_seconds_count", commitment=a.commitment_id) == 1
        assert value("engine_load_seconds_sum", commitment=a.commitment_id) > 0
        pool.acquire(a, tmp_path)  # already loaded: no load
        assert value("engine_loads_total", commitment=a.commitment_id, outcome="ok") == 1

        with pytest.raises(EngineLoadError):
            pool.acquire(b, tmp_path / "broken-model")
        assert value("engine_loads_total", commitment=b.commitment_id, outcome="failed") == 1
        assert value("engine_load_seconds_count", commitment=b.commitment_id) == 0

        pool.acquire(b, tmp_path)
        pool.acquire(c, tmp_path)  # a is the least recently used
        assert value("engine_unloads_total", commitment=a.commitment_id, reason="evicted") == 1

        sampling = SamplingSettings(temperature=1.0, seed=1)
        with pytest.raises(EngineBatchError):
            pool.score(c.commitment_id, [ScoreRequest("x/fail", (1,), (2,), sampling)], "p", 5)
        assert value("engine_unloads_total", commitment=c.commitment_id, reason="failed") == 1

        assert pool.unload_idle(time.time_ns() + 120 * 10**9) == [b.commitment_id]
        assert value("engine_unloads_total", commitment=b.commitment_id, reason="idle") == 1
        pool.acquire(a, tmp_path)
    finally:
        pool.close()
    assert value("engine_unloads_total", commitment=a.commitment_id, reason="shutdown") == 1
    assert value("engine_loads_total", commitment=a.commitment_id, outcome="ok") == 2


def test_a_load_past_its_timeout_is_counted_as_timeout(tmp_path: Path) -> None:
    a = commit(make_model_dir(tmp_path / "m", seed=0))
    metrics = VerifierMetrics()
    config = EnginesConfig(backend=FACTORY, load_timeout_s=1.0)
    pool = EnginePool(config, metrics)
    try:
        with pytest.raises(EngineLoadError, match="after the timeout"):
            pool.acquire(a, tmp_path / "slow-model")
        labels = {"commitment": a.commitment_id, "outcome": "timeout"}
        assert metrics.registry.get_sample_value("veritap_verifier_engine_loads_total", labels) == 1
        assert not pool.loaded(a.commitment_id)
        assert [s.state for s in pool.status()] == [verifier_pb2.ENGINE_STATE_FAILED]
    finally:
        pool.close()

"""The cost log: BatchCost records in their own LMDB, queried by capture time."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from pathlib import Path

import lmdb
import pytest
from hypothesis import given
from hypothesis import strategies as st

from verifierd.cost_log import BatchCost, CostLog, CostLogError, cost_log_dir
from verifierd.meter.readings import Method, WindowCost

S = 1_000_000_000


def batch(n: int, commitment: str = "c1", traffic_end_s: int | None = None) -> BatchCost:
    end = (traffic_end_s if traffic_end_s is not None else 100 + n) * S
    return BatchCost(
        batch_id=f"b{n:04d}",
        commitment_id=commitment,
        method=Method.CPU_SECONDS,
        start_ns=end + S,
        end_ns=end + 3 * S,
        targets=("pid42",),
        activity_seconds=1.5 + n,
        sm_seconds=None,
        dram_seconds=None,
        covered_seconds=2.0,
        records=4,
        prompt_tokens=100,
        completion_tokens=400,
        sample_rate=1.0,
        traffic_start_ns=end - 10 * S,
        traffic_end_ns=end,
    )


batches = st.builds(
    BatchCost,
    batch_id=st.text(min_size=1, max_size=30),
    commitment_id=st.text(max_size=64),
    method=st.sampled_from(list(Method)),
    start_ns=st.integers(0, 2**62),
    end_ns=st.just(2**62),
    targets=st.lists(st.text(max_size=20), max_size=8).map(tuple),
    activity_seconds=st.floats(0, 1e9),
    sm_seconds=st.none() | st.floats(0, 1e9),
    dram_seconds=st.none() | st.floats(0, 1e9),
    covered_seconds=st.floats(0, 1e9),
    records=st.integers(0, 10**6),
    prompt_tokens=st.integers(0, 10**9),
    completion_tokens=st.integers(0, 10**9),
    sample_rate=st.floats(0.001, 1.0),
    traffic_start_ns=st.integers(0, 2**62),
    traffic_end_ns=st.just(2**63),
)


@given(batches)
def test_batch_cost_json_round_trips(cost: BatchCost) -> None:
    assert BatchCost.from_json(cost.to_json()) == cost


@given(st.binary(max_size=200))
def test_garbage_is_a_cost_log_error(raw: bytes) -> None:
    with contextlib.suppress(CostLogError):
        BatchCost.from_json(raw)


def test_bad_values_are_refused() -> None:
    with pytest.raises(ValueError, match="sample_rate"):
        replace(batch(1), sample_rate=0.0)
    with pytest.raises(ValueError, match="ends before"):
        replace(batch(1), traffic_start_ns=batch(1).traffic_end_ns + 1)


def test_append_and_query_by_traffic_time(tmp_path: Path) -> None:
    path = cost_log_dir(tmp_path)
    with CostLog.open(path) as log:
        for n in range(10):
            log.append(batch(n, commitment="c1" if n % 2 else "c2"))
        assert [b.batch_id for b in log.between(103 * S, 106 * S)] == [
            "b0003",
            "b0004",
            "b0005",
            "b0006",
        ]
        assert [b.batch_id for b in log.between(0, 2**63, "c1")] == [
            f"b{n:04d}" for n in range(1, 10, 2)
        ]
        assert log.between(200 * S, 300 * S) == []
        assert log.prune(105 * S) == 5
        assert log.between(0, 2**63)[0].batch_id == "b0005"
        assert log.prune(2**63) == 5
        assert log.prune(2**63) == 0
    with CostLog.open(path, readonly=True) as log:
        assert log.between(0, 2**63) == []
        with pytest.raises(CostLogError, match="read-only"):
            log.append(batch(1))


def test_from_window_carries_the_meter_answer() -> None:
    window = WindowCost(
        method=Method.NVML_GPM,
        start_ns=10 * S,
        end_ns=12 * S,
        targets=("gpu0", "gpu1"),
        activity_seconds=1.25,
        sm_seconds=3.0,
        dram_seconds=0.5,
        covered_seconds=3.6,
    )
    cost = BatchCost.from_window(
        window,
        batch_id="x",
        commitment_id="c",
        records=2,
        prompt_tokens=10,
        completion_tokens=20,
        traffic_start_ns=S,
        traffic_end_ns=2 * S,
        sample_rate=0.5,
    )
    assert (cost.method, cost.targets, cost.activity_seconds) == (
        Method.NVML_GPM,
        ("gpu0", "gpu1"),
        1.25,
    )
    assert cost.coverage == pytest.approx(0.9)
    assert cost.key()[:8] == (2 * S).to_bytes(8, "big")


def test_the_map_grows_when_full(tmp_path: Path) -> None:
    with CostLog.open(tmp_path / "costs", map_size=64 * 1024) as log:
        for n in range(250):
            log.append(batch(n))
        assert len(log.between(0, 2**63)) == 250


def test_missing_or_foreign_logs_are_errors(tmp_path: Path) -> None:
    with pytest.raises(CostLogError, match="no cost log"):
        CostLog.open(tmp_path / "nothing", readonly=True)
    env = lmdb.open(str(tmp_path / "other"), max_dbs=2)
    env.open_db(b"something")
    env.close()
    with pytest.raises(CostLogError, match="holds no cost log"):
        CostLog.open(tmp_path / "other", readonly=True)

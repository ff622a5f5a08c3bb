"""Engine placement: CPU and GPU budgets, LRU eviction of idle engines only."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verifierd.engine.placement import (
    Budget,
    Need,
    Placement,
    Resident,
    cpu_thread_binding,
    plan,
)

CPU = Budget(cpu_gib=8, gpu_indices=())
GPUS = Budget(cpu_gib=float("inf"), gpu_indices=(0, 1, 2, 3, 4, 5, 6, 7))


def cpu(cid: str, gib: float, used: int, busy: bool = False) -> Resident:
    return Resident(cid, (), gib, 0.0, used, busy)


def gpu(cid: str, gpus: tuple[int, ...], used: int, busy: bool = False) -> Resident:
    return Resident(cid, gpus, 0.0, 0.85, used, busy)


def test_cpu_fits_or_evicts_least_recently_used() -> None:
    assert plan(Need(2, 0, 0), [cpu("a", 3, 1)], CPU) == Placement((), ())
    residents = [cpu("a", 3, used=5), cpu("b", 3, used=1), cpu("c", 1, used=3)]
    assert plan(Need(4, 0, 0), residents, CPU) == Placement((), ("b",))
    assert plan(Need(5, 0, 0), residents, CPU) == Placement((), ("b", "c"))
    busy = [cpu("a", 3, 5), cpu("b", 3, 1, busy=True)]
    assert plan(Need(4, 0, 0), busy, CPU) == Placement((), ("a",))
    assert plan(Need(6, 0, 0), busy, CPU) is None
    assert plan(Need(9, 0, 0), [], CPU) is None


def test_gpu_tensor_parallel_placement() -> None:
    residents = [gpu("a", (0, 1, 2, 3), used=1), gpu("b", (4, 5), used=2)]
    assert plan(Need(0, 0.85, 2), residents, GPUS) == Placement((6, 7), ())
    assert plan(Need(0, 0.85, 4), residents, GPUS) == Placement((0, 1, 2, 3), ("a",))
    assert plan(Need(0, 0.85, 8), residents, GPUS) == Placement(tuple(range(8)), ("a", "b"))
    assert plan(Need(0, 0.85, 9), [], GPUS) is None
    small = Need(0, 0.1, 1)
    assert plan(small, residents, GPUS) == Placement((0,), ())


@settings(deadline=None)
@given(
    st.lists(
        st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=4, unique=True), st.booleans()),
        max_size=5,
    ),
    st.integers(1, 4),
    st.sampled_from([0.3, 0.5, 0.85]),
)
def test_a_placement_never_overfills_a_gpu(
    engines: list[tuple[list[int], bool]], tp: int, fraction: float
) -> None:
    budget = Budget(cpu_gib=float("inf"), gpu_indices=(0, 1, 2, 3))
    residents = [
        Resident(f"e{i}", tuple(sorted(g)), 0.0, 0.45, i, busy)
        for i, (g, busy) in enumerate(engines)
    ]
    placement = plan(Need(0, fraction, tp), residents, budget)
    if placement is None:
        return
    assert len(placement.gpus) == tp
    staying = [r for r in residents if r.commitment_id not in placement.evict]
    assert not any(r.busy for r in residents if r.commitment_id in placement.evict)
    for g in placement.gpus:
        assert sum(r.gpu_fraction for r in staying if g in r.gpus) + fraction <= 1 + 1e-9


def test_cpu_binding_left_to_vllm_when_each_rank_has_a_numa_node() -> None:
    assert cpu_thread_binding(1, range(16), numa_nodes=1) is None
    assert cpu_thread_binding(2, range(16), numa_nodes=2) is None


def test_cpu_binding_splits_the_allowed_cpus_between_ranks() -> None:
    assert cpu_thread_binding(2, [0, 1], numa_nodes=1) == "0|1"
    assert cpu_thread_binding(2, [7, 3, 5, 4, 6], numa_nodes=0) == "3,4|5,6"
    assert cpu_thread_binding(4, range(8), numa_nodes=2) == "0,1|2,3|4,5|6,7"


def test_cpu_binding_refuses_more_ranks_than_cpus() -> None:
    with pytest.raises(ValueError, match="at least that many CPUs"):
        cpu_thread_binding(4, [0, 1, 2], numa_nodes=1)


@given(
    tp=st.integers(2, 8),
    cpus=st.sets(st.integers(0, 255), min_size=8, max_size=64),
)
def test_cpu_binding_gives_each_rank_disjoint_equal_groups(tp: int, cpus: set[int]) -> None:
    binding = cpu_thread_binding(tp, sorted(cpus), numa_nodes=1)
    assert binding is not None
    groups = [[int(c) for c in g.split(",")] for g in binding.split("|")]
    assert len(groups) == tp
    assert len({len(g) for g in groups}) == 1
    flat = [c for g in groups for c in g]
    assert len(flat) == len(set(flat)) == len(groups[0]) * tp > len(cpus) - tp
    assert set(flat) <= cpus

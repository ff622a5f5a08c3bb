"""Where an engine fits, and which idle engines must go first — without I/O.

CPU hosts have one budget in GiB for every loaded engine's weights and KV
cache. GPU hosts give each engine ``tensor_parallel_size`` GPUs and take the
engine's memory fraction (vLLM's ``gpu_memory_utilization``) on each of them;
a GPU holds engines while their fractions sum to at most 1. When a new engine
does not fit, idle engines are evicted least recently used first; busy or
loading ones are never evicted. On a CPU host, `cpu_thread_binding` says which
CPUs each tensor-parallel rank of an engine computes on.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

_EPS = 1e-9


@dataclass(frozen=True)
class Resident:
    """An engine that holds memory now."""

    commitment_id: str
    gpus: tuple[int, ...]
    cpu_gib: float
    gpu_fraction: float
    last_used_ns: int
    #: Loading or scoring: cannot be evicted.
    busy: bool


@dataclass(frozen=True)
class Need:
    cpu_gib: float
    gpu_fraction: float
    #: GPUs wanted (tensor-parallel size); 0 on a CPU host.
    gpus: int


@dataclass(frozen=True)
class Budget:
    cpu_gib: float
    #: The GPUs this verifier may use (empty on a CPU host).
    gpu_indices: tuple[int, ...]


@dataclass(frozen=True)
class Placement:
    #: GPUs the new engine gets (empty on a CPU host).
    gpus: tuple[int, ...]
    #: Engines to unload first, in this order.
    evict: tuple[str, ...]


def plan(need: Need, residents: Sequence[Resident], budget: Budget) -> Placement | None:
    """How to fit ``need``; None when it cannot fit even after evicting every idle engine."""
    staying = list(residents)
    evicted: list[str] = []
    idle = sorted((r for r in residents if not r.busy), key=lambda r: r.last_used_ns)
    while True:
        gpus = _fit(need, staying, budget)
        if gpus is not None:
            return Placement(gpus, tuple(evicted))
        if not idle:
            return None
        victim = idle.pop(0)
        staying.remove(victim)
        evicted.append(victim.commitment_id)


def _fit(need: Need, residents: Sequence[Resident], budget: Budget) -> tuple[int, ...] | None:
    if sum(r.cpu_gib for r in residents) + need.cpu_gib > budget.cpu_gib + _EPS:
        return None
    if need.gpus == 0:
        return ()
    free = {g: 1.0 for g in budget.gpu_indices}
    for r in residents:
        for g in r.gpus:
            if g in free:
                free[g] -= r.gpu_fraction
    usable = [g for g in budget.gpu_indices if free[g] + _EPS >= need.gpu_fraction]
    if len(usable) < need.gpus:
        return None
    # Fill the fullest GPUs that still fit first, keeping whole GPUs free for big engines.
    usable.sort(key=lambda g: (free[g], g))
    return tuple(sorted(usable[: need.gpus]))


def cpu_thread_binding(
    tensor_parallel_size: int, cpus: Iterable[int], numa_nodes: int
) -> str | None:
    """``VLLM_CPU_OMP_THREADS_BIND`` for a CPU engine, or None to keep vLLM's own.

    vLLM binds each tensor-parallel rank of a CPU engine to its own NUMA node and
    refuses to start when there are fewer nodes than ranks (a one-socket server,
    a container). Then the CPUs this process may use are split into equal
    contiguous groups, one per rank; CPUs left over by the division stay unused
    so that every rank computes at the same speed.
    """
    if tensor_parallel_size <= 1 or numa_nodes >= tensor_parallel_size:
        return None
    ordered = sorted(set(cpus))
    per_rank = len(ordered) // tensor_parallel_size
    if per_rank == 0:
        raise ValueError(
            f"tensor_parallel_size {tensor_parallel_size} needs at least that many CPUs; "
            f"this process may use {len(ordered)}"
        )
    groups = (
        ordered[rank * per_rank : (rank + 1) * per_rank] for rank in range(tensor_parallel_size)
    )
    return "|".join(",".join(str(c) for c in group) for group in groups)

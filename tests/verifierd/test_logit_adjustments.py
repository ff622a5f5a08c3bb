"""Replaying vLLM's logit adjustments: the occurring-columns plan against dense references.

`dense_reference` restates vLLM 0.32's steps on whole rows (one row per output
position, like one request per row of vLLM's batch); the vllm-marked test runs
vLLM's own ``Sampler.apply_logits_processors`` with its real logits processors.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from verifierd.logit_adjustments import (
    NEUTRAL,
    AdjustmentPlan,
    LogitAdjustmentError,
    LogitAdjustments,
    RepetitionArithmetic,
    repetition_arithmetic,
)

CPU = torch.device("cpu")


def dense_reference(
    z: torch.Tensor,
    adj: LogitAdjustments,
    *,
    prompt: Sequence[int],
    output: Sequence[int],
    stop_ids: Sequence[int],
    bad_words: Sequence[Sequence[int]],
    arithmetic: RepetitionArithmetic = RepetitionArithmetic.RECIPROCAL,
) -> torch.Tensor:
    """vLLM's sampler steps on full rows; row t has output[:t] as its output so far."""
    n, width = z.shape
    x = z.to(torch.float32).clone()
    if adj.allowed_token_ids:
        mask = torch.ones(n, width, dtype=torch.bool)
        mask[:, list(adj.allowed_token_ids)] = False
        x.masked_fill_(mask, -math.inf)
    for t in range(n):
        past = list(output[:t])
        for word in bad_words:
            if len(word) > len(past) + 1:
                continue
            prefix = past[-(len(word) - 1) :] if len(word) > 1 else []
            if prefix == list(word[:-1]):
                x[t, word[-1] : word[-1] + 1] = -math.inf
    for t in range(min(adj.min_tokens, n)):
        x[t, list(stop_ids)] = -math.inf
    if adj.logit_bias:
        rows = torch.arange(n).repeat_interleave(len(adj.logit_bias))
        toks = torch.tensor([i for i, _ in adj.logit_bias] * n)
        x[rows, toks] += torch.tensor([b for _, b in adj.logit_bias] * n, dtype=torch.float32)
    if not adj.has_penalties:
        return x
    out_counts = torch.zeros(n, width + 1, dtype=torch.long)
    padded = torch.full((n, max(len(output), 1)), width, dtype=torch.long)
    for t in range(n):
        padded[t, :t] = torch.tensor(output[:t], dtype=torch.long)
    out_counts.scatter_add_(1, padded, torch.ones_like(padded))
    counts = out_counts[:, :width]
    prompt_mask = torch.zeros(n, width, dtype=torch.bool)
    prompt_mask[:, list(prompt)] = True
    rep = torch.full((n,), adj.repetition_penalty, dtype=torch.float32)
    if arithmetic is RepetitionArithmetic.DIVIDE:
        repeated = prompt_mask | (counts > 0)
        r = rep.unsqueeze(1)
        x = torch.where(repeated, torch.where(x > 0, x / r, x * r), x)
    else:
        penalties = torch.where(prompt_mask | (counts > 0), rep.unsqueeze(1).repeat(1, width), 1.0)
        x *= torch.where(x > 0, 1.0 / penalties, penalties)
    x -= torch.full((n,), adj.frequency_penalty, dtype=torch.float32).unsqueeze(1) * counts
    x -= torch.full((n,), adj.presence_penalty, dtype=torch.float32).unsqueeze(1) * (counts > 0)
    return x


def _apply_in_chunks(plan: AdjustmentPlan, z: torch.Tensor, cuts: Sequence[int]) -> torch.Tensor:
    bounds = [0, *sorted({c for c in cuts if 0 < c < z.shape[0]}), z.shape[0]]
    return torch.cat([plan.apply(z[a:b], a) for a, b in itertools.pairwise(bounds)])


def _logits(n: int, width: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(n, width, generator=gen) * 4
    z[z.abs() < 0.3] = 0.0  # exact zeros: the repetition penalty's "x > 0" edge
    return z


def test_neutral_adjustments_return_the_logits_untouched() -> None:
    z = _logits(4, 30, 0)
    plan = AdjustmentPlan(NEUTRAL, [1, 2], [3, 4, 5, 6], 30, CPU)
    assert plan.apply(z, 0) is z
    assert NEUTRAL.is_neutral and not LogitAdjustments(min_tokens=1).is_neutral


def test_every_step_matches_the_dense_reference() -> None:
    adj = LogitAdjustments.from_request(
        repetition_penalty=1.3,
        frequency_penalty=0.7,
        presence_penalty=-0.4,
        logit_bias={7: 5.0, 3: -250.0},
        allowed_token_ids=[*range(0, 40, 2), 3, 7, 9],
        min_tokens=3,
        stop_token_ids=[9],
        bad_words=["x"],
    )
    assert adj.logit_bias == ((3, -100.0), (7, 5.0))
    prompt, output = [1, 2, 2, 9, 11], [4, 6, 4, 4, 8, 6, 10, 12, 4, 6]
    bad = [[4, 6], [8], [6, 10, 12]]
    z = _logits(len(output), 40, 1)
    plan = AdjustmentPlan(
        adj, prompt, output, 40, CPU, stop_token_ids=[9, 0], bad_words_token_ids=bad
    )
    expected = dense_reference(z, adj, prompt=prompt, output=output, stop_ids=[9, 0], bad_words=bad)
    assert torch.equal(plan.apply(z, 0), expected)
    assert torch.equal(_apply_in_chunks(plan, z, [3, 4, 8]), expected)
    assert torch.isneginf(expected[:3, [0, 9]]).all() and not torch.isneginf(expected[3:, 9]).any()
    assert torch.isneginf(expected[:, 8]).all()  # one-token bad word: every row


def test_division_arithmetic_is_a_different_float_result() -> None:
    adj = LogitAdjustments(repetition_penalty=1.1)
    prompt = list(range(200))
    z = _logits(1, 200, 2).abs() + 0.1
    recip = AdjustmentPlan(adj, prompt, [0], 200, CPU).apply(z, 0)
    division = RepetitionArithmetic.DIVIDE
    divided = AdjustmentPlan(adj, prompt, [0], 200, CPU, arithmetic=division).apply(z, 0)
    assert torch.equal(
        divided,
        dense_reference(
            z, adj, prompt=prompt, output=[0], stop_ids=[], bad_words=[], arithmetic=division
        ),
    )
    assert not torch.equal(recip, divided)  # 1.1 is not a power of two: the roundings differ
    assert torch.allclose(recip, divided)


def test_arithmetic_follows_the_prover_runner() -> None:
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert repetition_arithmetic(cpu, "vllm-cpu-splitmix") is RepetitionArithmetic.RECIPROCAL
    assert repetition_arithmetic(cuda, "vllm-v1-exponential") is RepetitionArithmetic.DIVIDE
    assert repetition_arithmetic(cuda, "vllm-v2-hash") is RepetitionArithmetic.RECIPROCAL


@pytest.mark.parametrize(
    "kwargs",
    [
        {"repetition_penalty": 0.0},
        {"repetition_penalty": math.inf},
        {"frequency_penalty": 2.5},
        {"presence_penalty": -3.0},
        {"min_tokens": -1},
        {"logit_bias": ((5, 1.0), (2, 1.0))},
        {"logit_bias": ((5, 101.0),)},
        {"allowed_token_ids": (-1,)},
        {"bad_words": ("",)},
    ],
)
def test_values_vllm_refuses_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(LogitAdjustmentError):
        LogitAdjustments(**kwargs)  # type: ignore[arg-type]


def test_ids_outside_the_logits_and_bad_rows_are_refused() -> None:
    with pytest.raises(LogitAdjustmentError, match="outside"):
        AdjustmentPlan(LogitAdjustments(logit_bias=((30, 1.0),)), [1], [2], 30, CPU)
    with pytest.raises(LogitAdjustmentError, match="outside"):
        AdjustmentPlan(NEUTRAL, [1], [31], 30, CPU)
    plan = AdjustmentPlan(LogitAdjustments(min_tokens=2), [1], [2, 3], 30, CPU)
    with pytest.raises(LogitAdjustmentError):
        plan.apply(torch.zeros(2, 30), 1)


def test_json_round_trip() -> None:
    adj = LogitAdjustments.from_request(
        repetition_penalty=1.2,
        logit_bias={5: 1.5},
        allowed_token_ids=[1, 5],
        min_tokens=2,
        stop_token_ids=[3, 3, 4],
        bad_words=["a", "b", "a"],
    )
    assert adj.stop_token_ids == (3, 4) and adj.bad_words == ("a", "b")
    assert LogitAdjustments.from_json(adj.to_json()) == adj
    with pytest.raises(LogitAdjustmentError):
        LogitAdjustments.from_json({"repetition_penalty": 1.0})


_VOCAB = 24


@st.composite
def _cases(draw: st.DrawFn) -> tuple[LogitAdjustments, list[int], list[int], list[list[int]]]:
    ids = st.integers(0, _VOCAB - 1)
    prompt = draw(st.lists(ids, min_size=1, max_size=12))
    output = draw(st.lists(ids, min_size=1, max_size=30))
    # The engine's token ids of the request's bad words: present only when it has some.
    bad = draw(st.lists(st.lists(ids, min_size=1, max_size=3), max_size=3))
    adj = LogitAdjustments.from_request(
        repetition_penalty=draw(st.sampled_from([1.0, 0.7, 1.15, 2.0])),
        frequency_penalty=draw(st.sampled_from([0.0, 0.35, -1.1, 2.0])),
        presence_penalty=draw(st.sampled_from([0.0, 0.6, -0.25])),
        logit_bias=draw(st.dictionaries(ids, st.floats(-150, 150, width=32), max_size=4)),
        allowed_token_ids=draw(st.lists(ids, max_size=10)),
        min_tokens=draw(st.integers(0, 8)),
        stop_token_ids=draw(st.lists(ids, max_size=2)),
        bad_words=[f"word{i}" for i in range(len(bad))],
    )
    return adj, prompt, output, bad


@settings(deadline=None, max_examples=150)
@given(_cases(), st.lists(st.integers(1, 29), max_size=4), st.integers(0, 2**16))
def test_plan_matches_dense_reference_on_random_sequences(
    case: tuple[LogitAdjustments, list[int], list[int], list[list[int]]],
    cuts: list[int],
    seed: int,
) -> None:
    adj, prompt, output, bad = case
    stops = sorted({*adj.stop_token_ids, 0})
    z = _logits(len(output), _VOCAB, seed)
    for arithmetic in RepetitionArithmetic:
        plan = AdjustmentPlan(
            adj,
            prompt,
            output,
            _VOCAB,
            CPU,
            stop_token_ids=stops,
            bad_words_token_ids=bad,
            arithmetic=arithmetic,
        )
        expected = dense_reference(
            z,
            adj,
            prompt=prompt,
            output=output,
            stop_ids=stops,
            bad_words=bad,
            arithmetic=arithmetic,
        )
        # Equal as values (vLLM can turn an untouched -0.0 into +0.0: unobservable).
        assert torch.equal(_apply_in_chunks(plan, z, cuts), expected)


@pytest.mark.vllm
@settings(deadline=None, max_examples=40)
@given(_cases(), st.integers(0, 2**16))
def test_plan_matches_vllm_sampler(
    case: tuple[LogitAdjustments, list[int], list[int], list[list[int]]], seed: int
) -> None:
    """vLLM's own Sampler.apply_logits_processors, one batch row per output position."""
    adj, prompt, output, bad = case
    expected = _vllm_adjusted(_logits(len(output), _VOCAB, seed), adj, prompt, output, bad)
    stops = sorted(_vllm_params(adj, bad).all_stop_token_ids)
    plan = AdjustmentPlan(
        adj, prompt, output, _VOCAB, CPU, stop_token_ids=stops, bad_words_token_ids=bad
    )
    assert torch.equal(plan.apply(_logits(len(output), _VOCAB, seed), 0), expected)


_EOS = 0


def _vllm_params(adj: LogitAdjustments, bad: list[list[int]]) -> object:
    from vllm import SamplingParams

    params = SamplingParams(
        temperature=1.0,
        seed=1,
        repetition_penalty=adj.repetition_penalty,
        frequency_penalty=adj.frequency_penalty,
        presence_penalty=adj.presence_penalty,
        logit_bias=dict(adj.logit_bias) or None,
        allowed_token_ids=list(adj.allowed_token_ids) or None,
        min_tokens=adj.min_tokens,
        stop_token_ids=list(adj.stop_token_ids),
    )
    params.update_from_generation_config({}, _EOS)
    params._bad_words_token_ids = bad
    return params


def _vllm_adjusted(
    z: torch.Tensor,
    adj: LogitAdjustments,
    prompt: list[int],
    output: list[int],
    bad: list[list[int]],
) -> torch.Tensor:
    pytest.importorskip("vllm")
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.logits_processor.builtin import (
        LogitBiasLogitsProcessor,
        MinTokensLogitsProcessor,
    )
    from vllm.v1.sample.logits_processor.interface import BatchUpdate
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.sample.sampler import Sampler

    n, width = z.shape
    params = _vllm_params(adj, bad)
    outputs = [output[:t] for t in range(n)]
    update = BatchUpdate(
        batch_size=n,
        removed=[],
        added=[(t, params, prompt, outputs[t]) for t in range(n)],
        moved=[],
    )
    processors = [
        MinTokensLogitsProcessor(None, CPU, False),  # type: ignore[arg-type]
        LogitBiasLogitsProcessor(None, CPU, False),
    ]
    for p in processors:
        p.update_state(update)
    allowed_mask = None
    if adj.allowed_token_ids:
        allowed_mask = torch.ones(n, width, dtype=torch.bool)
        allowed_mask[:, list(adj.allowed_token_ids)] = False
    metadata = SamplingMetadata(
        temperature=torch.ones(n),
        all_greedy=False,
        all_random=True,
        top_p=None,
        top_k=None,
        generators={},
        max_num_logprobs=None,
        no_penalties=not adj.has_penalties,
        prompt_token_ids=torch.tensor([prompt] * n, dtype=torch.long),
        frequency_penalties=torch.full((n,), adj.frequency_penalty, dtype=torch.float32),
        presence_penalties=torch.full((n,), adj.presence_penalty, dtype=torch.float32),
        repetition_penalties=torch.full((n,), adj.repetition_penalty, dtype=torch.float32),
        output_token_ids=outputs,
        allowed_token_ids_mask=allowed_mask,
        bad_words_token_ids={t: bad for t in range(n)} if bad else {},
        logitsprocs=LogitsProcessors(processors),
    )
    out: torch.Tensor = Sampler().apply_logits_processors(z.clone(), metadata, False)
    return out

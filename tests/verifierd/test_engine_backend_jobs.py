"""The worker-side scoring job, without an engine: chunked prefill, gaps, tensor-parallel ranks.

``compute_logits`` is a plain linear map here (the interface the engine's lm_head
has); the engine-backed behaviour is tested in test_engine_backend.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from verifierd.difr import SamplingSettings, score_margins
from verifierd.engine.scoring_job import JobOutcome, JobSpec, ScoringJob, ScoringJobError
from verifierd.logit_adjustments import AdjustmentPlan, LogitAdjustments
from verifierd.samplers import get_profile

WIDTH, HIDDEN = 97, 16
CPU = torch.device("cpu")
LM_HEAD = torch.randn(WIDTH, HIDDEN, generator=torch.Generator().manual_seed(0))


def _logits(h: torch.Tensor) -> torch.Tensor:
    """Row by row, so a row's logits do not depend on which rows share the call."""
    return torch.stack([LM_HEAD @ row for row in h]) if len(h) else h.new_zeros(0, WIDTH)


def _case(prompt_len: int, n_out: int, seed: int) -> tuple[torch.Tensor, list[int]]:
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(prompt_len + n_out, HIDDEN, generator=gen)
    tokens = torch.randint(0, WIDTH, (prompt_len + n_out,), generator=gen).tolist()
    return hidden, tokens


def _feed_in_chunks(
    job: ScoringJob, hidden: torch.Tensor, tokens: list[int], cuts: list[int]
) -> None:
    """Prefill chunks of the sizes in `cuts` (then the rest), in order, until the job is done."""
    pos = 0
    for step in [*cuts, len(tokens)]:
        if pos >= len(tokens) or job.done:
            break
        job.feed(pos, hidden[pos : pos + step], tokens, _logits)
        pos += step


def _spec(prompt_len: int, n_out: int, s: SamplingSettings, rows: int = 3) -> JobSpec:
    return JobSpec("j", prompt_len, n_out, s, "vllm-v1-exponential-fp64", rows)


@settings(max_examples=30, deadline=None)
@given(
    st.integers(1, 12),
    st.integers(0, 20),
    st.lists(st.integers(1, 9), min_size=1, max_size=40),
    st.sampled_from([SamplingSettings(0.0), SamplingSettings(0.8, top_p=0.9, seed=4)]),
)
def test_chunked_feeding_equals_whole_response_scoring(
    prompt_len: int, n_out: int, cuts: list[int], s: SamplingSettings
) -> None:
    hidden, tokens = _case(prompt_len, n_out, prompt_len * 100 + n_out)
    job = ScoringJob(_spec(prompt_len, n_out, s), WIDTH, CPU)
    _feed_in_chunks(job, hidden, tokens, cuts)
    assert job.done and not job.error
    got = JobOutcome.from_tuple(list(job.outcome().to_tuple())).margins()
    rows = _logits(hidden[prompt_len - 1 : prompt_len - 1 + n_out])
    expected = score_margins(
        rows,
        tokens[prompt_len:],
        s,
        get_profile("vllm-v1-exponential-fp64"),
        prompt_len=prompt_len,
        delta_max=1e9,
    )
    assert np.array_equal(np.minimum(got, 1e9), expected.margins)


def test_a_gap_in_the_scored_positions_is_reported() -> None:
    hidden, tokens = _case(5, 10, 1)
    job = ScoringJob(_spec(5, 10, SamplingSettings(0.0)), WIDTH, CPU)
    job.feed(0, hidden[:6], tokens, _logits)
    job.feed(9, hidden[9:], tokens, _logits)  # positions 6..8 came from the prefix cache
    assert job.done and "prefix-cache hit" in job.error


def test_ranks_without_logits_make_the_same_calls() -> None:
    hidden, tokens = _case(4, 11, 2)
    calls = {"driver": 0, "other": 0}

    def driver(h: torch.Tensor) -> torch.Tensor:
        calls["driver"] += 1
        return _logits(h)

    def other(h: torch.Tensor) -> None:
        calls["other"] += 1

    bad = SamplingSettings(0.7, seed=1)
    a = ScoringJob(JobSpec("a", 4, 11, bad, "no-such-profile", 2), WIDTH, CPU)
    b = ScoringJob(JobSpec("a", 4, 11, bad, "no-such-profile", 2), WIDTH, CPU)
    for start, stop in ((0, 7), (7, 15)):
        a.feed(start, hidden[start:stop], tokens, driver)
        b.feed(start, hidden[start:stop], tokens, other)
    assert calls["driver"] == calls["other"] == 6  # scoring failed on the driver only
    assert a.done and "unknown sampler profile" in a.error and a.holds_logits
    assert b.done and not b.error and b.holds_logits is False


ADJUSTED = LogitAdjustments.from_request(
    repetition_penalty=1.3,
    frequency_penalty=0.5,
    presence_penalty=0.25,
    logit_bias={3: 4.0, 50: -2.5},
    allowed_token_ids=range(0, WIDTH, 2),
    min_tokens=3,
    stop_token_ids=[4],
    bad_words=["x"],
)
STOPS, BAD_WORDS = (0, 4), ((6,), (8, 10))


@settings(max_examples=20, deadline=None)
@given(
    st.integers(1, 12),
    st.integers(1, 20),
    st.lists(st.integers(1, 9), min_size=1, max_size=40),
    st.sampled_from([SamplingSettings(0.0), SamplingSettings(0.8, top_p=0.9, seed=4)]),
)
def test_chunked_feeding_replays_the_logit_adjustments(
    prompt_len: int, n_out: int, cuts: list[int], s: SamplingSettings
) -> None:
    hidden, tokens = _case(prompt_len, n_out, prompt_len * 100 + n_out)
    spec = JobSpec("j", prompt_len, n_out, s, "vllm-v1-exponential-fp64", 3, ADJUSTED)
    job = ScoringJob(spec, WIDTH, CPU, stop_token_ids=STOPS, bad_words_token_ids=BAD_WORDS)
    _feed_in_chunks(job, hidden, tokens, cuts)
    assert job.done and not job.error
    got = job.outcome().margins()
    raw = _logits(hidden[prompt_len - 1 : prompt_len - 1 + n_out])
    plan = AdjustmentPlan(
        ADJUSTED,
        tokens[:prompt_len],
        tokens[prompt_len:],
        WIDTH,
        CPU,
        stop_token_ids=STOPS,
        bad_words_token_ids=BAD_WORDS,
    )
    profile = get_profile("vllm-v1-exponential-fp64")
    expected = score_margins(
        plan.apply(raw, 0), tokens[prompt_len:], s, profile, prompt_len=prompt_len, delta_max=1e9
    )
    assert np.array_equal(np.minimum(got, 1e9), expected.margins)


def test_greedy_output_under_adjustments_scores_zero_only_with_them() -> None:
    """Greedy "generation" through the fake lm_head, token by token with the
    adjustments applied to each row given the output so far."""
    prompt_len, n_out = 6, 24
    hidden, tokens = _case(prompt_len, n_out, 5)
    tokens = tokens[:prompt_len]
    for t in range(n_out):
        plan = AdjustmentPlan(
            ADJUSTED,
            tokens[:prompt_len],
            [*tokens[prompt_len:], 0],
            WIDTH,
            CPU,
            stop_token_ids=STOPS,
            bad_words_token_ids=BAD_WORDS,
        )
        row = plan.apply(_logits(hidden[prompt_len - 1 + t : prompt_len + t]), t)
        tokens.append(int(row.argmax()))
    margins: dict[str, np.ndarray] = {}
    for name, adjustments in (("with", ADJUSTED), ("without", LogitAdjustments())):
        spec = JobSpec("g", prompt_len, n_out, SamplingSettings(0.0), "greedy", 5, adjustments)
        job = ScoringJob(spec, WIDTH, CPU, stop_token_ids=STOPS, bad_words_token_ids=BAD_WORDS)
        job.feed(0, hidden, tokens, _logits)
        assert job.done and not job.error
        margins[name] = job.outcome().margins()
    assert margins["with"].tolist() == [0.0] * n_out
    assert np.count_nonzero(margins["without"]) > n_out // 4


def test_job_specs_round_trip_through_extra_args() -> None:
    spec = _spec(3, 4, SamplingSettings(0.5, 7, 0.95, 0.01, 2**62))
    assert JobSpec.from_extra(spec.to_extra()) == spec
    adjusted = JobSpec("k", 3, 4, SamplingSettings(0.0), "greedy", 2, ADJUSTED)
    assert JobSpec.from_extra(adjusted.to_extra()) == adjusted
    assert JobSpec.from_extra({"other": 1}) is None
    assert JobSpec.from_extra(None) is None
    with pytest.raises(ScoringJobError):
        JobSpec.from_extra({"veritap_difr_job": {"job_id": "x"}})

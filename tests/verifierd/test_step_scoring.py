"""Rows of several scoring jobs scored together in one engine step (`StepScoring`).

Stacking rows must not change a single value: every job's margins and picks are
compared bit for bit with the same job fed on its own, for every sampler profile.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from verifierd.difr import SamplingSettings
from verifierd.engine import scoring_job
from verifierd.engine.scoring_job import JobSpec, ScoringJob, StepScoring
from verifierd.logit_adjustments import NEUTRAL, LogitAdjustments
from verifierd.samplers import PROFILE_NAMES

WIDTH, HIDDEN = 97, 16
CPU = torch.device("cpu")
LM_HEAD = torch.randn(WIDTH, HIDDEN, generator=torch.Generator().manual_seed(0))
SAMPLED = SamplingSettings(0.8, top_p=0.9)
ADJUSTED = LogitAdjustments.from_request(
    repetition_penalty=1.3, logit_bias={3: 4.0}, min_tokens=2, stop_token_ids=[4]
)


def _logits(h: torch.Tensor) -> torch.Tensor:
    return torch.stack([LM_HEAD @ row for row in h]) if len(h) else h.new_zeros(0, WIDTH)


def _specs(profile: str, chunk_rows: int) -> list[tuple[JobSpec, list[int], torch.Tensor]]:
    """Jobs of one engine call: seeds differ, one has other mask settings, one is
    greedy, one replays adjustments; some score from a later position or look ahead."""
    cases = [
        (SamplingSettings(0.8, top_p=0.9, seed=1), NEUTRAL, 0, False),
        (SamplingSettings(0.8, top_p=0.9, seed=2), NEUTRAL, 3, True),
        (SamplingSettings(0.8, top_p=0.9, seed=3), ADJUSTED, 1, True),
        (SamplingSettings(1.0, top_k=5, seed=4), NEUTRAL, 0, True),
        (SamplingSettings(0.0), NEUTRAL, 2, True),
        (SamplingSettings(0.8, top_p=0.9, seed=5), NEUTRAL, 0, False),
    ]
    out = []
    for i, (sampling, adjustments, score_from, lookahead) in enumerate(cases):
        prompt_len, n_out = 3 + i, 6 + 2 * i
        gen = torch.Generator().manual_seed(i)
        hidden = torch.randn(prompt_len + n_out, HIDDEN, generator=gen)
        tokens = torch.randint(0, WIDTH, (prompt_len + n_out,), generator=gen).tolist()
        spec = JobSpec(
            f"j{i}",
            prompt_len,
            n_out,
            sampling,
            profile,
            chunk_rows,
            adjustments,
            score_from,
            lookahead,
        )
        out.append((spec, tokens, hidden))
    return out


def _job(spec: JobSpec) -> ScoringJob:
    return ScoringJob(spec, WIDTH, CPU, stop_token_ids=[0, 4])


def _feed_together(
    cases: Sequence[tuple[JobSpec, list[int], torch.Tensor]], step_positions: int
) -> list[ScoringJob]:
    """Every job prefilled ``step_positions`` positions per engine step, all jobs of a
    step scored through one `StepScoring`."""
    jobs = [_job(spec) for spec, _, _ in cases]
    pos = 0
    while not all(j.done for j in jobs):
        step = StepScoring()
        for job, (_, tokens, hidden) in zip(jobs, cases, strict=True):
            if pos < len(tokens):
                job.feed(pos, hidden[pos : pos + step_positions], tokens, _logits, step)
        step.flush()
        pos += step_positions
    return jobs


def _count_scoring_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    real = scoring_job.token_scores

    def counted(*args: object) -> object:
        calls[0] += 1
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(scoring_job, "token_scores", counted)
    return calls


@pytest.mark.parametrize("profile", [p for p in PROFILE_NAMES if p != "greedy"])
@settings(max_examples=8, deadline=None)
@given(step_positions=st.integers(1, 30), chunk_rows=st.integers(1, 40))
def test_jobs_scored_together_get_exactly_what_they_get_alone(
    profile: str, step_positions: int, chunk_rows: int
) -> None:
    cases = _specs(profile, chunk_rows)
    together = _feed_together(cases, step_positions)
    for job, (spec, tokens, hidden) in zip(together, cases, strict=True):
        alone = _job(spec)
        alone.feed(0, hidden, tokens, _logits)
        assert job.done and alone.done and not job.error and not alone.error
        a, b = job.outcome(), alone.outcome()
        assert (a.raw_margins, a.raw_best) == (b.raw_margins, b.raw_best), spec.job_id


def test_a_step_scores_the_rows_of_jobs_that_share_settings_in_one_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _count_scoring_calls(monkeypatch)
    cases = _specs("vllm-cpu-splitmix", 256)
    _feed_together(cases, 64)
    # One call each: the four sampled jobs with the same mask (seeds differ), the
    # adjusted one among them; top-k; greedy.
    assert calls[0] == 3


def test_a_group_is_scored_before_it_exceeds_the_rows_per_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _count_scoring_calls(monkeypatch)
    cases = [c for c in _specs("vllm-v2-hash", 16) if c[0].sampling.top_p == 0.9]
    _feed_together(cases, 64)
    rows = sum(s.n_out - s.score_from + s.lookahead for s, _, _ in cases)
    assert calls[0] >= -(-rows // 16)
    assert calls[0] < sum(-(-(s.n_out - s.score_from + s.lookahead) // 16) for s, _, _ in cases)


def test_a_failing_group_fails_each_of_its_jobs_and_no_other(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = scoring_job.token_scores

    def fail_greedy(
        z: torch.Tensor, claimed: torch.Tensor, sampling: SamplingSettings, noise: object
    ) -> object:
        if sampling.is_greedy:
            raise RuntimeError("boom")
        return real(z, claimed, sampling, noise)  # type: ignore[arg-type]

    monkeypatch.setattr(scoring_job, "token_scores", fail_greedy)
    jobs = _feed_together(_specs("vllm-cpu-splitmix", 256), 64)
    failed = [j.spec.job_id for j in jobs if j.error]
    assert failed == ["j4"] and "boom" in jobs[4].error


def test_a_step_computes_the_logits_of_all_its_jobs_rows_in_shared_calls() -> None:
    calls: list[int] = []

    def counted(h: torch.Tensor) -> torch.Tensor:
        calls.append(h.shape[0])
        return _logits(h)

    cases = _specs("vllm-cpu-splitmix", 16)
    jobs = [_job(spec) for spec, _, _ in cases]
    step = StepScoring()
    for job, (_, tokens, hidden) in zip(jobs, cases, strict=True):
        job.feed(0, hidden, tokens, counted, step)
    step.flush()
    rows = sum(s.n_out - s.score_from + s.lookahead for s, _, _ in cases)
    # Each job's rows in spans of at most 16, the spans packed into calls of at most 16.
    assert sum(calls) == rows and max(calls) <= 16
    assert len(calls) < len(cases) and all(j.done and not j.error for j in jobs)


def test_a_job_with_its_own_compute_logits_gets_calls_of_its_own() -> None:
    """A job that records its logprobs wraps the engine's compute_logits: its rows'
    logits come from its own calls, the other jobs' from shared ones."""
    calls: dict[str, list[int]] = {"shared": [], "own": []}

    def counter(name: str) -> scoring_job.ComputeLogits:
        def counted(h: torch.Tensor) -> torch.Tensor:
            calls[name].append(h.shape[0])
            return _logits(h)

        return counted

    shared, own = counter("shared"), counter("own")
    cases = _specs("vllm-cpu-splitmix", 256)
    jobs = [_job(spec) for spec, _, _ in cases]
    step = StepScoring()
    for i, (job, (_, tokens, hidden)) in enumerate(zip(jobs, cases, strict=True)):
        job.feed(0, hidden, tokens, own if i == 2 else shared, step)
    step.flush()
    spec = cases[2][0]
    assert calls["own"] == [spec.n_out - spec.score_from + spec.lookahead]
    assert len(calls["shared"]) == 1
    for job, (spec, tokens, hidden) in zip(jobs, cases, strict=True):
        alone = _job(spec)
        alone.feed(0, hidden, tokens, _logits)
        assert (job.outcome().raw_margins, job.outcome().raw_best) == (
            alone.outcome().raw_margins,
            alone.outcome().raw_best,
        )

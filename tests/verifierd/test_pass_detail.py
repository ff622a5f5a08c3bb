"""A PASS says what it rests on when no output token was scored: a completions ``echo``
with ``max_tokens: 0`` shows only the prompt, so only its stated logprobs were checked and
an operator must not read the PASS as a verified sampler."""

from __future__ import annotations

import numpy as np
from veritap.v1 import record_pb2, verifier_pb2

from verifierd.commitments import DifrSettings
from verifierd.difr import DifrResult
from verifierd.engine.backend import ScoreResult
from verifierd.evidence.logprobs import LogprobsComparison
from verifierd.pipeline import _decide

PASS = verifier_pb2.VERDICT_STATUS_PASS
FAIL = verifier_pb2.VERDICT_STATUS_FAIL
SETTINGS = DifrSettings(threshold=0.05, delta_max=5.0, sample_rate=1.0, logprobs_tolerance=0.01)


def _result(output_margins: list[float], prompt_deviations: list[float]) -> ScoreResult:
    """A choice that scored ``output_margins`` and compared an echoed prompt's values."""
    n = len(prompt_deviations)
    compared = LogprobsComparison(
        tuple(prompt_deviations), ("t",) * n, (-1.0,) * n, (-1.0,) * n, prompt_positions=n
    )
    return ScoreResult(
        request_id="r",
        difr=DifrResult.from_raw_margins(np.array(output_margins, dtype=np.float64), 5.0),
        prefill_ns=0,
        scoring_ns=0,
        logits_ns=0,
        logprobs=compared if n else None,
    )


def _decided(*results: ScoreResult) -> verifier_pb2.Verdict:
    v = verifier_pb2.Verdict()
    _decide(v, results, list(range(len(results))), SETTINGS, record_pb2.ApiView())
    return v


def test_a_prompt_only_pass_says_the_sampler_was_not_verified() -> None:
    v = _decided(_result([], [0.0, 0.002, 0.001]))
    assert (v.status, v.token_count) == (PASS, 0)
    assert v.detail == (
        "no output token was scored: the sampler was not verified, only the stated logprobs "
        "of 3 echoed prompt tokens (largest deviation 0.002, tolerance 0.01)"
    )


def test_every_prompt_only_choice_is_counted() -> None:
    # A list of prompts: one choice each, all echoed without output.
    v = _decided(_result([], [0.0, 0.003]), _result([], [0.001]))
    assert v.status == PASS
    assert "of 3 echoed prompt tokens (largest deviation 0.003" in v.detail


def test_a_pass_that_scored_output_tokens_has_no_detail() -> None:
    v = _decided(_result([0.0, 0.01], [0.0, 0.001]))
    assert (v.status, v.detail) == (PASS, "")


def test_a_choice_without_output_among_scored_ones_is_named() -> None:
    v = _decided(_result([0.0], [0.001]), _result([], []))
    assert v.status == PASS
    assert v.detail == (
        "choice 1 scored no output token: the sampler was not verified, and no logprobs "
        "were compared"
    )


def test_prompt_logprobs_over_the_tolerance_fail_whatever_the_detail() -> None:
    v = _decided(_result([], [0.0, 0.5]))
    assert (v.status, v.reason) == (FAIL, "logprobs_mismatch")
    assert v.detail.startswith("choice 0: logprobs differ at echoed prompt token 2 by 0.5")

"""Each ``--logprobs-mode``'s values derived from the recorded rows equal vLLM's own.

The reference applies vLLM's own sampler code to the full logits row
(`mode_values`: its temperature, min-p processor, top-k / top-p functions and
log_softmax); the derivation sees only what the scoring pass records: the
recorder's top entries, the scored token's value and the kept-set bands. Where a
threshold sits within a prover's rounding of a token, either kept set passes and
restated values still fail.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.verifierd.logprobs_reference import chat_claim, mode_values
from verifierd.difr import SamplingSettings
from verifierd.engine.kept_sets import SLACKS
from verifierd.engine.logprob_check import check_logprobs
from verifierd.engine.logprob_rows import LogprobRecorder, LogprobRows
from verifierd.engine.logprobs_modes import ModeReplay, mode_replay
from verifierd.evidence.client_view import CHAT, ChoiceEvidence
from verifierd.evidence.logprobs import LogprobsClaim, LogprobsComparison, TopEntry
from verifierd.logit_adjustments import NEUTRAL, LogitAdjustments

pytestmark = pytest.mark.vllm

ROWS = 6
TOP = 3
PROMPT_LEN = 4
PROCESSED = ("processed_logits", "processed_logprobs")


def _logits(seed: int, width: int) -> torch.Tensor:
    """Logits of the magnitude a real model's have (the random tiny model's are ~N(0, 4))."""
    return torch.randn(ROWS, width, generator=torch.Generator().manual_seed(seed)) * 4


def _recorded(replay: ModeReplay, logits: torch.Tensor, output: tuple[int, ...]) -> LogprobRows:
    """The rows the scoring pass keeps for ``output`` (and the lookahead row), as the
    worker hands them over."""
    recorder = LogprobRecorder("j", replay.spec(), PROMPT_LEN, 0)
    compute = recorder.wrap(lambda hidden: logits[hidden.long().squeeze(1)], (0,) * 4 + output)
    compute(torch.arange(len(logits), dtype=torch.float32).unsqueeze(1))
    return LogprobRows.from_tuple(recorder.rows().to_tuple())


def _assert_vllms_at_slack_zero(
    mode: str, sampling: SamplingSettings, logits: torch.Tensor, output: tuple[int, ...]
) -> None:
    """The first reading's values of every recorded token and of the scored one are
    vLLM's bit for bit; a token the reading leaves open (a tie at the cut, an
    underflow) is vLLM's value or masked."""
    replay = mode_replay(mode, sampling, NEUTRAL, TOP)
    assert replay is not None
    rows = _recorded(replay, logits, output)
    readings = replay.readings(rows)
    assert readings is not None and len(readings) == len(SLACKS)
    expected = mode_values(logits, mode, sampling)
    for r, token in enumerate(output):
        reading = readings[0]
        norm, same = reading.normalisers(r)
        assert norm == same
        values, maybe = reading.values(r, rows.top_values[r])
        want = expected[r, torch.from_numpy(rows.top_ids[r])].numpy()
        got = values - norm
        assert np.array_equal(got[~maybe], want[~maybe]), (r, got, want)
        assert np.all((got[maybe] == want[maybe]) | (want[maybe] == -np.inf))
        [scored], _ = reading.values(r, rows.sampled[r : r + 1])
        assert scored - norm == expected[r, token]


CASES = [
    SamplingSettings(temperature=0.0),
    SamplingSettings(temperature=1.0),
    SamplingSettings(temperature=0.7),
    SamplingSettings(temperature=1.3, top_k=2),
    SamplingSettings(temperature=0.7, top_k=100),
    SamplingSettings(temperature=0.9, top_p=0.9),
    SamplingSettings(temperature=1.0, top_p=0.3),
    SamplingSettings(temperature=0.8, min_p=0.05),
    SamplingSettings(temperature=1.5, min_p=0.3),
    SamplingSettings(temperature=0.6, top_k=40, top_p=0.95, min_p=0.01),
]


@pytest.mark.parametrize("width", [300, 10000])  # 10000: difr's sort-free top-p path
@pytest.mark.parametrize("sampling", CASES)
@pytest.mark.parametrize("mode", PROCESSED)
def test_derived_values_are_vllms(mode: str, sampling: SamplingSettings, width: int) -> None:
    logits = _logits(7, width)
    # Scored tokens from the top of the row to below the recorded entries.
    output = tuple(int(torch.argsort(logits[i], descending=True)[i * 2]) for i in range(ROWS))
    _assert_vllms_at_slack_zero(mode, sampling, logits, output)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    temperature=st.floats(0.05, 3.0),
    top_k=st.one_of(st.just(-1), st.integers(1, 400)),
    top_p=st.one_of(st.just(1.0), st.floats(0.05, 1.0)),
    min_p=st.one_of(st.just(0.0), st.floats(0.0, 0.9)),
    mode=st.sampled_from(PROCESSED),
)
def test_any_sampling_derives_vllms_values(
    seed: int, temperature: float, top_k: int, top_p: float, min_p: float, *, mode: str
) -> None:
    logits = _logits(seed, 300)
    output = tuple(int(t) for t in logits.argmax(dim=1))
    sampling = SamplingSettings(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    _assert_vllms_at_slack_zero(mode, sampling, logits, output)


def test_raw_modes_are_the_recorded_values_under_any_sampling() -> None:
    penalised = LogitAdjustments.from_request(repetition_penalty=1.2)
    sampling = SamplingSettings(temperature=0.7, top_p=0.9, min_p=0.1)
    for mode in ("raw_logprobs", "raw_logits"):
        assert mode_replay(mode, sampling, penalised, TOP) == ModeReplay(mode, TOP + 1)


@pytest.mark.parametrize(
    ("mode", "adjustments"),
    [
        # Penalties move the logits before the mode's processing.
        ("processed_logits", LogitAdjustments.from_request(repetition_penalty=1.2)),
        ("processed_logprobs", LogitAdjustments.from_request(logit_bias={"1": 3.0})),
        ("no-such-mode", NEUTRAL),
    ],
)
def test_what_the_rows_do_not_determine_is_not_replayed(
    mode: str, adjustments: LogitAdjustments
) -> None:
    assert mode_replay(mode, SamplingSettings(top_p=0.9), adjustments, TOP) is None


class _Tokenizer:
    """Names token i ``<i>`` (vLLM's naming calls decode per token)."""

    def decode(self, ids: list[int]) -> str:
        return "".join(f"<{i}>" for i in ids)


@dataclass(frozen=True)
class _Choice:
    evidence: ChoiceEvidence
    sampling: SamplingSettings
    adjustments: LogitAdjustments
    logprobs_mode: str


def _compared(
    logits: torch.Tensor, claim: LogprobsClaim, mode: str, sampling: SamplingSettings
) -> LogprobsComparison:
    """The verifier's comparison of ``claim`` with the rows of ``logits`` (the output:
    each row's largest)."""
    output = tuple(int(t) for t in logits.argmax(dim=1))
    body = {"messages": [], "logprobs": True, "top_logprobs": TOP}
    evidence = ChoiceEvidence(CHAT, json.dumps(body), 0, "", "length", "", claimed_logprobs=claim)
    choice = _Choice(evidence, sampling, NEUTRAL, mode)
    replay = mode_replay(mode, sampling, NEUTRAL, TOP)
    assert replay is not None
    rows = _recorded(replay, logits, output)
    compared = check_logprobs(choice, output, [(output, rows)], _Tokenizer())
    assert isinstance(compared, LogprobsComparison), compared
    return compared


def _claim(logits: torch.Tensor, mode: str, sampling: SamplingSettings) -> LogprobsClaim:
    output = tuple(int(t) for t in logits.argmax(dim=1))
    return chat_claim(mode_values(logits, mode, sampling), output, TOP, _Tokenizer())


def _rescaled(claim: LogprobsClaim, factor: float) -> LogprobsClaim:
    return LogprobsClaim(
        tuple(
            replace(
                p,
                logprob=p.logprob * factor,
                top=tuple(TopEntry(t.token, t.logprob * factor) for t in p.top),
            )
            for p in claim.positions
        )
    )


def _at_the_cut(threshold: str) -> tuple[torch.Tensor, SamplingSettings, int]:
    """One row whose third token sits exactly at the threshold (its keep decision is
    float32 rounding), the sampling and that token's id."""
    probs = np.full(50, 0.1 / 47)
    probs[:3] = (0.5, 0.3, 0.1)
    if threshold == "top_p":  # the mass above the third token is top_p
        sampling = SamplingSettings(temperature=1.0, top_p=0.8)
    else:  # the third token's probability is min_p of the largest
        sampling = SamplingSettings(temperature=1.0, min_p=0.2)
    logits = torch.from_numpy(np.log(probs)).to(torch.float32).unsqueeze(0)
    return logits.repeat(ROWS, 1), sampling, 2


def _nudged(logits: torch.Tensor, token: int, by: float) -> torch.Tensor:
    out = logits.clone()
    out[:, token] += by
    return out


@pytest.mark.parametrize("threshold", ["top_p", "min_p"])
@pytest.mark.parametrize("mode", PROCESSED)
def test_a_threshold_within_rounding_of_a_token_accepts_either_kept_set(
    mode: str, threshold: str
) -> None:
    logits, sampling, token = _at_the_cut(threshold)
    kept, dropped = _nudged(logits, token, 1e-4), _nudged(logits, token, -1e-4)
    masks: list[npt.NDArray[np.bool_]] = []
    for prover in (kept, dropped):
        masks.append(np.isfinite(mode_values(prover, mode, sampling)[:, token].numpy()))
    assert masks[0].all() and not masks[1].any()  # the two provers' kept sets differ
    for verifier in (kept, dropped):
        for prover in (kept, dropped):
            compared = _compared(verifier, _claim(prover, mode, sampling), mode, sampling)
            # Each value moved by at most 1e-4 nats: the deviation is of that order.
            assert compared.largest <= 1e-3, compared
            rescaled = _rescaled(_claim(prover, mode, sampling), 0.9)
            assert _compared(verifier, rescaled, mode, sampling).largest > 0.05


def test_a_settled_threshold_compares_every_value() -> None:
    """Far from any threshold the first reading decides: a token the verifier masks
    stated at its unmasked value fails by whole nats."""
    logits, sampling, token = _at_the_cut("top_p")
    clear = _nudged(logits, token, -1.0)
    claim = _claim(_nudged(logits, token, 1.0), "processed_logits", sampling)
    compared = _compared(clear, claim, "processed_logits", sampling)
    assert compared.largest > 1.0
    honest = _compared(
        clear, _claim(clear, "processed_logits", sampling), "processed_logits", sampling
    )
    assert honest.largest == 0.0

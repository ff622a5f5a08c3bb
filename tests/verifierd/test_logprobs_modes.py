"""Each ``--logprobs-mode``'s values derived from the recorded rows equal vLLM's own.

The reference is computed on CPU with vLLM's sampler steps on the full logits
row (its temperature, top-k / top-p mask and log_softmax: `mode_values`); the derivation sees
only what the scoring pass records: the recorder's top entries and the scored
token's value.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.verifierd.logprobs_reference import mode_values
from verifierd.difr import SamplingSettings
from verifierd.engine.logprob_rows import LogprobRecorder, LogprobRows
from verifierd.engine.logprobs_modes import MAX_NORMALISED_TOP_K, ModeReplay, mode_replay
from verifierd.logit_adjustments import NEUTRAL, LogitAdjustments

pytestmark = pytest.mark.vllm

WIDTH = 300
ROWS = 6
TOP = 3
PROMPT_LEN = 4
#: Logits of magnitude a real model's have (the random tiny model's are ~N(0, 4)).
LOGITS = torch.randn(ROWS, WIDTH, generator=torch.Generator().manual_seed(7)) * 4
#: The output: each row's scored token, from the top of the row to below the
#: recorded entries (ranks 0, 2, ..., 10).
OUTPUT = tuple(int(torch.argsort(LOGITS[i], descending=True)[i * 2]) for i in range(ROWS))


def _recorded(replay: ModeReplay) -> LogprobRows:
    """The rows the scoring pass keeps for OUTPUT (and the lookahead row)."""
    recorder = LogprobRecorder("j", replay.spec(), PROMPT_LEN, 0)
    compute = recorder.wrap(lambda hidden: LOGITS[hidden.long().squeeze(1)], (0,) * 4 + OUTPUT)
    compute(torch.arange(ROWS, dtype=torch.float32).unsqueeze(1))
    return recorder.rows()


def _derived(mode: str, sampling: SamplingSettings) -> LogprobRows:
    replay = mode_replay(mode, sampling, NEUTRAL, TOP)
    assert replay is not None
    derived = replay.derive(_recorded(replay))
    assert derived is not None
    return derived


CASES = [
    ("raw_logprobs", SamplingSettings(temperature=0.7, top_k=5)),
    ("raw_logits", SamplingSettings(temperature=0.7, top_p=0.5)),
    ("processed_logits", SamplingSettings(temperature=0.0)),
    ("processed_logits", SamplingSettings(temperature=0.7)),
    # A top-k inside the claimed top: the last entries are masked.
    ("processed_logits", SamplingSettings(temperature=1.3, top_k=2)),
    ("processed_logits", SamplingSettings(temperature=0.7, top_k=100)),
    ("processed_logprobs", SamplingSettings(temperature=0.0)),
    ("processed_logprobs", SamplingSettings(temperature=1.0)),
    ("processed_logprobs", SamplingSettings(temperature=0.7, top_k=20)),
    ("processed_logprobs", SamplingSettings(temperature=1.0, top_k=2)),
    ("processed_logprobs", SamplingSettings(temperature=1.5, top_k=MAX_NORMALISED_TOP_K)),
]


@pytest.mark.parametrize(("mode", "sampling"), CASES)
def test_derived_values_are_vllms(mode: str, sampling: SamplingSettings) -> None:
    expected = mode_values(LOGITS, mode, sampling).clamp(min=-9999.0)
    derived = _derived(mode, sampling)
    exact = mode.endswith("logits")  # a float32 division, as vLLM does it
    tolerance = 0.0 if exact else 1e-6
    top = torch.topk(expected, TOP + 1)
    got = np.maximum(derived.top_values[:, : TOP + 1], -9999.0)
    assert np.abs(got - top.values.numpy()).max() <= tolerance
    # Every recorded token's value is vLLM's, masked ones at the floor.
    recorded = expected.gather(1, torch.from_numpy(derived.top_ids[:, : TOP + 1]))
    assert np.abs(got - recorded.numpy()).max() <= tolerance
    scored = np.maximum(derived.sampled[:ROWS], -9999.0)
    want = expected[torch.arange(ROWS), torch.tensor(OUTPUT)].numpy()
    assert np.abs(scored - want).max() <= tolerance


def test_a_top_k_mask_inside_the_claim_floors_the_rest() -> None:
    derived = _derived("processed_logits", SamplingSettings(temperature=1.3, top_k=2))
    assert np.isfinite(derived.top_values[:, :2]).all()
    assert (derived.top_values[:, 2:] == -np.inf).all()


@pytest.mark.parametrize(
    ("mode", "sampling", "adjustments"),
    [
        # min_p and top_p threshold on probabilities: the whole row's normaliser.
        ("processed_logits", SamplingSettings(temperature=0.7, top_p=0.9), NEUTRAL),
        ("processed_logprobs", SamplingSettings(temperature=0.7, min_p=0.1), NEUTRAL),
        # A temperature or a wide top-k changes the normaliser over tokens not recorded.
        ("processed_logprobs", SamplingSettings(temperature=0.7), NEUTRAL),
        (
            "processed_logprobs",
            SamplingSettings(temperature=0.7, top_k=MAX_NORMALISED_TOP_K + 1),
            NEUTRAL,
        ),
        # Penalties move the logits before the mode's processing.
        (
            "processed_logits",
            SamplingSettings(temperature=0.0),
            LogitAdjustments.from_request(repetition_penalty=1.2),
        ),
        ("no-such-mode", SamplingSettings(), NEUTRAL),
    ],
)
def test_what_the_rows_do_not_determine_is_not_replayed(
    mode: str, sampling: SamplingSettings, adjustments: LogitAdjustments
) -> None:
    assert mode_replay(mode, sampling, adjustments, TOP) is None


def test_raw_modes_are_replayed_under_any_sampling() -> None:
    penalised = LogitAdjustments.from_request(repetition_penalty=1.2)
    sampling = SamplingSettings(temperature=0.7, top_p=0.9, min_p=0.1)
    for mode in ("raw_logprobs", "raw_logits"):
        assert mode_replay(mode, sampling, penalised, TOP) == ModeReplay(mode, TOP + 1)


def test_a_tie_at_the_kth_value_is_not_normalised() -> None:
    replay = mode_replay("processed_logprobs", SamplingSettings(top_k=2), NEUTRAL, TOP)
    assert replay is not None and replay.normalise
    rows = _recorded(replay)
    tied = rows.top_values.copy()
    tied[0, 2] = tied[0, 1]
    assert replay.derive(LogprobRows(rows.job_id, 0, rows.top_ids, tied, rows.sampled)) is None
    assert replay.derive(rows) is not None


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    temperature=st.floats(0.05, 3.0),
    top_k=st.one_of(st.just(-1), st.integers(1, MAX_NORMALISED_TOP_K)),
    mode=st.sampled_from(["processed_logits", "processed_logprobs"]),
)
def test_any_replayed_sampling_derives_vllms_values(
    seed: int, temperature: float, top_k: int, mode: str
) -> None:
    logits = torch.randn(ROWS, WIDTH, generator=torch.Generator().manual_seed(seed)) * 4
    sampling = SamplingSettings(temperature=temperature, top_k=top_k)
    replay = mode_replay(mode, sampling, NEUTRAL, TOP)
    if replay is None:  # processed_logprobs at T != 1 without a top-k: not determined
        assert mode == "processed_logprobs" and top_k == -1
        return
    output = tuple(int(t) for t in logits.argmax(dim=1))
    recorder = LogprobRecorder("j", replay.spec(), PROMPT_LEN, 0)
    rows = torch.arange(ROWS, dtype=torch.float32).unsqueeze(1)
    recorder.wrap(lambda hidden: logits[hidden.long().squeeze(1)], (0,) * 4 + output)(rows)
    derived = replay.derive(recorder.rows())
    assert derived is not None
    expected = mode_values(logits, mode, sampling).clamp(min=-9999.0)
    ids = torch.from_numpy(derived.top_ids[:, : TOP + 1])
    got = np.maximum(derived.top_values[:, : TOP + 1], -9999.0)
    assert np.abs(got - expected.gather(1, ids).numpy()).max() <= 1e-6
    scored = expected[torch.arange(ROWS), torch.tensor(output)].numpy()
    assert np.abs(np.maximum(derived.sampled, -9999.0) - scored).max() <= 1e-6

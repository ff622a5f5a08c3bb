"""The verifier's logprobs taken from a scoring job's rows, and placed per output position."""

from __future__ import annotations

import math

import numpy as np
import torch

from verifierd.difr import SamplingSettings
from verifierd.engine.kept_sets import BAND, SLACKS
from verifierd.engine.logprob_check import _rows_by_position
from verifierd.engine.logprob_rows import LogprobRecorder, LogprobRows, LogprobsSpec

WIDTH = 6
PROMPT = (1, 2, 3)


def _logits(hidden: torch.Tensor) -> torch.Tensor:
    """A stand-in lm_head: row i of the logits is a fixed function of its hidden value."""
    return hidden[:, :1] * torch.arange(WIDTH, dtype=torch.float32)


def _recorded(mode: str, output: tuple[int, ...], score_from: int, rows: int) -> LogprobRows:
    recorder = LogprobRecorder("j", LogprobsSpec(3, mode), len(PROMPT), score_from)
    compute = recorder.wrap(_logits, (*PROMPT, *output))
    hidden = torch.arange(1, rows + 1, dtype=torch.float32).unsqueeze(1) / 4
    # The job asks in chunks, in position order.
    compute(hidden[:2])
    compute(hidden[2:])
    return LogprobRows.from_tuple(recorder.rows().to_tuple())


def test_raw_logprobs_are_log_softmax_of_the_rows_in_order() -> None:
    output = (5, 0, 4)
    rows = _recorded("raw_logprobs", output, 0, 4)  # three scored rows and the lookahead
    z = _logits(torch.arange(1, 5, dtype=torch.float32).unsqueeze(1) / 4)
    expected = torch.log_softmax(z, dim=-1)
    assert rows.first == 0 and rows.top_ids.shape == (4, 3)
    assert np.allclose(rows.sampled[:3], [expected[i, t] for i, t in enumerate(output)])
    assert math.isnan(float(rows.sampled[3]))
    assert (rows.top_ids[:, 0] == WIDTH - 1).all()  # the largest logit is the last id
    assert np.allclose(rows.top_values, torch.topk(expected, 3).values.numpy())


def test_raw_logits_are_the_rows_themselves() -> None:
    rows = _recorded("raw_logits", (5, 0, 4), 1, 2)
    z = _logits(torch.arange(1, 3, dtype=torch.float32).unsqueeze(1) / 4)
    assert rows.first == 1
    assert np.allclose(rows.sampled, [z[0, 0], z[1, 4]])


def test_a_restart_position_takes_the_distribution_of_the_earlier_pass() -> None:
    # The search guessed (5, 0, 3); the sampler picked 4 at position 2, scored from 3 on.
    first = _recorded("raw_logprobs", (5, 0, 3), 0, 4)
    second = _recorded("raw_logprobs", (5, 0, 4, 2), 3, 2)
    final = (5, 0, 4, 2)
    found = _rows_by_position(final, [((5, 0, 3), first), ((5, 0, 4, 2), second)])
    assert found is not None
    assert [(rows.first, r) for rows, r, _ in found] == [(0, 0), (0, 1), (0, 2), (3, 0)]
    values = [v for _, _, v in found]
    # Position 2's row was computed for 3: the value of 4 comes from its top entries.
    top = dict(zip(first.top_ids[2].tolist(), first.top_values[2].tolist(), strict=True))
    assert values[2] == top.get(4)
    assert values[3] == float(second.sampled[0])
    # A position no pass computed leaves nothing to compare.
    assert _rows_by_position((*final, 1, 1), [((5, 0, 3), first), (final, second)]) is None


def test_a_spec_with_sampling_travels_in_extra_args_and_bands_each_row() -> None:
    sampling = SamplingSettings(temperature=0.7, top_k=4, top_p=0.9, min_p=0.05)
    spec = LogprobsSpec(3, "raw_logits", sampling)
    assert LogprobsSpec.from_extra(spec.to_extra()) == spec
    broken = {"veritap_logprobs": {"top": 3, "mode": "raw_logits", "sampling": {"top_p": 2}}}
    assert LogprobsSpec.from_extra(broken) is None
    recorder = LogprobRecorder("j", spec, len(PROMPT), 0)
    recorder.wrap(_logits, (*PROMPT, 5, 0))(torch.ones(3, 1))
    rows = LogprobRows.from_tuple(recorder.rows().to_tuple())
    assert rows.bands is not None and rows.bands.shape == (3, len(SLACKS), len(BAND))
    assert _recorded("raw_logits", (5, 0, 4), 0, 4).bands is None

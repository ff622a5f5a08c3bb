"""The committed ``--logprobs-mode``'s values, derived from the rows a scoring pass records.

vLLM's sampler (vllm/v1/sample/sampler.py) reports, per the server's mode:

- ``raw_logprobs``: ``log_softmax`` of the model's logits in float32;
  ``raw_logits``: the logits cast to float32. The recorder keeps these as they are.
- ``processed_logits``: the logits after the logits processors and penalties,
  divided by the temperature (float32), then min_p, top-k and top-p masks in
  that order (masked tokens -inf, which the server clamps at -9999);
  ``processed_logprobs``: vLLM's float32 ``log_softmax`` of those. A greedy
  request skips the temperature and the masks, unless it shares a batch with a
  sampled one: it then goes through them at temperature 1 with its own (neutral)
  masks, which only a neighbour's top-p can make drop anything.

For the processed modes the recorder keeps the scoring pass's ``top`` largest
raw logits, the scored token's, and per row the kept-set bands of
`verifierd.engine.kept_sets`, computed on the whole row at the request's
sampling. From them every stated value is derived: a kept token's
``processed_logits`` value is its raw logit divided by the temperature (float32,
as vLLM divides), its ``processed_logprobs`` value ``(x - max x) - L`` in float32
with L the log-normaliser of the kept set (at slack 0 vLLM's own: both bit for
bit what vLLM states); a masked token's is -inf.

A threshold within the prover's numerics of a token (top-p near the token's
cumulative probability, min_p near its probability ratio, a tie at the cut, a
probability that underflows) leaves its kept set open. Each slack of
`verifierd.engine.kept_sets.SLACKS` gives a `Reading`: the tokens surely kept
(their values compared), those possibly kept (a stated value or the floor both
match), the rest masked, and for ``processed_logprobs`` the range of normalisers
the plausible kept sets give, within which the one nearest the claim is used. A
position's deviation is the least, over the readings, of max(slack, deviation
under the reading): an honest prover's values, whatever kept set its numerics
chose, deviate by no more than the logits it computed them from; values
rescaled or from another model fail as under plain sampling.

Not replayed (only the claim's shape is checked, `mode_replay` returns None):
any logit adjustment (penalties, logit_bias, min_tokens, allowed or bad words, a
grammar: each moves the logits before the mode's processing, out of the
recorder's sight).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from verifierd.difr import SamplingSettings
from verifierd.engine.kept_sets import SLACKS
from verifierd.engine.logprob_rows import LogprobRows, LogprobsSpec
from verifierd.logit_adjustments import LogitAdjustments

_NEG_INF = np.float32(-np.inf)


@dataclass(frozen=True, eq=False)
class Reading:
    """The committed mode's values of a pass's rows under one slack."""

    slack: float
    #: The request's temperature (float32 division); None: the recorded values are the mode's.
    temperature: float | None = None
    #: rows x 4: the rows' bands at this slack (`verifierd.engine.kept_sets.BAND`).
    band: npt.NDArray[np.float32] | None = None
    #: Per row, the largest processed logit (subtracted before the normaliser); None
    #: for ``processed_logits``.
    peak: npt.NDArray[np.float32] | None = None

    def values(
        self, r: int, raw: npt.NDArray[np.float32]
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_]]:
        """The mode's values of row ``r``'s tokens of raw values ``raw`` (less the
        normaliser for ``processed_logprobs``: see `normalisers`), and which of them
        the prover may have masked."""
        raw = np.asarray(raw, dtype=np.float32)
        if self.temperature is None or self.band is None:
            return raw, np.zeros(raw.shape, dtype=bool)
        z = raw / np.float32(self.temperature)
        above, least = self.band[r, 0], self.band[r, 1]
        sure = z > above
        maybe = ~sure & (z >= least)
        values = np.where(sure | maybe, z, _NEG_INF)
        if self.peak is not None:
            values = values - self.peak[r]
        return values.astype(np.float32), maybe

    def normalisers(self, r: int) -> tuple[np.float32, np.float32]:
        """The range of the log-normaliser of row ``r`` (0 for the modes without one)."""
        if self.peak is None or self.band is None:
            return np.float32(0), np.float32(0)
        return self.band[r, 2], self.band[r, 3]


@dataclass(frozen=True)
class ModeReplay:
    """How a choice's values in the committed mode come from the recorded rows."""

    #: What the recorder keeps: "raw_logprobs" or "raw_logits".
    recorded: str
    #: Values per row the recorder keeps.
    top: int
    #: The sampling whose kept sets the recorder bands (None: the raw values are the mode's).
    sampling: SamplingSettings | None = None
    #: ``processed_logprobs``: values relative to the kept set's normaliser.
    normalise: bool = False

    def spec(self) -> LogprobsSpec:
        return LogprobsSpec(self.top, self.recorded, self.sampling)

    def readings(self, rows: LogprobRows) -> list[Reading] | None:
        """The readings of ``rows``, one per slack; None where the rows lack the bands."""
        if self.sampling is None:
            return [Reading(0.0)]
        if rows.bands is None:
            return None
        peak = rows.top_values[:, 0] / np.float32(self.sampling.temperature)
        return [
            Reading(
                slack,
                self.sampling.temperature,
                rows.bands[:, level],
                peak.astype(np.float32) if self.normalise else None,
            )
            for level, slack in enumerate(SLACKS)
        ]


def mode_replay(
    mode: str, sampling: SamplingSettings, adjustments: LogitAdjustments, requested_top: int
) -> ModeReplay | None:
    """How to replay ``mode`` for a request asking for ``requested_top`` top entries
    under ``sampling`` and ``adjustments``; None when it cannot be (module docstring)."""
    top = requested_top + 1  # the sampled token may sit outside the claimed top
    if mode in ("raw_logprobs", "raw_logits"):
        return ModeReplay(mode, top)
    if mode not in ("processed_logprobs", "processed_logits") or not adjustments.is_neutral:
        return None
    s = sampling.effective()
    # A greedy request in a sampled batch: temperature 1, its masks neutral.
    banded = (
        SamplingSettings()
        if s.is_greedy
        else SamplingSettings(s.temperature, s.top_k, s.top_p, s.min_p)
    )
    return ModeReplay("raw_logits", top, banded, normalise=mode == "processed_logprobs")

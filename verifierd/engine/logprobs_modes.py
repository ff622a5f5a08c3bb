"""The committed ``--logprobs-mode``'s values, derived from the rows a scoring pass records.

vLLM's sampler (vllm/v1/sample/sampler.py) reports, per the server's mode:

- ``raw_logprobs``: ``log_softmax`` of the model's logits in float32;
  ``raw_logits``: the logits cast to float32. The recorder keeps these as they are.
- ``processed_logits``: the logits after the logits processors and penalties,
  divided by the temperature (float32), with min_p and the top-k / top-p masks
  applied (masked tokens -inf, which the server clamps at -9999);
  ``processed_logprobs``: ``log_softmax`` of those. A greedy request skips the
  temperature and the masks, so with no logits processor or penalty its
  processed values are its raw ones.

The recorder keeps the scoring pass's ``top`` largest raw values and the scored
token's (`verifierd.engine.logprob_rows`), so a processed value is derived from
them exactly where nothing outside the recorded entries decides it:

- no logit adjustment (penalties, logit_bias, min_tokens, allowed or bad words,
  a grammar: each moves the logits before the mode's processing, out of the
  recorder's sight);
- neither min_p nor top_p (both threshold on probabilities, whose normaliser
  sums the whole row);
- ``processed_logprobs`` at a temperature other than 1 or with a top-k mask: a
  top-k of at most `MAX_NORMALISED_TOP_K`, whose kept tokens the recorder then
  holds in full (it records one more, to see a tie at the k-th value that vLLM
  would keep too).

Elsewhere only the claim's shape is checked (`mode_replay` returns None).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from verifierd.difr import SamplingSettings
from verifierd.engine.logprob_rows import LogprobRows, LogprobsSpec
from verifierd.logit_adjustments import LogitAdjustments

#: The largest top-k under which ``processed_logprobs`` are derived (the recorder
#: then keeps k + 1 values per row instead of the claim's N + 1).
MAX_NORMALISED_TOP_K = 64


@dataclass(frozen=True)
class ModeReplay:
    """How a choice's values in the committed mode come from the recorded rows."""

    #: What the recorder keeps: "raw_logprobs" or "raw_logits".
    recorded: str
    #: Values per row the recorder keeps.
    top: int
    #: Divide the recorded logits by this (1: as recorded).
    temperature: float = 1.0
    #: Mask the recorded logits below the k-th largest (-1: no mask).
    top_k: int = -1
    #: Take ``log_softmax`` over the kept recorded logits (``processed_logprobs``).
    normalise: bool = False

    def spec(self) -> LogprobsSpec:
        return LogprobsSpec(self.top, self.recorded)

    def derive(self, rows: LogprobRows) -> LogprobRows | None:
        """The committed mode's values of ``rows``; None where a row's k-th value ties
        with the next (vLLM keeps both, the recorder holds only the first)."""
        if self.recorded == "raw_logprobs":
            return rows
        values = rows.top_values / np.float32(self.temperature)
        sampled = rows.sampled / np.float32(self.temperature)
        if self.normalise and values.shape[1] <= self.top_k:
            return None
        if self.top_k > 0 and self.top_k <= values.shape[1]:
            kth = values[:, self.top_k - 1]
            if self.normalise and (values[:, self.top_k] == kth).any():
                return None
            values = np.where(values < kth[:, None], np.float32(-np.inf), values)
            sampled = np.where(sampled < kth, np.float32(-np.inf), sampled)
        if self.normalise:
            kept = values.astype(np.float64)
            peak = kept[:, :1]
            norm = peak[:, 0] + np.log(np.exp(kept - peak).sum(axis=1))
            values = (kept - norm[:, None]).astype(np.float32)
            sampled = (sampled.astype(np.float64) - norm).astype(np.float32)
        return LogprobRows(
            rows.job_id,
            rows.first,
            rows.top_ids,
            values.astype(np.float32),
            sampled.astype(np.float32),
        )


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
    raw = "raw_logprobs" if mode == "processed_logprobs" else "raw_logits"
    if s.is_greedy:
        return ModeReplay(raw, top)
    if s.min_p > 0 or s.top_p < 1:
        return None
    top_k = s.top_k if s.top_k > 0 else -1
    if mode == "processed_logits":
        return ModeReplay("raw_logits", top, s.temperature, top_k)
    if top_k < 0 and s.temperature == 1:
        return ModeReplay("raw_logprobs", top)
    if not 0 < top_k <= MAX_NORMALISED_TOP_K:
        return None
    return ModeReplay("raw_logits", max(top, top_k + 1), s.temperature, top_k, normalise=True)

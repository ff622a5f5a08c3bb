"""Choosing Δmax and the threshold of a commitment from its honest traffic (no I/O).

Input: the raw per-token margins (+inf = claimed token outside the mask) of
responses known to be honest, recomputed on the verifier's engine. Output:

- **Δmax** = the largest finite honest margin, never below ``min_delta_max``.
  Margins beyond anything honest numerics produce are evidence, so they keep
  their full weight up to the clip; an honest out-of-mask token (bf16 puts a
  few just outside the nucleus) costs no more than the worst honest rounding.
  float32 reproduction is exact (every margin 0), so there the floor applies.
- **threshold**: the honest scores (mean margin clipped at Δmax) are computed,
  and the threshold is their (1 - target FPR) empirical quantile when the
  sample is large enough to resolve it (n ≥ 10 / FPR), otherwise their maximum;
  either way multiplied by ``safety`` and never below ``min_threshold``. When
  reproduction is exact (every honest margin 0) the floor alone sets the
  threshold. float32 rounding between differently batched runs moves logits
  by ~1e-5 or less, so a token it flips (both candidates within that distance
  of each other: rare) scores at most about that, and in a response of a few
  tokens or more stays under 1e-5; one token changed by a systematic deviation
  (8-bit weights move logits by ~0.01) fails a response of up to a thousand
  tokens. A reduced-precision engine flips a near tie now and then however its
  batches are shaped, and a calibration sample can hold none of those flips (a
  tiny model's bfloat16 run: one flip in 240,000 tokens, margin 0.0057), so
  its floor (`threshold_floor`) lets a 100-token response carry one flip of
  the size its rounding allows. Token-DiFR sees only changed tokens: a response in which none
  changed cannot be told from an honest one at any threshold.

- **logprobs tolerance**: when the honest responses stated logprobs, the largest
  deviation of their values from the verifier's (`verifierd.evidence.logprobs`)
  times ``safety``, never below `logprobs_tolerance_floor`. float32 reproduces
  the prover's raw logprobs exactly or within ~1e-5 (another batch shape); the
  floor, 1e-3 nats, leaves room for that and still fails a value moved by 0.01.
  A reduced-precision logit is rounded to a multiple of its unit in the last
  place, 2^-3 for a bfloat16 logit of magnitude 16-32 (2^-6 in float16), and a
  logprob inherits the rounding of its logit and of the normaliser: the floor
  allows two such units (bfloat16 0.25 nats, float16 2^-5), so another model's
  values (off by whole nats: 10 or more between the two tiny models) or a shift
  of 0.5 nats still fail. The hard case, another model's flatter values over the
  same ranking (every value times 0.9), deviates by a tenth of the lowest listed
  value, a few nats below 0 in a top-3 list: only a response whose every listed
  value is within 0.01 nats of 0 hides it under the float32 floor, and its values
  then state nothing its tokens do not. The processed modes are derived from the
  same float32 rows as vLLM derives them (its masks and float32 ``log_softmax``,
  bit for bit where no threshold sits within rounding of a token; elsewhere a
  position deviates by max(slack, deviation) over the recorder's slack bands,
  `verifierd.engine.kept_sets`), so the same floors hold for them.

The empirical false-positive rate of the chosen settings on the sample is
reported with the resolution the sample size allows, and the honest tokens
above each margin level are counted for the per-prover sequential test
(`verifierd.provers.sequential.HonestTails`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from verifierd.commitments import DifrSettings
from verifierd.errors import VerifierdError
from verifierd.provers.sequential import HonestTails

#: Margins at or above this are "outside the mask" when they come back clipped
#: from an engine asked for Δmax = UNCLIPPED.
UNCLIPPED = 1e9


#: A logit of magnitude 4-8 rounds to a multiple of its unit in the last place:
#: 2^-5 in bfloat16 (8 significand bits), 2^-8 in float16 (11).
_FLIP_MARGIN = {"bfloat16": 2.0**-5, "float16": 2.0**-8}
#: The shortest response the floor lets carry one such flip.
_FLIP_TOKENS = 100
FLOAT32_FLOOR = 1e-5


def threshold_floor(dtype: str) -> float:
    """The lowest threshold honest numerics of ``dtype`` allow (float32: 1e-5)."""
    return max(FLOAT32_FLOOR, _FLIP_MARGIN.get(dtype, 0.0) / _FLIP_TOKENS)


#: Two units in the last place of a logit of magnitude 16-32 (see the module docstring).
_LOGIT_ROUNDING = {"bfloat16": 2 * 2.0**-3, "float16": 2 * 2.0**-6}
FLOAT32_LOGPROBS_FLOOR = 1e-3


def logprobs_tolerance_floor(dtype: str) -> float:
    """The lowest logprobs tolerance honest numerics of ``dtype`` allow (float32: 1e-3)."""
    return max(FLOAT32_LOGPROBS_FLOOR, _LOGIT_ROUNDING.get(dtype, 0.0))


class CalibrationError(VerifierdError):
    """Not enough honest traffic to calibrate from."""


@dataclass(frozen=True)
class Calibration:
    settings: DifrSettings
    target_fpr: float
    responses: int
    tokens: int
    #: Honest tokens outside the mask / all honest tokens.
    out_of_mask_rate: float
    #: Largest finite honest margin seen.
    max_margin: float
    #: Largest honest score at the chosen Δmax.
    max_score: float
    #: Honest responses the chosen settings would FAIL (0 by construction unless
    #: the quantile rule was used).
    false_positives: int
    #: "quantile" or "maximum": which rule set the threshold.
    rule: str
    #: The honest tokens above each margin level at the chosen Δmax: what the
    #: per-prover sequential test bounds honest provers by.
    honest_tails: HonestTails
    #: Honest responses that stated logprobs, and their largest deviation from the
    #: verifier's (0 when none did: the floor alone sets the tolerance).
    logprobs_responses: int = 0
    max_logprobs_deviation: float = 0.0


def calibrate(
    honest: Sequence[npt.NDArray[np.float64]],
    *,
    target_fpr: float,
    sample_rate: float,
    safety: float = 1.5,
    min_delta_max: float = 1.0,
    min_threshold: float = FLOAT32_FLOOR,
    logprobs_deviations: Sequence[float] = (),
    min_logprobs_tolerance: float = FLOAT32_LOGPROBS_FLOOR,
) -> Calibration:
    """Settings for a target false-positive rate from honest responses' raw margins
    and, for those that stated logprobs, their largest logprobs deviations."""
    if not 0 < target_fpr < 1:
        raise CalibrationError(f"target FPR must be in (0, 1): {target_fpr}")
    responses = [np.asarray(m, dtype=np.float64) for m in honest if len(m)]
    if len(responses) < 2:
        raise CalibrationError("need at least 2 honest responses with tokens")
    raw = np.concatenate([np.where(m >= UNCLIPPED, np.inf, m) for m in responses])
    finite = raw[np.isfinite(raw)]
    max_margin = float(finite.max()) if finite.size else 0.0
    delta_max = max(min_delta_max, max_margin)
    scores = np.array(
        [np.minimum(np.where(m >= UNCLIPPED, np.inf, m), delta_max).mean() for m in responses]
    )
    if len(responses) >= math.ceil(10 / target_fpr):
        base, rule = float(np.quantile(scores, 1 - target_fpr, method="higher")), "quantile"
    else:
        base, rule = float(scores.max()), "maximum"
    threshold = max(min_threshold, base * safety)
    deviations = [float(d) for d in logprobs_deviations]
    if not all(math.isfinite(d) and d >= 0 for d in deviations):
        raise CalibrationError("logprobs deviations must be finite and >= 0")
    max_deviation = max(deviations, default=0.0)
    return Calibration(
        settings=DifrSettings(
            threshold=threshold,
            delta_max=delta_max,
            sample_rate=sample_rate,
            logprobs_tolerance=max(min_logprobs_tolerance, max_deviation * safety),
        ),
        target_fpr=target_fpr,
        responses=len(responses),
        tokens=int(raw.size),
        out_of_mask_rate=float(np.isinf(raw).mean()),
        max_margin=max_margin,
        max_score=float(scores.max()),
        false_positives=int((scores > threshold).sum()),
        rule=rule,
        honest_tails=HonestTails.from_margins(responses, delta_max),
        logprobs_responses=len(deviations),
        max_logprobs_deviation=max_deviation,
    )

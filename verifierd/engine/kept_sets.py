"""The tokens vLLM's min_p / top-k / top-p masks keep in a row, and those honest numerics could.

vLLM's processed values (``processed_logits``, ``processed_logprobs``) depend on
which tokens its masks keep, and ``processed_logprobs`` on the normaliser over
them: a sum over the whole row, which the recorder does not keep. For each row a
scoring pass records, the recorder computes here, on the full row (`bands`):

- the kept set of vLLM's CPU sampler (the masks of `verifierd.difr`, bit for bit
  vLLM's) and its log-normaliser, read off vLLM's own float32 ``log_softmax``;
- for each slack s of `SLACKS`, the kept sets a prover whose logits differ from
  the verifier's by at most s nats each could have used. Each mask keeps a
  prefix of the row in descending order. Moving every logit by at most s moves
  ``log p_i - log p_max`` by at most 2s (min_p: kept iff it is >= log min_p) and
  the log-odds of the mass above a token by at most 2s (top-p: kept iff that
  mass is below top_p); top-k counts ranks, which no slack moves (ties at the
  k-th value are kept, as vLLM keeps them). The kept prefixes then run from
  the shortest (surely kept) to the longest (possibly kept), the exact one
  always between. top-p is read over the tokens min_p and top-k keep exactly.

vLLM masks every row of a batch with the top-p path when any request in it uses
top-p; a row whose own top_p is 1 then loses the tokens whose float32
probability underflows to 0. The batch is the prover's, so for such a request
those tokens are only possibly kept, at every slack.

A row's band at one slack is four float32 numbers (`BAND`): the largest value
not surely kept (every token above it is), the smallest value possibly kept,
and the log-normalisers ``log sum exp(x - max x)`` over the shortest and the
longest prefix (at slack 0 both are vLLM's own).

Without top-p every band lies within a short prefix of the sorted row: the
tokens min_p keeps at the widest slack, top-k's k with its ties, vLLM's own kept
set. `bands` then sorts only that prefix (`torch.topk`), as vLLM's top-k does,
and gets the same numbers bit for bit: each band reads prefix sums, which a
longer row does not change (the cumulative sum runs in order; exp and log are
elementwise). The one band that reads the whole row, the
underflow floor, is then shown not to bind (vLLM's kept tokens all lie far
above it); where it might, or the prefix is not short, the row is sorted whole.
"""

from __future__ import annotations

import math

import torch

from verifierd.difr import SamplingSettings, apply_min_p, apply_top_k_top_p, scaled_logits

#: Logit differences (nats) under which the plausible kept sets are computed: a
#: position's deviation is the least over these of max(slack, deviation under it).
SLACKS = (0.0, 1e-5, 1e-4, 1e-3, 1e-2, 0.03, 0.1, 0.25, 0.5, 1.0)
#: The band's fields, in order.
BAND = ("above", "least", "norm_lo", "norm_hi")
#: A float32 probability below exp(this) may be flushed to 0 (2^-126, and one nat
#: of room for the prover's rounding of the normaliser).
UNDERFLOW = math.log(2.0**-126) + 1.0
#: Rows are sorted only up to their bands' prefix when it is at most 1/PREFIX_SHARE
#: of their width, and whole past that.
PREFIX_SHARE = 8
#: Room (nats) between vLLM's least kept token and the underflow floor for the
#: floor not to bind (the row's log-normaliser is at most log(width) plus
#: rounding), and below min_p's widest threshold when counting its prefix.
FLOOR_MARGIN = 1e-3
#: Values past 2k that a top-k row's prefix is first taken with, for ties at the k-th.
TIE_ROOM = 16


def bands(raw: torch.Tensor, sampling: SamplingSettings) -> torch.Tensor:
    """[rows, len(SLACKS), 4] float32: each row's `BAND` per slack, for raw logits
    ``raw`` [rows, width] under the (effective, sampled) ``sampling``."""
    x = scaled_logits(raw, sampling.temperature)
    rows, width = x.shape
    processed = apply_top_k_top_p(
        apply_min_p(x.clone(), sampling.min_p), sampling.top_k, sampling.top_p
    )
    exact = torch.isfinite(processed).sum(dim=1)
    peak = x.argmax(dim=1, keepdim=True)
    norm0 = -processed.log_softmax(dim=-1, dtype=torch.float32).gather(1, peak).squeeze(1)

    prefix = _kept_prefix(x, exact, sampling)
    xs = x.sort(dim=1, descending=True).values if prefix is None else prefix
    d = xs.double() - xs[:, :1].double()
    log_mass = d.exp().cumsum(dim=1).log()
    slack = 2 * torch.tensor(SLACKS, dtype=torch.float64).expand(rows, -1).contiguous()
    lo = torch.full((rows, len(SLACKS)), width, dtype=torch.int64)
    hi = lo.clone()
    falling = (-d).contiguous()  # ascending
    if sampling.min_p > 0:
        t = math.log(sampling.min_p)
        lo = lo.minimum(torch.searchsorted(falling, -(t + slack), right=True))
        hi = hi.minimum(torch.searchsorted(falling, -(t - slack), right=True))
    if 0 < sampling.top_k < width:
        k = (xs >= xs[:, sampling.top_k - 1 : sampling.top_k]).sum(dim=1, keepdim=True)
        lo, hi = lo.minimum(k), hi.minimum(k)
    if sampling.top_p < 1:
        odds = _log_odds_above(x, xs, d, sampling)
        t = math.log(sampling.top_p) - math.log1p(-sampling.top_p)
        lo = lo.minimum(torch.searchsorted(odds, t - slack))
        hi = hi.minimum(torch.searchsorted(odds, t + slack))
    lo[:, 0], hi[:, 0] = exact, exact
    if sampling.top_p >= 1 and prefix is None:
        floor = (UNDERFLOW + log_mass[:, -1:]).neg().contiguous()
        lo = lo.minimum(torch.searchsorted(falling, floor, right=True))
    lo = lo.minimum(exact[:, None]).clamp(min=1)
    hi = hi.maximum(exact[:, None])

    above = xs.gather(1, lo.clamp(max=width - 1))
    above = torch.where(lo < width, above, torch.tensor(-math.inf))
    least = xs.gather(1, hi - 1)
    norm_lo = log_mass.gather(1, lo - 1).minimum(norm0[:, None].double())
    norm_hi = log_mass.gather(1, hi - 1).maximum(norm0[:, None].double())
    norm_lo[:, 0] = norm_hi[:, 0] = norm0.double()
    return torch.stack([above, least, norm_lo.float(), norm_hi.float()], dim=2)


def _kept_prefix(
    x: torch.Tensor, exact: torch.Tensor, sampling: SamplingSettings
) -> torch.Tensor | None:
    """Each row's largest values in descending order, past every token a band reads
    without top-p (None: the whole sorted row is needed).

    Every band lies within the shortest of the prefixes top-k keeps (k with its
    ties) and min_p keeps at the widest slack, or within vLLM's own kept set: a
    prefix whose last value is outside the first, and longer than the second,
    holds them all. Its length is guessed (k and room for ties), else counted.
    """
    width = x.shape[1]
    top_k = 0 < sampling.top_k < width
    if sampling.top_p < 1 or not (sampling.min_p > 0 or top_k):
        return None
    peak = x.max(dim=1, keepdim=True).values
    if bool(peak.isnan().any()):
        return None
    widest = math.log(sampling.min_p) - 2 * max(SLACKS) if sampling.min_p > 0 else -math.inf
    shortest = int(exact.max()) + 1

    def prefix(length: int) -> torch.Tensor | None:
        length = max(length, shortest)
        if length > width // PREFIX_SHARE:
            return None
        xs = x.topk(length, dim=1).values
        last = xs[:, -1:]
        past = last.double() - peak.double() < widest
        if top_k:
            past |= last < xs[:, sampling.top_k - 1 : sampling.top_k]
        return xs if bool(past.all()) else None

    xs = prefix(2 * sampling.top_k + TIE_ROOM) if top_k else None
    if xs is None:
        if top_k:
            cut = x.topk(sampling.top_k, dim=1).values[:, -1:]
        else:
            cut = (peak.double() + (widest - FLOOR_MARGIN)).float()
        xs = prefix(int((x >= cut).sum(dim=1, dtype=torch.int32).max()) + 1)
    if xs is None:
        return None
    smallest_kept = xs.gather(1, (exact - 1).clamp(min=0)[:, None]).double()
    clear = UNDERFLOW + math.log(width) + FLOOR_MARGIN
    if not bool((smallest_kept - peak.double() >= clear).all()):
        return None
    return xs


def _log_odds_above(
    x: torch.Tensor, xs: torch.Tensor, d: torch.Tensor, sampling: SamplingSettings
) -> torch.Tensor:
    """Per sorted position j: log(mass above j / mass of j and below), over the tokens
    min_p and top-k keep (+inf past them): top-p keeps j iff it is below logit(top_p)."""
    masked = apply_top_k_top_p(apply_min_p(x.clone(), sampling.min_p), sampling.top_k, 1.0)
    within = torch.arange(xs.shape[1]) < torch.isfinite(masked).sum(dim=1, keepdim=True)
    w = torch.where(within, d.exp(), torch.zeros((), dtype=torch.float64))
    above = w.cumsum(dim=1) - w
    below = w.flip(1).cumsum(dim=1).flip(1)
    odds = torch.where(
        within, above.log() - below.log(), torch.tensor(math.inf, dtype=torch.float64)
    )
    return odds.cummax(dim=1).values.contiguous()  # rounding aside, it never decreases

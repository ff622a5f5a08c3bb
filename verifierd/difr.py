"""Token-DiFR scoring: per-token margins of claimed tokens against rebuilt sampler noise.

Pure computation (torch tensors and values in, values out; no engine, no I/O).
For output token t with raw logits z (the engine's float32 logits row at the
position before it), the request's settings and the sampler profile's noise:

1. greedy (T < 1e-5, as vLLM decides): margin = max_j z_j - z_y.
2. otherwise, in vLLM's order (vllm/v1/sample/sampler.py, vLLM 0.32):
   x = float32(z) / float32(T); min_p mask; top-k/top-p mask (see
   `apply_top_k_top_p`); then margin = T * (max_j s_j - s_y) with s the
   sampler's own objective (x + G for Gumbel-max samplers), so a claimed token
   that the sampler would have picked scores exactly 0.0.
3. A claimed token outside the mask (or an id outside the logits) scores +inf;
   margins are clipped at delta_max and averaged: the response passes iff
   mean <= threshold.

The masks reproduce vLLM's CPU PyTorch path bit for bit (same torch operations
on the same dtypes; checked against vLLM's own functions in the tests):

- min_p: p = softmax(x) (float32); drop tokens with p < max(p) * min_p.
- top-k only: drop x_j < (k-th largest x); ties at the k-th value are kept.
- top-p (with or without top-k): sort x ascending; top-k drops sorted values
  below the k-th largest; p = softmax of the sorted row; c = cumsum(p); drop
  positions with c <= 1 - top_p (float32), always keeping the largest.
  On the CPU, in rows of 8192 logits or more, the first kept value is usually
  found without the sort, from a partition and a bound on vLLM's float32
  rounding (`top_p_first_kept`); rows the bound cannot settle are sorted.

vLLM applies the top-p path to every row of a batch in which any request uses
top-p; for a row with top_p = 1 that only drops tokens whose float32
probability underflows to exactly 0, which no Gumbel draw (bounded by 37.5)
can make win, so such rows are scored with the cheaper top-k-only path.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt
import torch

from verifierd.errors import VerifierdError
from verifierd.samplers import (
    NoiseStream,
    NotReproducibleError,
    RowScores,
    SamplerProfile,
    StreamRows,
    score_stacked,
)

#: vLLM: temperatures below this are greedy (vllm/sampling_params.py _SAMPLING_EPS).
SAMPLING_EPS = 1e-5
#: vLLM raises temperatures in (0, 0.01) to 0.01 (vllm/sampling_params.py _MAX_TEMP).
MIN_TEMPERATURE = 1e-2
#: Rows of logits scored at once (bounds the [rows, width] temporaries).
DEFAULT_CHUNK_ROWS = 256
#: Logits the CPU top-p mask handles at once (a block stays in the cache).
BLOCK_ELEMENTS = 1 << 18
#: The sort-free top-p path is used while it needs at most width / this candidates.
CANDIDATE_FRACTION = 4
#: Narrower rows are sorted: below this the sort-free path saves nothing measurable
#: (bench/verify.py's stage table).
SORT_FREE_MIN_WIDTH = 8192
_U32 = 2.0**-24
_EXP_REL = 2.0**-17
_DEPTH_SLACK = 64


class DifrError(VerifierdError):
    """Invalid scoring input."""


@dataclass(frozen=True)
class SamplingSettings:
    """The sampling parameters a response was generated with (vLLM semantics).

    ``top_k`` <= 0 or >= the logits width and ``top_p`` = 1 disable those masks;
    ``seed`` None means the prover drew its own seed (not verifiable at T > 0).
    """

    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise DifrError(f"temperature must be finite and >= 0, not {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise DifrError(f"top_p must be in (0, 1], not {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise DifrError(f"min_p must be in [0, 1], not {self.min_p}")
        if self.top_k < -1:
            raise DifrError(f"top_k must be -1, 0 or positive, not {self.top_k}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS

    def effective(self) -> SamplingSettings:
        """What vLLM's SamplingParams turns these into: greedy resets the masks,
        0 < T < 0.01 becomes 0.01, top_k 0 and seed -1 mean "off"."""
        if self.is_greedy:
            return replace(self, temperature=0.0, top_k=-1, top_p=1.0, min_p=0.0)
        return replace(
            self,
            temperature=max(self.temperature, MIN_TEMPERATURE),
            top_k=-1 if self.top_k == 0 else self.top_k,
            seed=None if self.seed == -1 else self.seed,
        )

    def for_choice(self, index: int, n: int) -> SamplingSettings:
        """Settings of choice ``index`` of an ``n``-choice request: vLLM gives each
        child request seed + index when n > 1 (vllm/v1/engine/parallel_sampling.py)."""
        if n > 1 and self.seed is not None:
            return replace(self, seed=self.seed + index)
        return self


def reproducibility_problem(sampling: SamplingSettings, profile: SamplerProfile) -> str | None:
    """Why ``profile`` cannot rebuild the noise of ``sampling``, or None when it can."""
    sampling = sampling.effective()
    if sampling.is_greedy:
        return None
    if not profile.samples:
        return f"profile {profile.name} verifies temperature 0 only"
    if sampling.seed is None:
        return "no seed: the prover's sampler noise cannot be rebuilt"
    return None


@dataclass(frozen=True, eq=False)
class DifrResult:
    """Token-DiFR outcome of one response."""

    #: Per-token margins, clipped at delta_max (float64).
    margins: npt.NDArray[np.float64]
    #: Mean clipped margin (0.0 for an empty response).
    score: float
    #: Tokens whose margin is exactly 0 (the sampler would have picked them).
    exact_matches: int
    n_tokens: int
    #: Claimed tokens the sampler could not pick (outside the mask): scored delta_max.
    out_of_mask: int

    @classmethod
    def from_raw_margins(cls, raw: npt.NDArray[np.float64], delta_max: float) -> DifrResult:
        """Clip raw margins (+inf = outside the mask) at delta_max and summarise."""
        if not delta_max > 0:
            raise DifrError(f"delta_max must be > 0, not {delta_max}")
        raw = np.asarray(raw, dtype=np.float64)
        clipped = np.minimum(raw, delta_max)
        return cls(
            margins=clipped,
            score=float(clipped.mean()) if clipped.size else 0.0,
            exact_matches=int(np.count_nonzero(raw == 0.0)),
            n_tokens=int(raw.size),
            out_of_mask=int(np.count_nonzero(np.isinf(raw))),
        )

    def passes(self, threshold: float) -> bool:
        return self.score <= threshold

    def margins_f16(self) -> bytes:
        """The margins as little-endian float16, 2 bytes per token."""
        return self.margins.astype("<f2").tobytes()

    @staticmethod
    def margins_from_f16(data: bytes) -> npt.NDArray[np.float64]:
        """Inverse of `margins_f16` (to float64)."""
        return np.frombuffer(data, dtype="<f2").astype(np.float64)


def scaled_logits(z: torch.Tensor, temperature: float) -> torch.Tensor:
    """float32(z) / float32(T), as vLLM's ``apply_temperature`` (a new tensor)."""
    return z.to(torch.float32) / torch.tensor(temperature, dtype=torch.float32, device=z.device)


def apply_min_p(x: torch.Tensor, min_p: float) -> torch.Tensor:
    """vLLM's MinPLogitsProcessor.apply on float32 ``x`` (in place; returns ``x``)."""
    if min_p == 0:
        return x
    probs = torch.nn.functional.softmax(x, dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True).mul_(
        torch.tensor(min_p, dtype=torch.float32, device=x.device)
    )
    return x.masked_fill_(probs < threshold, -float("inf"))


def apply_top_k_top_p(x: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """vLLM's CPU top-k/top-p mask (``apply_top_k_only`` / ``apply_top_k_top_p_pytorch``)
    of float32 ``x`` [rows, width], rows sharing one (top_k, top_p). Returns the masked
    logits; ``x`` may be modified in place.

    vLLM's top-p drops a prefix of the ascending sort, so only the sorted *values*
    matter (they do not depend on the sort algorithm): the drop count follows from
    them, and every token below the first kept value goes. On the CPU, rows at least
    SORT_FREE_MIN_WIDTH wide mostly get that value from `top_p_first_kept` without
    sorting the row; the rest (and every row on other devices) take `top_p_by_sort`.
    """
    width = x.shape[1]
    k_on = 0 < top_k < width
    if top_p >= 1:
        if not k_on:
            return x
        kth = x.topk(top_k, dim=1).values[:, top_k - 1 : top_k]
        return x.masked_fill_(x < kth, -float("inf"))
    if x.device.type != "cpu" or width < SORT_FREE_MIN_WIDTH:
        if k_on:
            kth = x.topk(top_k, dim=1).values[:, top_k - 1 : top_k]
            return top_p_by_sort(x, x.masked_fill(x < kth, -float("inf")), top_k, top_p)
        return top_p_by_sort(x, x, width, top_p)
    out = np.empty(x.shape, dtype=np.float32)
    block = max(1, BLOCK_ELEMENTS // width)
    for a in range(0, x.shape[0], block):
        xb = x[a : a + block].numpy()
        if k_on:
            first, decided = top_k_top_p_first_kept(xb, top_k, top_p)
        else:
            first, decided = top_p_first_kept(xb, top_p)
        ob = out[a : a + block]
        if decided.all():
            np.copyto(ob, xb)
            np.copyto(ob, np.float32(-np.inf), where=xb < first[:, None])
            continue
        if decided.any():
            done = np.flatnonzero(decided)
            ob[done] = np.where(xb[done] < first[done, None], np.float32(-np.inf), xb[done])
            xr = torch.from_numpy(xb[~decided])
        else:
            xr = x[a : a + block]
        if k_on:
            kth = xr.topk(top_k, dim=1).values[:, top_k - 1 : top_k]
            xkr = xr.masked_fill(xr < kth, -float("inf"))
        else:
            xkr = xr
        masked = top_p_by_sort(xr, xkr, top_k if k_on else width, top_p).numpy()
        if decided.any():
            ob[~decided] = masked
        else:
            ob[...] = masked
    return torch.from_numpy(out)


def top_p_by_sort(x: torch.Tensor, xk: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """The top-p mask of ``xk`` (``x`` after its top-k mask) from the sorted row, as
    vLLM computes it; ties between the first kept and the last dropped value take
    vLLM's own sort-and-scatter path (``torch.sort``'s tie order decides)."""
    if xk.device.type == "cpu":
        values = torch.from_numpy(np.sort(xk.numpy(), axis=-1))
    else:
        values = xk.sort(dim=-1).values
    probs = values.softmax(dim=-1)
    cum = torch.cumsum(probs, dim=-1, out=probs)
    # cum never decreases (vLLM's float32 cumsum accumulates in float64), so the
    # positions vLLM drops (cum <= 1 - p, never the last) are a prefix.
    limit = 1 - torch.tensor([[top_p]], dtype=torch.float32, device=x.device)
    n_drop = torch.searchsorted(cum, limit.expand(cum.shape[0], 1).contiguous(), right=True)
    n_drop.clamp_(max=cum.shape[1] - 1)
    first_kept = values.gather(1, n_drop)
    last_dropped = values.gather(1, (n_drop - 1).clamp_min(0))
    tied = ((n_drop > 0) & (last_dropped == first_kept)).view(-1)
    if xk.device.type == "cpu":
        xn = xk.numpy()
        out = torch.from_numpy(np.where(xn < first_kept.numpy(), np.float32(-np.inf), xn))
    else:
        out = xk.masked_fill(xk < first_kept, -float("inf"))
    if bool(tied.any()):
        out[tied] = _sort_and_scatter(x[tied], top_k, top_p)
    return out


def top_p_first_kept(
    x: npt.NDArray[np.float32], top_p: float
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_]]:
    """vLLM's first kept value of the top-p mask of each row of ``x`` [rows, width]
    (float32), found without sorting the rows, and whether it was decided (rows
    that were not get +inf and need `top_p_by_sort`).

    vLLM drops ascending position i when fl32(D_i) <= t, where t = fl32(1 - p) and
    D_i is its float64 running sum of the float32 softmax of the sorted row. In
    descending order: a token is dropped when the probability mass R of itself
    and every token after it is <= t. Only the tokens near that boundary matter.
    The candidates are the tokens with probability >= t / width (all the others
    together hold less than t, so they go), at most width / CANDIDATE_FRACTION of
    them, taken with a partition and sorted; `_certify` decides from them (a row
    whose boundary lies beyond the candidates stays undecided).
    """
    rows, width = x.shape
    first = np.full(rows, np.inf, dtype=np.float32)
    decided = np.zeros(rows, dtype=np.bool_)
    t = float(np.float32(1) - np.float32(top_p))
    m = x.max(axis=1, keepdims=True)
    # Rows with many tokens above the floor have a wide nucleus: they are sorted. A
    # sample of every 16th token spots most of them before the full exp pass.
    sample = torch.exp(torch.from_numpy(x[:, ::16] - m)).numpy()
    floor = (t / width) * sample.sum(axis=1, dtype=np.float64) * 16
    wide = np.count_nonzero(sample >= floor[:, None], axis=1) * 16 > width // 3
    live = np.flatnonzero(~wide)
    if live.size == 0:
        return first, decided
    if live.size < rows:
        x, m = x[live], m[live]
    q = torch.exp(torch.from_numpy(x - m)).numpy()
    s = q.sum(axis=1, dtype=np.float64)
    floor = (t / width) * (1 - 2.0**-10) * s
    need = np.count_nonzero(q >= floor.astype(np.float32)[:, None], axis=1) + 1
    narrow = need <= width // 2
    if not narrow.all():
        live, x, m, s, need = live[narrow], x[narrow], m[narrow], s[narrow], need[narrow]
    if live.size == 0:
        return first, decided
    k = min(int(need.max()), width // CANDIDATE_FRACTION)
    part = np.partition(x, width - k, axis=1)[:, width - k :]
    inside = torch.exp(torch.from_numpy(part - m)).numpy().astype(np.float64)
    outside = np.maximum(s - inside.sum(axis=1), 0.0) + s * 2.0**-20
    # Rows whose tokens beyond the candidates may hold t or more: the boundary may lie
    # beyond them.
    held = outside < t * s * (1 - 2.0**-10)
    live, part, inside, s, outside = live[held], part[held], inside[held], s[held], outside[held]
    if live.size == 0:
        return first, decided
    order = np.argsort(part, axis=1)[:, ::-1]
    v = np.take_along_axis(part, order, axis=1)
    inside = np.take_along_axis(inside, order, axis=1)
    first[live], decided[live] = _certify(
        v, inside, s, outside, width=width, top_p=top_p, last_run_complete=False
    )
    return first, decided


def top_k_top_p_first_kept(
    x: npt.NDArray[np.float32], top_k: int, top_p: float
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_]]:
    """`top_p_first_kept` after a top-k mask: vLLM's softmax gives the tokens top-k
    removed exactly 0, so the top-k values are the candidates. Rows where another
    token ties the k-th value (top-k keeps it too) are left undecided."""
    rows, width = x.shape
    v = -np.partition(-x, top_k - 1, axis=1)[:, :top_k]
    v = np.sort(v, axis=1)[:, ::-1]
    extra_ties = np.count_nonzero(x >= v[:, -1:], axis=1) > top_k
    inside = torch.exp(torch.from_numpy(v - v[:, :1])).numpy().astype(np.float64)
    s = inside.sum(axis=1)
    # After the k values comes a masked token: vLLM's running sum there is 0 <= t.
    v = np.append(v, np.full((rows, 1), -np.inf, dtype=np.float32), axis=1)
    inside = np.append(inside, np.zeros((rows, 1)), axis=1)
    first, decided = _certify(
        v, inside, s, np.zeros(rows), width=width, top_p=top_p, last_run_complete=True
    )
    first[extra_ties] = np.inf
    decided[extra_ties] = False
    return first, decided


def _certify(
    v: npt.NDArray[np.float32],
    inside: npt.NDArray[np.float64],
    s: npt.NDArray[np.float64],
    outside: npt.NDArray[np.float64],
    *,
    width: int,
    top_p: float,
    last_run_complete: bool,
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_]]:
    """The top-p boundary among candidates ``v`` [rows, n] (descending), accepted
    only where it holds for every value vLLM's float32 arithmetic can produce.

    ``inside``: our exp(v - max) (float64 of float32 values); ``s``: our sum of exp
    over the row; ``outside``: an upper bound of that sum over the non-candidates.
    Our mass R_j = (s - sum of inside before j) / s. The bound on |D_j - R_j|:
    each float32 softmax value of vLLM (and each of ours) is within relative
    2**-17 (exp; a 20-ulp exp is 2**-19.7) + 104 u (the rounding of x - max,
    |x - max| <= 104 where exp does not underflow) + 4 u (reciprocal, product;
    u = 2**-24) of the exact softmax, plus the relative error of vLLM's float32
    sum of exp over the sorted row. That sum runs through the row in ascending
    order (in lanes, then a few combining steps), so a token is in at most
    (number of tokens >= it) + 64 rounded partial sums, and the sum is off by at
    most u * sum_j e_j * depth_j; non-candidates count with depth width + 64.
    Float64 sums add at most width * 2**-52. The tests check rows whose boundary
    sits just outside the bound against vLLM's own function.

    A token is certainly dropped when R + bound <= t, certainly kept when
    R - bound >= the next float32 above t. The row is decided when the first
    certainly dropped candidate follows a certainly kept one of a different value.
    """
    rows, n = v.shape
    t = np.float32(1) - np.float32(top_p)
    t64, t_next = float(t), float(np.nextafter(t, np.float32(2)))
    prefix = np.cumsum(inside, axis=1) - inside
    mass = (s[:, None] - prefix) / s[:, None]
    # Depth: the number of candidates >= v_j (the end of v_j's run of equal values)
    # + 64; the last run may go on past the candidates unless told otherwise.
    index = np.arange(n)
    ends_here = np.append(v[:, :-1] != v[:, 1:], np.full((rows, 1), last_run_complete), axis=1)
    run_end = np.minimum.accumulate(np.where(ends_here, index, n)[:, ::-1], axis=1)[:, ::-1]
    depth = np.where(run_end < n, run_end + 1, width) + _DEPTH_SLACK
    spread = (inside * depth).sum(axis=1) + outside * (width + _DEPTH_SLACK)
    rel = spread * _U32 * 1.01 / s + 2 * (_EXP_REL + 108 * _U32)
    bound = mass * rel[:, None] + width * 2.0**-50 + 2.0**-120
    dropped = mass + bound <= t64
    kept = mass - bound >= t_next
    r = np.arange(rows)
    f = dropped.argmax(axis=1)
    last = np.maximum(f - 1, 0)
    ok = dropped[r, f] & (f >= 1) & kept[r, last] & (v[r, last] != v[r, f])
    first = np.where(ok, v[r, last], np.float32(np.inf)).astype(np.float32)
    return first, ok


def _sort_and_scatter(x: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """``apply_top_k_top_p_pytorch`` step for step (torch.sort's tie order decides)."""
    width = x.shape[1]
    x_sort, x_idx = x.sort(dim=-1, descending=False)
    kth = x_sort[:, width - top_k : width - top_k + 1]
    x_sort.masked_fill_(x_sort < kth, -float("inf"))
    probs = x_sort.softmax(dim=-1)
    cum = torch.cumsum(probs, dim=-1, out=probs)
    drop = cum <= 1 - torch.tensor(top_p, dtype=torch.float32, device=x.device)
    drop[:, -1] = False
    x_sort.masked_fill_(drop, -float("inf"))
    return x.scatter_(dim=-1, index=x_idx, src=x_sort)


def token_margins(
    z: torch.Tensor,
    claimed: torch.Tensor,
    sampling: SamplingSettings,
    stream: NoiseStream | None,
    start: int,
) -> torch.Tensor:
    """Raw margins (logit units, float64, +inf = unpickable) of ``claimed`` [n] given
    raw logits ``z`` [n, width] for output positions [start, start + n).

    ``sampling`` must already be `SamplingSettings.effective`; ``stream`` is the
    response's noise stream (None only for greedy settings).
    """
    noise = () if stream is None else (StreamRows(stream, start, start + z.shape[0]),)
    return token_scores(z, claimed, sampling, noise).margins


def token_scores(
    z: torch.Tensor,
    claimed: torch.Tensor,
    sampling: SamplingSettings,
    noise: Sequence[StreamRows],
) -> RowScores:
    """`token_margins` (in logit units) and the token the sampler itself picks at
    each position (greedy: the first largest logit).

    The rows may belong to several responses with the same ``sampling`` but their
    own seeds: ``noise`` names each one's stream and positions in row order (none
    for greedy settings), and `score_stacked` scores them together."""
    if z.ndim != 2 or claimed.shape != (z.shape[0],):
        raise DifrError(f"logits {tuple(z.shape)} and claimed {tuple(claimed.shape)} disagree")
    width = z.shape[1]
    claimed = claimed.to(device=z.device, dtype=torch.int64)
    valid = (claimed >= 0) & (claimed < width)
    safe = torch.where(valid, claimed, 0)
    if sampling.is_greedy:
        z32 = z.to(torch.float32)
        top = z32.max(dim=1)
        mine = z32.gather(1, safe.view(-1, 1)).view(-1).to(torch.float64)
        raw = (top.values.to(torch.float64) - mine).clamp_min(0.0)
        best = z32.argmax(dim=1)
    else:
        if sum(p.stop - p.start for p in noise) != z.shape[0]:
            raise DifrError(f"sampled settings need the noise of all {z.shape[0]} rows")
        x = scaled_logits(z, sampling.temperature)
        x = apply_top_k_top_p(apply_min_p(x, sampling.min_p), sampling.top_k, sampling.top_p)
        scored = score_stacked(x, safe, noise)
        raw = scored.margins.to(z.device) * sampling.temperature
        best = scored.best.to(z.device)
    return RowScores(torch.where(valid, raw, torch.inf), best.to(torch.int64))


def open_stream(
    sampling: SamplingSettings,
    profile: SamplerProfile,
    prompt_len: int,
    width: int,
    device: torch.device,
) -> NoiseStream | None:
    """The noise stream for one response (None for greedy settings).

    Raises NotReproducibleError when the profile cannot rebuild the noise."""
    sampling = sampling.effective()
    problem = reproducibility_problem(sampling, profile)
    if problem is not None:
        raise NotReproducibleError(problem)
    if sampling.is_greedy:
        return None
    assert sampling.seed is not None
    return profile.stream(sampling.seed, prompt_len, width, device)


def score_margins(
    logits: torch.Tensor,
    output_ids: Sequence[int] | torch.Tensor,
    sampling: SamplingSettings,
    profile: SamplerProfile,
    *,
    prompt_len: int,
    delta_max: float,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
) -> DifrResult:
    """Score one whole response: ``logits`` [n, width] are the raw logits rows that
    predicted each of the n ``output_ids`` (row t = position prompt_len - 1 + t)."""
    claimed = torch.as_tensor(output_ids, dtype=torch.int64)
    if logits.ndim != 2 or logits.shape[0] != claimed.shape[0]:
        raise DifrError(
            f"{claimed.shape[0]} output ids need as many logits rows, got {tuple(logits.shape)}"
        )
    effective = sampling.effective()
    stream = open_stream(effective, profile, prompt_len, logits.shape[1], logits.device)
    parts = [
        token_margins(logits[i : i + chunk_rows], claimed[i : i + chunk_rows], effective, stream, i)
        for i in range(0, claimed.shape[0], chunk_rows)
    ]
    raw = torch.cat(parts).cpu().numpy() if parts else np.zeros(0, dtype=np.float64)
    return DifrResult.from_raw_margins(raw, delta_max)

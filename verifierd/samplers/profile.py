"""What a sampler profile is: the rebuilt random noise of one prover sampler.

A *sampler profile* names one exact way an engine turns (logits, seed) into a
token. For Token-DiFR the verifier needs, per generated token, the noise the
prover's sampler drew and the objective it maximised. A profile hands out one
`NoiseStream` per response; the stream yields, for consecutive output
positions, the sampler-space margin of the claimed token:

    margin_t = max_j s_j - s_y        (s = the sampler's own argmax objective)

computed with the same float operations the sampler used, so a claimed token
that is exactly the sampler's argmax scores 0.0, not "about 0". For Gumbel-max
samplers s_j = x_j + G_j with x the masked, temperature-scaled logits; for the
exponential race s_j = log(p_j / q_j). The scorer (verifierd.difr) multiplies
by the temperature, giving logit units: max_j(z_j + T*G_j) - (z_y + T*G_y).

Noise width is always the model's logits dimension, never len(tokenizer).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence
from typing import ClassVar, NamedTuple

import numpy as np
import numpy.typing as npt
import torch

from verifierd.errors import VerifierdError

CPU = torch.device("cpu")


class SamplerError(VerifierdError):
    """Base of sampler-profile errors."""


class UnknownProfileError(SamplerError):
    """No profile is registered under the name asked for."""


class NotReproducibleError(SamplerError):
    """The prover's noise cannot be rebuilt (no seed, or a greedy-only profile at T > 0)."""


class StreamOrderError(SamplerError):
    """A stateful noise stream was read out of order."""


class RowScores(NamedTuple):
    """What the sampler makes of rows of logits: the claimed tokens' margins and
    the token it picks itself (the argmax of its objective)."""

    #: float64 [n], >= 0, +inf where the claimed token is outside the mask.
    margins: torch.Tensor
    #: int64 [n], on the device of the margins.
    best: torch.Tensor


class NoiseStream(ABC):
    """The noise of one response, read in order of output position.

    Stateful streams (a torch.Generator replayed step by step) accept each row
    range once, starting where the previous one stopped; stateless ones accept
    any range. `gumbel`, `score` and `margins` read the same rows, so use one of
    them per range; `skip` passes rows over without computing them.
    """

    def __init__(self, width: int) -> None:
        if width < 1:
            raise SamplerError("noise width must be positive")
        self.width = width

    @abstractmethod
    def gumbel(self, start: int, stop: int) -> torch.Tensor:
        """Gumbel values G for output positions [start, stop): float64 [stop-start, width]."""

    def score(self, x: torch.Tensor, claimed: torch.Tensor, start: int) -> RowScores:
        """Sampler-space margins of ``claimed`` for positions [start, start + len(x))
        and the sampler's own picks there.

        ``x``: float32 [n, width] logits after temperature and the sampling mask
        (-inf outside it); ``claimed``: int64 [n].
        """
        return self.score_noise(x, claimed, self.noise_rows(start, start + x.shape[0]))

    def noise_rows(self, start: int, stop: int) -> torch.Tensor:
        """What `score_noise` needs of positions [start, stop), one entry per row
        along dim 0 (streams with the same `join_key` stack theirs with torch.cat)."""
        return self.gumbel(start, stop)

    def score_noise(self, x: torch.Tensor, claimed: torch.Tensor, noise: torch.Tensor) -> RowScores:
        """`score` of rows whose `noise_rows` are ``noise`` (possibly stacked from
        several streams of this one's `join_key`)."""
        return margin_of(x.to(torch.float64) + noise.to(x.device), claimed)

    @property
    def join_key(self) -> Hashable | None:
        """Streams with equal keys score their rows in one `score_noise` call
        (`score_stacked`); None: this stream scores its rows on its own."""
        return (type(self), self.width)

    def margins(self, x: torch.Tensor, claimed: torch.Tensor, start: int) -> torch.Tensor:
        """`score`'s margins alone: float64 [n], >= 0, +inf outside the mask."""
        return self.score(x, claimed, start).margins

    def skip(self, stop: int) -> None:
        """Pass over the rows before ``stop`` that were not read (a stateful stream
        draws them; a stateless one has nothing to do)."""
        return None

    def resumed(self, start: int) -> NoiseStream | None:
        """A stream of its own that reads from position ``start`` on exactly as a
        fresh stream of this response skipped to ``start`` would; None when this
        stream has drawn rows past ``start`` and cannot go back. A stateless stream
        is its own."""
        return self


class SamplerProfile(ABC):
    """One prover sampler, rebuilt. Registered by `name` in verifierd.samplers."""

    name: ClassVar[str]
    #: Whether temperature > 0 can be verified (False for the greedy-only profile).
    samples: ClassVar[bool] = True

    @abstractmethod
    def stream(self, seed: int, prompt_len: int, width: int, device: torch.device) -> NoiseStream:
        """The noise stream of one response: ``seed`` is the request's sampling seed,
        ``prompt_len`` its prompt length in tokens, ``width`` the logits dimension."""

    def noise(
        self, seed: int, prompt_len: int, n_tokens: int, width: int
    ) -> npt.NDArray[np.float64] | None:
        """Gumbel values G [n_tokens, width] (float64) of the first n_tokens output
        positions, or None for a profile that draws no noise."""
        rows = self.stream(seed, prompt_len, width, CPU).gumbel(0, n_tokens)
        out: npt.NDArray[np.float64] = rows.numpy()
        return out


def margin_of(scores: torch.Tensor, claimed: torch.Tensor) -> RowScores:
    """max_j s_j - s_y per row in float64 (+inf where s_y is -inf: outside the mask),
    and argmax_j s_j (the first index among ties, as torch.argmax and vLLM's kernels)."""
    top = scores.max(dim=1)
    mine = scores.gather(1, claimed.view(-1, 1).to(scores.device)).view(-1)
    out = top.values.to(torch.float64) - mine.to(torch.float64)
    margins = torch.where(torch.isneginf(mine), torch.inf, out.clamp_min(0.0))
    return RowScores(margins, scores.argmax(dim=1))


class StreamRows(NamedTuple):
    """Positions [start, stop) of one response's noise stream."""

    stream: NoiseStream
    start: int
    stop: int


def score_stacked(x: torch.Tensor, claimed: torch.Tensor, parts: Sequence[StreamRows]) -> RowScores:
    """`NoiseStream.score` of rows stacked from several responses: ``parts`` name the
    stream and positions of consecutive rows of ``x`` (their lengths sum to len(x)),
    all with one `join_key` unless there is a single part. Row for row the same
    values as scoring each part on its own."""
    first = parts[0].stream
    if len(parts) == 1:
        return first.score(x, claimed, parts[0].start)
    noise = torch.cat([p.stream.noise_rows(p.start, p.stop) for p in parts])
    return first.score_noise(x, claimed, noise)

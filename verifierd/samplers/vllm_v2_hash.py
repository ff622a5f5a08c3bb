"""`vllm-v2-hash[-fp64]`: Model Runner V2's stateless Gumbel noise (vLLM 0.32).

Rebuilt from vllm/v1/worker/gpu/sample/gumbel.py (Triton, GPU only):

- The noise of token id i at output position t is a hash of (seed, pos, i),
  pos = the absolute position of the last input token = prompt_len - 1 + t
  (``input_batch.positions[logits_indices]``). No state: any subset of
  positions can be checked on its own.
- murmur3_hash32(seed, pos, i, domain): h = domain; h = mix(h, seed low 32
  bits); mix(seed high 32 bits); mix(pos low 32 bits); mix(i); fmix32(h ^ 16),
  with mix/fmix32 the MurmurHash3 x86_32 body and finaliser.
- float32 path (default): u = hi16 * 2**-16 + (lo16 + 0.5) * 2**-32 rounded to
  float32; g = -log(-log1p(-u)) with log1p(-u) a degree-8 Horner series for
  u < 0.25 and log(max(1 - u, 2**-24)) otherwise; objective float32 x + g.
- ``use_fp64_gumbel`` path: 53 random bits from two hashes (domains 0 and
  0x9E3779B9), u = (bits + 0.5) * 2**-53 (kept below 1), g = -log(-log u) in
  float64; objective float64 x + g.
- x is the masked logits divided by the temperature in float32 (Triton
  ``_temperature_kernel``; skipped for T = 1); unseeded requests draw a random
  int64 seed that is never exposed, so only seeded traffic is verifiable.

Triton's fp32 ``log``/division and its fused multiply-adds round differently
from torch on the last bit; the Horner series is evaluated with float64
products (exact for float32 inputs) to stay as close as possible. Agreement
with vLLM's own kernel is checked on a GPU by tests/gpu/test_v2_hash_gpu.py.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import torch

from verifierd.samplers.int_bits import MASK32, mul32, rotl32, shr64
from verifierd.samplers.profile import NoiseStream, RowScores, SamplerProfile, margin_of

DOMAIN_HI = 0x9E3779B9
_F32_MIN_ONE_MINUS = 5.960464477539063e-08
_LOG1P_SERIES = tuple(1.0 / k for k in range(8, 0, -1))


def _mix(h: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    key = mul32(key, 0xCC9E2D51)
    key = rotl32(key, 15)
    key = mul32(key, 0x1B873593)
    h = h ^ key
    h = rotl32(h, 13)
    return (h * 5 + 0xE6546B64) & MASK32


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    h = h ^ (h >> 16)
    h = mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def murmur3_hash32(
    seed: int, pos: torch.Tensor, token: torch.Tensor, domain: int = 0
) -> torch.Tensor:
    """The uint32 hash of (seed, pos, token) as int64, broadcasting pos against token."""
    h = torch.full((), domain, dtype=torch.int64, device=token.device)
    seed_lo = torch.tensor(seed & MASK32, dtype=torch.int64, device=token.device)
    seed_hi = torch.tensor((seed >> 32) & MASK32, dtype=torch.int64, device=token.device)
    h = _mix(h, seed_lo)
    h = _mix(h, seed_hi)
    h = _mix(h, pos.to(torch.int64) & MASK32)
    h = _mix(h, token.to(torch.int64) & MASK32)
    return _fmix32(h ^ 16)


def uniform32(seed: int, pos: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    r = murmur3_hash32(seed, pos, token)
    hi = (r >> 16).to(torch.float32) * 1.52587890625e-05
    lo = ((r & 0xFFFF).to(torch.float32) + 0.5) * 2.3283064365386963e-10
    return hi + lo


def uniform64(seed: int, pos: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    lo = murmur3_hash32(seed, pos, token)
    hi = murmur3_hash32(seed, pos, token, domain=DOMAIN_HI)
    bits = shr64((hi << 32) | lo, 11)
    u = (bits.to(torch.float64) + 0.5) * 1.1102230246251565e-16
    return torch.where(u == 1.0, u - 1.1102230246251565e-16, u)


def log1p_neg_stable(u: torch.Tensor) -> torch.Tensor:
    """log(1 - u) for float32 u as the kernel computes it (series below 0.25)."""
    v = u.to(torch.float64)
    poly = torch.full_like(u, _LOG1P_SERIES[0])
    for c in _LOG1P_SERIES[1:]:
        poly = (torch.tensor(c, dtype=torch.float32).double() + v * poly.double()).float()
    series = -(u * poly)
    direct = torch.log(torch.clamp(1.0 - u, min=_F32_MIN_ONE_MINUS))
    return torch.where(u < 0.25, series, direct)


def gumbel32(seed: int, pos: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    return -torch.log(-log1p_neg_stable(uniform32(seed, pos, token)))


def gumbel64(seed: int, pos: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    return -torch.log(-torch.log(uniform64(seed, pos, token)))


GumbelSample = Callable[..., torch.Tensor]


def triton_sampler() -> GumbelSample | None:
    """vLLM's Model Runner V2 ``gumbel_sample`` when it can run here (CUDA + Triton)."""
    if not torch.cuda.is_available():
        return None
    try:
        from vllm.v1.worker.gpu.sample.gumbel import gumbel_sample
    except ImportError:
        return None
    sampler: GumbelSample = gumbel_sample
    return sampler


class HashStream(NoiseStream):
    """Stateless: position t of the response hashes pos = prompt_len - 1 + t.

    On a GPU with vLLM's V2 sampler at hand, `margins` lets vLLM's own Triton
    kernel find the argmax (one fused pass, the prover's exact arithmetic) and
    evaluates the rebuilt noise only at the argmax and the claimed token; the
    full-row rebuild is the fallback and the reference the GPU tests compare with.
    """

    def __init__(
        self,
        seed: int,
        prompt_len: int,
        width: int,
        device: torch.device,
        *,
        fp64: bool,
        sampler: GumbelSample | None = None,
    ) -> None:
        super().__init__(width)
        self._seed = seed
        self._first_pos = prompt_len - 1
        self._device = device
        self._fp64 = fp64
        self._sampler = sampler

    def _positions(self, start: int, stop: int, device: torch.device) -> torch.Tensor:
        return torch.arange(start, stop, dtype=torch.int64, device=device) + self._first_pos

    def _noise_at(self, pos: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
        return (gumbel64 if self._fp64 else gumbel32)(self._seed, pos, token)

    def _noise(self, start: int, stop: int) -> torch.Tensor:
        pos = self._positions(start, stop, self._device).view(-1, 1)
        token = torch.arange(self.width, dtype=torch.int64, device=self._device).view(1, -1)
        return self._noise_at(pos, token)

    def gumbel(self, start: int, stop: int) -> torch.Tensor:
        return self._noise(start, stop).to(torch.float64)

    def noise_rows(self, start: int, stop: int) -> torch.Tensor:
        return self._noise(start, stop)

    def score_noise(self, x: torch.Tensor, claimed: torch.Tensor, noise: torch.Tensor) -> RowScores:
        dtype = torch.float64 if self._fp64 else torch.float32
        claimed = claimed.to(torch.int64).view(-1).to(x.device)
        return margin_of(x.to(dtype) + noise.to(x.device), claimed)

    @property
    def join_key(self) -> Hashable | None:
        # vLLM's kernel takes one stream here: rows it scores are not stacked.
        return None if self._sampler is not None else (type(self), self.width, self._fp64)

    def score(self, x: torch.Tensor, claimed: torch.Tensor, start: int) -> RowScores:
        if self._sampler is None or x.device.type != "cuda":
            return super().score(x, claimed, start)
        dtype = torch.float64 if self._fp64 else torch.float32
        claimed = claimed.to(torch.int64).view(-1).to(x.device)
        n = x.shape[0]
        pos = self._positions(start, start + n, x.device)
        top = self._sampler(
            x.to(torch.float32).contiguous(),
            torch.zeros(n, dtype=torch.int32, device=x.device),  # every row: request 0
            torch.ones(1, dtype=torch.float32, device=x.device),  # x is already scaled
            torch.tensor([self._seed], dtype=torch.int64, device=x.device),
            pos,
            apply_temperature=False,
            is_drafting=False,
            use_fp64=self._fp64,
        )
        x_top = x.gather(1, top.view(-1, 1)).view(-1).to(dtype)
        x_mine = x.gather(1, claimed.view(-1, 1)).view(-1).to(dtype)
        s_top = (x_top + self._noise_at(pos, top)).to(torch.float64)
        s_mine = (x_mine + self._noise_at(pos, claimed)).to(torch.float64)
        margins = torch.where(torch.isneginf(x_mine), torch.inf, (s_top - s_mine).clamp_min(0.0))
        return RowScores(margins, top.to(torch.int64).view(-1))


class VllmV2Hash(SamplerProfile):
    """Model Runner V2, default float32 Gumbel noise."""

    name = "vllm-v2-hash"
    fp64 = False

    def __init__(self, use_kernel: bool = True) -> None:
        self._use_kernel = use_kernel

    def stream(self, seed: int, prompt_len: int, width: int, device: torch.device) -> NoiseStream:
        sampler = triton_sampler() if self._use_kernel and device.type == "cuda" else None
        return HashStream(seed, prompt_len, width, device, fp64=self.fp64, sampler=sampler)


class VllmV2HashFp64(VllmV2Hash):
    """Model Runner V2 with ``use_fp64_gumbel=True``."""

    name = "vllm-v2-hash-fp64"
    fp64 = True

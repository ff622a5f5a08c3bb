"""Sampler profiles against scalar transcriptions of vLLM's code and, where it runs on CPU,
against vLLM's own kernels and functions."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from verifierd.samplers import (
    PROFILE_NAMES,
    NotReproducibleError,
    StreamOrderError,
    UnknownProfileError,
    get_profile,
)
from verifierd.samplers.vllm_cpu_splitmix import SplitmixStream, fused_kernel, gumbel_at
from verifierd.samplers.vllm_v1_exponential import ExponentialStream
from verifierd.samplers.vllm_v2_hash import HashStream, gumbel32, gumbel64, murmur3_hash32

CPU = torch.device("cpu")
M32 = 0xFFFFFFFF
M64 = (1 << 64) - 1


# Scalar transcriptions, in plain Python integers, of the C++ and Triton sources.
def py_splitmix64(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def py_splitmix_gumbel(step_seed: int, token: int) -> float:
    key = py_splitmix64(step_seed & M64)
    bits = py_splitmix64((key + (token + 1) * 0x9E3779B97F4A7C15) & M64) >> 11
    u = (float(bits) + 0.5) * 2.0**-53
    return -math.log(-math.log(u))


def py_rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & M32


def py_murmur(seed: int, pos: int, token: int, domain: int = 0) -> int:
    def mix(h: int, k: int) -> int:
        k = (k * 0xCC9E2D51) & M32
        k = py_rotl(k, 15)
        k = (k * 0x1B873593) & M32
        h = py_rotl(h ^ k, 13)
        return (h * 5 + 0xE6546B64) & M32

    h = domain
    for key in (seed & M32, (seed >> 32) & M32, pos & M32, token & M32):
        h = mix(h, key)
    h ^= 16
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M32
    return h ^ (h >> 16)


def test_registry() -> None:
    assert set(PROFILE_NAMES) == {
        "greedy",
        "vllm-cpu-splitmix",
        "vllm-v1-exponential",
        "vllm-v1-exponential-fp64",
        "vllm-v2-hash",
        "vllm-v2-hash-fp64",
    }
    for name in PROFILE_NAMES:
        assert get_profile(name).name == name
    with pytest.raises(UnknownProfileError, match="known:"):
        get_profile("vllm-v9")


def test_step_seeds_are_single_draws_of_the_request_generator() -> None:
    gen = torch.Generator(CPU).manual_seed(1234)
    one_by_one = [int(torch.randint(0, 2**31, (1,), generator=gen)) for _ in range(300)]
    stream = SplitmixStream(1234, 10, kernel=None)
    assert stream.step_seeds(0, 120).tolist() == one_by_one[:120]
    assert stream.step_seeds(100, 300).tolist() == one_by_one[100:]


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**31 - 1), st.lists(st.integers(0, 200_000), min_size=1, max_size=20))
def test_splitmix_gumbel_matches_scalar_transcription(seed: int, tokens: list[int]) -> None:
    ours = gumbel_at(torch.tensor(seed), torch.tensor(tokens)).tolist()
    assert ours == pytest.approx([py_splitmix_gumbel(seed, t) for t in tokens], rel=1e-15)


def test_noise_width_is_the_logits_width() -> None:
    profile = get_profile("vllm-cpu-splitmix")
    noise = profile.noise(seed=3, prompt_len=5, n_tokens=4, width=2176)
    assert noise is not None and noise.shape == (4, 2176) and noise.dtype == np.float64
    wider = profile.noise(seed=3, prompt_len=5, n_tokens=4, width=3000)
    assert wider is not None and np.array_equal(wider[:, :2176], noise)
    assert get_profile("greedy").noise(seed=3, prompt_len=5, n_tokens=4, width=10) is None


@pytest.mark.vllm
@pytest.mark.parametrize(("width", "rows"), [(7, 64), (2176, 64), (32000, 32), (151936, 8)])
def test_splitmix_matches_vllm_cpu_kernel(width: int, rows: int) -> None:
    pytest.importorskip("vllm._custom_ops")
    kernel = fused_kernel()
    assert kernel is not None
    gen = torch.Generator().manual_seed(width)
    x = torch.randn(rows, width, generator=gen) * 3 / 0.7
    x[::2, width // 3 :] = -torch.inf  # masked tails, as top-k/top-p leave them
    seeds = torch.randint(0, 2**31, (rows,), generator=gen)
    expected = kernel(x, seeds)
    ours = (x.double() + gumbel_at(seeds.view(-1, 1), torch.arange(width).view(1, -1))).argmax(1)
    assert torch.equal(ours, expected)
    # The scorer's margins: 0 at the kernel's choice, identical with and without the kernel.
    fast = SplitmixStream(0, width, kernel)
    full = SplitmixStream(0, width, None)
    for s in (fast, full):
        s._seeds = seeds  # the step seeds of these rows
    assert fast.margins(x, expected, 0).abs().max() == 0.0
    claimed = torch.randint(0, width // 3, (rows,), generator=gen)
    assert torch.equal(fast.margins(x, claimed, 0), full.margins(x, claimed, 0))


def test_exponential_rows_replay_the_request_generator() -> None:
    gen = torch.Generator(CPU).manual_seed(11)
    q = torch.empty(3, 500, dtype=torch.float64)
    for i in range(3):
        q[i].exponential_(generator=gen)
    stream = ExponentialStream(11, 500, CPU, torch.float64)
    assert torch.equal(stream.exponential_rows(0, 2), q[:2])
    assert torch.equal(stream.exponential_rows(2, 3), q[2:])
    with pytest.raises(StreamOrderError):
        stream.exponential_rows(0, 1)
    g = get_profile("vllm-v1-exponential-fp64").noise(seed=11, prompt_len=1, n_tokens=3, width=500)
    assert g is not None and np.array_equal(g, (-torch.log(q)).numpy())


@pytest.mark.vllm
@pytest.mark.parametrize("fp64", [False, True])
def test_exponential_margins_zero_at_vllm_random_sample(fp64: bool) -> None:
    ops = pytest.importorskip("vllm.v1.sample.ops.topk_topp_sampler")
    width, steps, seed = 1000, 12, 5
    logits = torch.randn(steps, width, generator=torch.Generator().manual_seed(1)) * 2
    vllm_gen = torch.Generator(CPU).manual_seed(seed)
    chosen = []
    for t in range(steps):
        probs = logits[t : t + 1].softmax(dim=-1, dtype=torch.float32)
        chosen.append(int(ops.random_sample(probs, {0: vllm_gen}, use_fp64_gumbel=fp64)))
    name = "vllm-v1-exponential-fp64" if fp64 else "vllm-v1-exponential"
    stream = get_profile(name).stream(seed, 3, width, CPU)
    margins = stream.margins(logits.clone(), torch.tensor(chosen), 0)
    assert margins.tolist() == [0.0] * steps
    other = get_profile(name).stream(seed + 1, 3, width, CPU)
    assert other.margins(logits.clone(), torch.tensor(chosen), 0).mean() > 0.5


@settings(max_examples=40, deadline=None)
@given(
    st.integers(-(2**63), 2**63 - 1),
    st.integers(0, 2**40),
    st.lists(st.integers(0, 2**20), min_size=1, max_size=8),
    st.sampled_from([0, 0x9E3779B97F4A7C15 & M32]),
)
def test_murmur3_matches_scalar_transcription(
    seed: int, pos: int, tokens: list[int], domain: int
) -> None:
    ours = murmur3_hash32(seed, torch.tensor([pos]), torch.tensor(tokens), domain).tolist()
    assert ours == [py_murmur(seed, pos, t, domain) for t in tokens]


def test_v2_uniforms_and_gumbels() -> None:
    pos = torch.arange(10, 42).view(-1, 1)
    tok = torch.arange(4096).view(1, -1)
    r = murmur3_hash32(99, pos, tok)
    u32 = ((r >> 16).double() * 2**-16 + ((r & 0xFFFF).double() + 0.5) * 2**-32).float()
    g32 = gumbel32(99, pos, tok)
    g64 = gumbel64(99, pos, tok)
    assert g32.dtype == torch.float32 and g64.dtype == torch.float64
    # float32 noise is the float64 formula on the same uniform, to float32 rounding.
    assert torch.allclose(g32.double(), -torch.log(-torch.log1p(-u32.double())), atol=2e-6)
    for g in (g32.double(), g64):
        assert abs(float(g.mean()) - 0.5772) < 0.01  # Euler-Mascheroni: Gumbel(0, 1) mean
        assert abs(float(g.var()) - math.pi**2 / 6) < 0.03


def test_v2_noise_is_stateless_and_keyed_by_absolute_position() -> None:
    a = HashStream(7, prompt_len=20, width=300, device=CPU, fp64=False)
    b = HashStream(7, prompt_len=21, width=300, device=CPU, fp64=False)
    rows = a.gumbel(0, 10)
    assert torch.equal(a.gumbel(4, 7), rows[4:7])  # any subset, any order
    assert torch.equal(b.gumbel(0, 9), rows[1:])  # pos = prompt_len - 1 + t
    assert not torch.equal(HashStream(8, 20, 300, CPU, fp64=False).gumbel(0, 10), rows)


def test_greedy_profile_draws_nothing() -> None:
    with pytest.raises(NotReproducibleError):
        get_profile("greedy").stream(1, 1, 10, CPU)

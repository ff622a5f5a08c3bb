"""GPU checks of the sampler profiles against vLLM's own CUDA/Triton code.

Run on a GPU host with the CUDA build of vLLM (``bash bench/gpu_check.sh`` runs
``pytest -m gpu tests/gpu``); everything skips cleanly without CUDA or vLLM.

- `vllm-v2-hash[-fp64]` noise, value by value, against Model Runner V2's Triton
  kernel (vllm/v1/worker/gpu/sample/gumbel.py ``_gumbel_sample_kernel``): each
  row of the probe leaves one token per 1024-wide block finite, so the kernel's
  per-block maximum *is* that token's noise.
- The tokens vLLM's ``gumbel_sample`` picks score margin 0 with our profile.
- `vllm-v1-exponential[-fp64]` against the V1 ``random_sample`` with a CUDA generator.
- The scorer's top-k/top-p mask against vLLM's GPU ``apply_top_k_top_p`` (Triton).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

from verifierd.difr import apply_top_k_top_p, scaled_logits
from verifierd.samplers import get_profile
from verifierd.samplers.vllm_v2_hash import VllmV2Hash, VllmV2HashFp64, gumbel32, gumbel64

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU with CUDA"),
]

BLOCK = 1024
WIDTHS = (2176, 151936)


def _gumbel_module() -> Any:
    return pytest.importorskip("vllm.v1.worker.gpu.sample.gumbel")


def _kernel_noise(width: int, seed: int, pos: int, fp64: bool) -> torch.Tensor:
    """Per-token noise read out of vLLM's kernel: [width] (float32 or float64)."""
    gumbel = _gumbel_module()
    dev = torch.device("cuda")
    rows = torch.arange(BLOCK, device=dev).view(-1, 1)
    tokens = torch.arange(width, device=dev).view(1, -1)
    logits = torch.where(tokens % BLOCK == rows, 0.0, -torch.inf).to(torch.float32)
    num_blocks = (width + BLOCK - 1) // BLOCK
    local_argmax = torch.empty(BLOCK, num_blocks, dtype=torch.int64, device=dev)
    local_max = torch.empty(
        BLOCK, num_blocks, dtype=torch.float64 if fp64 else torch.float32, device=dev
    )
    gumbel._gumbel_sample_kernel[(BLOCK, num_blocks)](
        local_argmax,
        local_argmax.stride(0),
        local_max,
        local_max.stride(0),
        None,
        0,
        0,
        None,
        None,
        0,
        logits,
        logits.stride(0),
        torch.zeros(BLOCK, dtype=torch.int32, device=dev),  # every row is request 0
        torch.tensor([seed], dtype=torch.int64, device=dev),
        torch.full((BLOCK,), pos, dtype=torch.int64, device=dev),
        torch.ones(1, dtype=torch.float32, device=dev),
        width,
        BLOCK_SIZE=BLOCK,
        IS_DRAFTING=False,
        APPLY_TEMPERATURE=False,
        USE_FP64=fp64,
        PER_TOKEN_COL=False,
    )
    # local_max[r, b] is the noise of token r + BLOCK * b.
    return local_max.t().reshape(-1)[:width]


@pytest.mark.parametrize("fp64", [False, True])
@pytest.mark.parametrize("width", WIDTHS)
def test_v2_noise_values_equal_the_triton_kernel(width: int, fp64: bool) -> None:
    for seed, pos in ((0, 0), (12345, 17), (2**40 + 3, 4096), (-7, 100_000)):
        kernel = _kernel_noise(width, seed, pos, fp64).double().cpu()
        token = torch.arange(width)
        ours = (gumbel64 if fp64 else gumbel32)(seed, torch.tensor(pos), token).double()
        diff = (ours - kernel).abs()
        equal = float((diff == 0).double().mean())
        print(
            f"v2 noise fp64={fp64} width={width} seed={seed} pos={pos}: "
            f"bit-equal {equal:.6f}, max |diff| {float(diff.max()):.3g}"
        )
        assert float(diff.max()) < (1e-12 if fp64 else 1e-5)


@pytest.mark.parametrize("fp64", [False, True])
def test_v2_sampled_tokens_score_zero(fp64: bool) -> None:
    gumbel = _gumbel_module()
    dev = torch.device("cuda")
    width, n = 151936, 256
    gen = torch.Generator(device=dev).manual_seed(3)
    z = torch.randn(n, width, device=dev, generator=gen) * 2.5
    temps = torch.tensor([0.7, 1.0, 1.3, 0.5], device=dev).repeat(n // 4)
    seeds = torch.arange(n, dtype=torch.int64, device=dev) * 7919 + 11
    pos = torch.arange(n, dtype=torch.int64, device=dev) + 40
    sampled = gumbel.gumbel_sample(
        z.clone(),
        torch.arange(n, dtype=torch.int32, device=dev),
        temps,
        seeds,
        pos,
        apply_temperature=True,
        is_drafting=False,
        use_fp64=fp64,
    )
    # The full-row rebuild (no vLLM kernel inside the profile): an independent check.
    profile = (VllmV2HashFp64 if fp64 else VllmV2Hash)(use_kernel=False)
    margins = []
    for i in range(n):
        t = float(temps[i])
        stream = profile.stream(int(seeds[i]), prompt_len=int(pos[i]) + 1, width=width, device=dev)
        x = scaled_logits(z[i : i + 1], t)
        margins.append(float(stream.margins(x, sampled[i : i + 1], 0)[0]) * t)
    exact = sum(m == 0.0 for m in margins) / n
    print(f"v2 gumbel_sample fp64={fp64}: exact {exact:.4f}, max margin {max(margins):.3g}")
    assert exact >= 0.99 and max(margins) < 1e-3


@pytest.mark.parametrize("fp64", [False, True])
def test_v2_kernel_margins_equal_the_full_rebuild(fp64: bool) -> None:
    """The fast path (vLLM's kernel finds the argmax, our noise at two tokens) gives the
    full-row rebuild's margins."""
    _gumbel_module()
    dev = torch.device("cuda")
    width, n = 151936, 512
    gen = torch.Generator(device=dev).manual_seed(4)
    x = torch.randn(n, width, device=dev, generator=gen) * 3
    x[::3, 1000:] = -torch.inf  # masked rows, as top-k/top-p leave them
    claimed = torch.randint(0, 1000, (n,), device=dev, generator=gen)
    fast_profile = (VllmV2HashFp64 if fp64 else VllmV2Hash)()
    full_profile = (VllmV2HashFp64 if fp64 else VllmV2Hash)(use_kernel=False)
    timings = []
    for profile in (fast_profile, full_profile):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        m = profile.stream(77, 30, width, dev).margins(x, claimed, 5)
        torch.cuda.synchronize()
        timings.append((time.perf_counter() - t0, m))
    (t_fast, fast), (t_full, full) = timings
    print(
        f"v2 margins fp64={fp64}: kernel path {t_fast * 1e3:.1f} ms, full rebuild "
        f"{t_full * 1e3:.1f} ms for {n} rows x {width}"
    )
    same = fast == full
    assert float(same.double().mean()) >= 0.99
    assert float((fast - full).abs().max()) < 1e-3


@pytest.mark.parametrize("fp64", [False, True])
def test_v1_exponential_cuda_stream(fp64: bool) -> None:
    ops = pytest.importorskip("vllm.v1.sample.ops.topk_topp_sampler")
    dev = torch.device("cuda")
    width, steps, seed = 151936, 16, 21
    z = torch.randn(steps, width, device=dev, generator=torch.Generator(dev).manual_seed(2)) * 2
    vllm_gen = torch.Generator(device=dev).manual_seed(seed)
    chosen = [
        int(ops.random_sample(z[t : t + 1].softmax(-1, dtype=torch.float32), {0: vllm_gen}, fp64))
        for t in range(steps)
    ]
    name = "vllm-v1-exponential-fp64" if fp64 else "vllm-v1-exponential"
    stream = get_profile(name).stream(seed, 1, width, dev)
    margins = stream.margins(z.clone(), torch.tensor(chosen, device=dev), 0)
    assert margins.tolist() == [0.0] * steps


@pytest.mark.parametrize(("top_k", "top_p"), [(20, 1.0), (-1, 0.9), (50, 0.8), (-1, 0.5)])
def test_scorer_mask_equals_vllm_gpu_mask(top_k: int, top_p: float) -> None:
    ops = pytest.importorskip("vllm.v1.sample.ops.topk_topp_sampler")
    dev = torch.device("cuda")
    width, n = 151936, 64
    x = torch.randn(n, width, device=dev, generator=torch.Generator(dev).manual_seed(5)) * 3
    k = torch.full((n,), top_k, dtype=torch.int32, device=dev) if top_k > 0 else None
    p = torch.full((n,), top_p, dtype=torch.float32, device=dev) if top_p < 1 else None
    theirs = torch.isfinite(ops.apply_top_k_top_p(x.clone(), k, p))
    ours = torch.isfinite(apply_top_k_top_p(x.clone(), top_k, top_p))
    differ = int((theirs != ours).sum())
    print(f"mask top_k={top_k} top_p={top_p}: {differ} of {n * width} entries differ")
    assert differ == 0, "vLLM's GPU (Triton) top-k/top-p mask differs from the scorer's"

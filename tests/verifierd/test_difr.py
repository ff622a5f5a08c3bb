"""Token-DiFR scoring: vLLM's masks, margins, clipping, settings normalisation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from verifierd.difr import (
    DifrError,
    DifrResult,
    SamplingSettings,
    apply_min_p,
    apply_top_k_top_p,
    reproducibility_problem,
    scaled_logits,
    score_margins,
    top_k_top_p_first_kept,
    top_p_first_kept,
)
from verifierd.samplers import NotReproducibleError, get_profile

WIDTH = 300
SPLITMIX = get_profile("vllm-cpu-splitmix")


def _logits(rows: int, seed: int, width: int = WIDTH, ties: bool = False) -> torch.Tensor:
    z = torch.randn(rows, width, generator=torch.Generator().manual_seed(seed)) * 2.5
    return z.round(decimals=0) if ties else z


def _sampled(z: torch.Tensor, s: SamplingSettings, prompt_len: int) -> torch.Tensor:
    """Reference sampler: argmax of masked x + G from the profile's own noise rows."""
    x = scaled_logits(z, s.temperature)
    apply_min_p(x, s.min_p)
    x = apply_top_k_top_p(x, s.top_k, s.top_p)
    assert s.seed is not None
    g = SPLITMIX.noise(s.seed, prompt_len, z.shape[0], z.shape[1])
    assert g is not None
    return (x.double() + torch.from_numpy(g)).argmax(dim=1)


masks = st.tuples(
    st.sampled_from([-1, 0, 1, 2, 5, 40, WIDTH - 1, WIDTH, WIDTH + 5]),
    st.sampled_from([1.0, 0.999, 0.9, 0.5, 0.1, 1e-6]),
)


@pytest.mark.vllm
@settings(max_examples=60, deadline=None)
@given(masks, st.integers(0, 10_000), st.booleans(), st.sampled_from([0.3, 1.0, 1.7]))
def test_masks_equal_vllm_cpu_functions(
    mask: tuple[int, float], seed: int, ties: bool, temperature: float
) -> None:
    ops = pytest.importorskip("vllm.v1.sample.ops.topk_topp_sampler")
    top_k, top_p = mask
    x = scaled_logits(_logits(8, seed, ties=ties), temperature)
    k_on = 0 < top_k < WIDTH
    k = torch.full((8,), top_k, dtype=torch.int32) if k_on else None
    p = torch.full((8,), top_p, dtype=torch.float32) if top_p < 1 else None
    expected = ops.apply_top_k_top_p_pytorch(x.clone(), k, p, allow_cpu_sync=True)
    ours = apply_top_k_top_p(x.clone(), top_k, top_p)
    assert torch.equal(ours, expected)
    kept = torch.isfinite(ours).sum(dim=1)
    assert (kept >= 1).all()
    if k_on and not ties:
        assert (kept <= top_k).all()
    if k_on and top_p == 1.0:
        assert (kept >= top_k).all()  # ties at the k-th value are kept


def _vllm_mask(x: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    ops = pytest.importorskip("vllm.v1.sample.ops.topk_topp_sampler")
    rows = x.shape[0]
    k = torch.full((rows,), top_k, dtype=torch.int32) if top_k > 0 else None
    p = torch.full((rows,), top_p, dtype=torch.float32)
    out: torch.Tensor = ops.apply_top_k_top_p_pytorch(x.clone(), k, p, allow_cpu_sync=True)
    return out


@pytest.mark.vllm
@pytest.mark.parametrize(
    ("width", "scale", "top_k", "top_p"),
    [
        (2176, 6.0, -1, 0.95),
        (2176, 2.0, -1, 0.5),
        (2176, 2.0, 50, 0.9),
        (32000, 4.0, -1, 0.8),
        (32000, 8.0, 40, 0.95),
        (151936, 6.0, -1, 0.95),
    ],
)
def test_sort_free_top_p_equals_vllm_and_decides_most_rows(
    width: int, scale: float, top_k: int, top_p: float
) -> None:
    gen = torch.Generator().manual_seed(width + top_k)
    rows = 4 if width > 100_000 else 16
    x = torch.randn(rows, width, generator=gen) * scale
    x[:, -128:] = 0.0  # zero logits of padding rows, tied with each other
    assert torch.equal(apply_top_k_top_p(x.clone(), top_k, top_p), _vllm_mask(x, top_k, top_p))
    xn = x.numpy()
    if top_k > 0:
        _, decided = top_k_top_p_first_kept(xn, top_k, top_p)
    else:
        _, decided = top_p_first_kept(xn, top_p)
    assert decided.mean() >= 0.75  # the sort is the exception, not the rule


def _boundary_cases(width: int, seed: int) -> list[tuple[torch.Tensor, float]]:
    """Rows with a top_p 0, 1, 2, 4, ... 1024 float32 steps below or above the one
    whose t = 1 - p is nearest vLLM's own running sum at the nucleus boundary: from
    decisions no bound can settle (the sort decides) to ones ours decides."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(4):
        x = torch.randn(1, width, generator=gen) * 4
        cum = torch.cumsum(torch.sort(x, dim=-1).values.softmax(dim=-1), dim=-1)[0]
        c = np.float32(cum[int(torch.searchsorted(cum, torch.tensor([0.05])))])
        for steps in (0, 1, 2, 4, 16, 64, 256, 1024):
            for direction in (0.0, 2.0):
                top_p = np.float32(1) - c
                for _ in range(steps):
                    top_p = np.nextafter(top_p, np.float32(direction))
                out.append((x, float(top_p)))
    return out


@pytest.mark.vllm
@pytest.mark.parametrize("width", [2176, 32000])
def test_sort_free_top_p_is_exact_at_the_boundary(width: int) -> None:
    decided = 0
    cases = _boundary_cases(width, seed=width)
    for x, top_p in cases:
        assert torch.equal(apply_top_k_top_p(x.clone(), -1, top_p), _vllm_mask(x, -1, top_p))
        decided += int(top_p_first_kept(x.numpy(), top_p)[1][0])
    assert 0 < decided < len(cases)


def test_min_p_keeps_tokens_within_a_fraction_of_the_top_probability() -> None:
    x = torch.log(torch.tensor([[0.5, 0.3, 0.1, 0.05, 0.05]]))
    apply_min_p(x, 0.15)
    assert torch.isfinite(x).tolist() == [[True, True, True, False, False]]
    y = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    assert torch.equal(apply_min_p(y.clone(), 0.0), y)


@pytest.mark.parametrize(
    "s",
    [
        SamplingSettings(0.7, seed=1),
        SamplingSettings(1.0, top_k=20, seed=2),
        SamplingSettings(1.0, top_p=0.8, seed=3),
        SamplingSettings(0.5, top_k=50, top_p=0.9, seed=4),
        SamplingSettings(1.2, min_p=0.05, seed=5),
    ],
)
def test_sampled_tokens_score_exactly_zero_and_others_do_not(s: SamplingSettings) -> None:
    z = _logits(200, s.seed or 0)
    honest = _sampled(z, s, prompt_len=9)
    r = score_margins(z, honest, s, SPLITMIX, prompt_len=9, delta_max=10.0)
    assert (r.n_tokens, r.exact_matches, r.out_of_mask, r.score) == (200, 200, 0, 0.0)
    assert not r.margins.any()
    wrong_seed = score_margins(
        z,
        honest,
        SamplingSettings(s.temperature, s.top_k, s.top_p, s.min_p, 999),
        SPLITMIX,
        prompt_len=9,
        delta_max=10.0,
    )
    assert wrong_seed.exact_matches < 120 and wrong_seed.score > 0.3
    shifted = score_margins(z, honest, s, SPLITMIX, prompt_len=10, delta_max=10.0)
    assert shifted.score == 0.0  # splitmix noise does not depend on the position


def test_wrong_temperature_is_seen() -> None:
    s = SamplingSettings(0.7, seed=8)
    z = _logits(300, 8)
    honest = _sampled(z, s, prompt_len=4)
    off = SamplingSettings(1.0, seed=8)
    r = score_margins(z, honest, off, SPLITMIX, prompt_len=4, delta_max=10.0)
    assert r.exact_matches < 290 and r.score > 0.01


def test_greedy_margin_is_max_minus_claimed_logit() -> None:
    z = _logits(50, 3)
    claimed = z.argmax(dim=1)
    claimed[7] = 0
    r = score_margins(z, claimed, SamplingSettings(0.0), SPLITMIX, prompt_len=1, delta_max=100.0)
    expected = (z.max(dim=1).values - z[:, 0]).double()[7].item()
    assert r.exact_matches == 49 and r.margins[7] == pytest.approx(expected) and expected > 0
    greedy = get_profile("greedy")
    g = score_margins(z, claimed, SamplingSettings(0.0), greedy, prompt_len=1, delta_max=100.0)
    assert np.array_equal(g.margins, r.margins)


def test_outside_the_mask_or_the_logits_scores_delta_max() -> None:
    s = SamplingSettings(1.0, top_k=3, seed=1)
    z = _logits(4, 1)
    claimed = _sampled(z, s, prompt_len=2)
    claimed[1] = int(z[1].argmin())  # never in the top 3
    claimed[2] = WIDTH + 7  # not a logit at all
    r = score_margins(z, claimed, s, SPLITMIX, prompt_len=2, delta_max=6.0)
    assert r.margins.tolist() == [0.0, 6.0, 6.0, 0.0]
    assert (r.out_of_mask, r.exact_matches, r.score) == (2, 2, 3.0)


def test_unverifiable_settings_are_refused() -> None:
    z = _logits(3, 0)
    with pytest.raises(NotReproducibleError, match="no seed"):
        score_margins(z, [1, 2, 3], SamplingSettings(0.7), SPLITMIX, prompt_len=1, delta_max=5.0)
    with pytest.raises(NotReproducibleError, match="temperature 0 only"):
        score_margins(
            z,
            [1, 2, 3],
            SamplingSettings(0.7, seed=1),
            get_profile("greedy"),
            prompt_len=1,
            delta_max=5.0,
        )
    assert reproducibility_problem(SamplingSettings(0.0), get_profile("greedy")) is None
    with pytest.raises(DifrError):
        score_margins(z, [1, 2], SamplingSettings(0.0), SPLITMIX, prompt_len=1, delta_max=5.0)


def test_settings_normalise_like_vllm() -> None:
    assert SamplingSettings(0.0, top_k=5, top_p=0.5, min_p=0.1, seed=3).effective() == (
        SamplingSettings(0.0, -1, 1.0, 0.0, 3)
    )
    assert SamplingSettings(1e-6).is_greedy
    assert SamplingSettings(0.001, top_k=0, seed=-1).effective() == SamplingSettings(0.01)
    assert SamplingSettings(0.7, seed=10).for_choice(2, n=3).seed == 12
    assert SamplingSettings(0.7, seed=10).for_choice(0, n=1).seed == 10
    for bad in ({"temperature": -1.0}, {"top_p": 0.0}, {"min_p": 2.0}, {"top_k": -2}):
        with pytest.raises(DifrError):
            SamplingSettings(**bad)  # type: ignore[arg-type]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.one_of(st.floats(0, 1e6), st.just(float("inf"))), min_size=0, max_size=50),
    st.floats(0.1, 50),
)
def test_result_clips_and_summarises(raw: list[float], delta_max: float) -> None:
    r = DifrResult.from_raw_margins(np.array(raw, dtype=np.float64), delta_max)
    assert r.n_tokens == len(raw) and r.margins.shape == (len(raw),)
    assert (r.margins <= delta_max).all() and (r.margins >= 0).all()
    assert r.out_of_mask == sum(np.isinf(raw)) and r.exact_matches == raw.count(0.0)
    assert r.score == (pytest.approx(float(np.mean(r.margins))) if raw else 0.0)
    assert r.passes(r.score) and not r.passes(float(np.nextafter(r.score, -1.0)))
    back = DifrResult.margins_from_f16(r.margins_f16())
    assert len(r.margins_f16()) == 2 * len(raw)
    assert np.allclose(back, r.margins, rtol=1e-3, atol=1e-3)

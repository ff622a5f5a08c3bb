"""Without top-p the recorder sorts only the prefix its bands read, with the same bands.

`verifierd.engine.kept_sets.bands` sorts a row whole under top-p and otherwise
only the largest values every band reads; each comparison here is against the
whole-row sort on the same rows, bit for bit, on rows with ties at the cut and
rows spread far enough for the underflow floor to matter.
"""

from __future__ import annotations

from unittest import mock

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from verifierd.difr import SamplingSettings
from verifierd.engine import kept_sets
from verifierd.engine.kept_sets import bands


def _whole_row_bands(raw: torch.Tensor, sampling: SamplingSettings) -> torch.Tensor:
    with mock.patch.object(kept_sets, "_kept_prefix", return_value=None):
        return bands(raw, sampling)


def _assert_same_bits(fast: torch.Tensor, whole: torch.Tensor) -> None:
    assert fast.shape == whole.shape
    assert torch.equal(fast.view(torch.int32), whole.view(torch.int32))


@st.composite
def _rows(draw: st.DrawFn) -> torch.Tensor:
    """Rows of logits drawn from few distinct values (ties at every cut), at a spread
    from a peaked row to one whose tail underflows."""
    rows = draw(st.integers(1, 4))
    width = draw(st.integers(16, 1200))
    levels = draw(st.lists(st.floats(-1.0, 1.0, width=32), min_size=1, max_size=12))
    spread = draw(st.sampled_from([0.5, 4.0, 20.0, 60.0, 120.0]))
    seed = draw(st.integers(0, 2**31 - 1))
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randint(len(levels), (rows, width), generator=generator)
    values = torch.tensor(levels, dtype=torch.float32)[picks]
    noise = torch.randn(rows, width, generator=generator)
    tied = torch.rand(rows, width, generator=generator) < draw(st.floats(0.0, 1.0))
    return torch.where(tied, values, noise) * spread


_SAMPLINGS = st.builds(
    SamplingSettings,
    temperature=st.sampled_from([1.0, 0.7, 1.3]),
    top_k=st.sampled_from([-1, 1, 2, 5, 20, 50]),
    top_p=st.just(1.0),
    min_p=st.sampled_from([0.0, 0.001, 0.05, 0.3, 0.9]),
)


@settings(max_examples=300, deadline=None)
@given(raw=_rows(), sampling=_SAMPLINGS)
def test_the_prefix_sort_bands_as_the_whole_row_sort(
    raw: torch.Tensor, sampling: SamplingSettings
) -> None:
    _assert_same_bits(bands(raw, sampling), _whole_row_bands(raw, sampling))


def _takes_the_prefix(raw: torch.Tensor, sampling: SamplingSettings) -> bool:
    taken = []
    prefix = kept_sets._kept_prefix

    def spy(
        x: torch.Tensor, exact: torch.Tensor, settings: SamplingSettings
    ) -> torch.Tensor | None:
        found = prefix(x, exact, settings)
        taken.append(found is not None)
        return found

    with mock.patch.object(kept_sets, "_kept_prefix", spy):
        bands(raw, sampling)
    return taken == [True]


def test_top_k_and_min_p_rows_are_sorted_only_to_their_prefix() -> None:
    """On rows like a model's (the tiny model's width), top-k 20 and min-p 0.05 take
    the prefix path, so the comparison above covers it."""
    raw = torch.randn(8, 2176, generator=torch.Generator().manual_seed(0)) * 4
    for sampling in (SamplingSettings(top_k=20), SamplingSettings(min_p=0.05)):
        assert _takes_the_prefix(raw, sampling)
        _assert_same_bits(bands(raw, sampling), _whole_row_bands(raw, sampling))


def test_top_p_rows_and_underflowing_kept_sets_are_sorted_whole() -> None:
    raw = torch.randn(2, 300, generator=torch.Generator().manual_seed(1)) * 4
    assert not _takes_the_prefix(raw, SamplingSettings(top_p=0.9, top_k=20))
    spread = torch.linspace(0.0, -1500.0, 300).expand(2, -1).contiguous()
    assert not _takes_the_prefix(spread, SamplingSettings(top_k=20))
    assert _takes_the_prefix(spread, SamplingSettings(top_k=10))


def test_ties_at_the_k_th_past_the_first_guess_are_counted() -> None:
    """100 tokens tie at the 20th value, which min_p 0.05 drops at slack 0 and keeps at
    the widest slack: the prefix must run past all of them."""
    raw = torch.full((1, 2000), -50.0)
    raw[0, 0] = 0.0
    raw[0, 1:101] = -4.0
    sampling = SamplingSettings(top_k=20, min_p=0.05)
    assert _takes_the_prefix(raw, sampling)
    _assert_same_bits(bands(raw, sampling), _whole_row_bands(raw, sampling))

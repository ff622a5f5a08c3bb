"""Noise streams resumed across the passes of one response (`StreamCache`,
`NoiseStream.resumed`): always exactly the noise of a fresh stream."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from verifierd.difr import SamplingSettings
from verifierd.engine.stream_cache import StreamCache
from verifierd.samplers import PROFILE_NAMES, get_profile
from verifierd.samplers.vllm_v1_exponential import ExponentialStream

CPU = torch.device("cpu")
WIDTH, PROMPT_LEN = 61, 7
SAMPLED = [p for p in PROFILE_NAMES if p != "greedy"]


def _fresh_rows(profile: str, seed: int, start: int, stop: int) -> torch.Tensor:
    stream = get_profile(profile).stream(seed, PROMPT_LEN, WIDTH, CPU)
    stream.skip(start)
    return stream.gumbel(start, stop)


@pytest.mark.parametrize("profile", SAMPLED)
@settings(max_examples=10, deadline=None)
@given(read=st.integers(0, 20), k=st.integers(0, 40), m=st.integers(0, 5))
def test_a_stream_resumed_at_k_draws_what_a_fresh_one_skipped_to_k_draws(
    profile: str, read: int, k: int, m: int
) -> None:
    stream = get_profile(profile).stream(3, PROMPT_LEN, WIDTH, CPU)
    stream.skip(read)
    stream.gumbel(read, read + 2)  # the original reads on: the copy must not follow it
    resumed = stream.resumed(k)
    if resumed is None:  # a stateful stream past k cannot go back
        assert k < read + 2
        return
    assert torch.equal(resumed.gumbel(k, k + m), _fresh_rows(profile, 3, k, k + m))


@pytest.mark.parametrize("profile", SAMPLED)
@settings(max_examples=10, deadline=None)
@given(starts=st.lists(st.integers(0, 30), min_size=1, max_size=6))
def test_passes_opened_from_the_cache_read_a_fresh_streams_noise(
    profile: str, starts: list[int]
) -> None:
    """Passes of one response in any order of start positions (a later pass may
    begin before an earlier one), each reading a few rows."""
    cache = StreamCache()
    sampling = SamplingSettings(0.9, seed=5)
    for start in starts:
        stream = cache.open_at(sampling, get_profile(profile), PROMPT_LEN, WIDTH, CPU, start=start)
        assert stream is not None
        assert torch.equal(
            stream.gumbel(start, start + 4), _fresh_rows(profile, 5, start, start + 4)
        )


def test_the_cache_keeps_each_response_apart_and_stays_bounded() -> None:
    cache = StreamCache(max_streams=3)
    profile = get_profile("vllm-v1-exponential")
    for seed in range(5):
        stream = cache.open_at(
            SamplingSettings(0.9, seed=seed), profile, PROMPT_LEN, WIDTH, CPU, start=2
        )
        assert stream is not None
        assert torch.equal(stream.gumbel(2, 5), _fresh_rows(profile.name, seed, 2, 5))
    assert len(cache) == 3
    assert cache.open_at(SamplingSettings(0.0), profile, PROMPT_LEN, WIDTH, CPU, start=0) is None


def test_a_later_pass_draws_only_the_rows_since_the_previous_pass_began(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    drawn: list[int] = []
    real = ExponentialStream.exponential_rows

    def counted(self: ExponentialStream, start: int, stop: int) -> torch.Tensor:
        drawn.append(stop - start)
        return real(self, start, stop)

    monkeypatch.setattr(ExponentialStream, "exponential_rows", counted)
    cache, profile = StreamCache(), get_profile("vllm-v1-exponential")
    sampling = SamplingSettings(0.9, seed=1)
    for start in (0, 100, 130):
        stream = cache.open_at(sampling, profile, PROMPT_LEN, WIDTH, CPU, start=start)
        assert stream is not None
        drawn.clear()
        stream.gumbel(start, start + 50)  # the pass reads on past the next one's start
    drawn.clear()
    cache.open_at(sampling, profile, PROMPT_LEN, WIDTH, CPU, start=170)
    assert sum(drawn) == 40

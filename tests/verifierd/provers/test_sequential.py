"""The per-prover sequential test: its false-alarm bound on simulated honest streams,
its invariances, its state's round trip, and that dishonest streams cross."""

from __future__ import annotations

import itertools
import math
from random import Random

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verifierd.calibration import UNCLIPPED, calibrate
from verifierd.provers.sequential import (
    SECONDS_PER_DAY,
    HonestTails,
    SequentialState,
    SequentialTest,
    SequentialTestError,
    crossed,
    day_of,
    log_bound,
    log_e_value,
    start,
    tail_upper_bound,
    update,
)

#: float32 reproduction: every honest margin exactly 0 (300 responses of 1,000 tokens).
FLOAT32 = SequentialTest.from_honest(HonestTails.from_margins([np.zeros(1000)] * 300, 1.0))


def bf16_like(rng: np.random.Generator, n: int) -> npt.NDArray[np.float64]:
    """Honest bfloat16-like margins: mostly 0, 2% small rounding margins, 0.05% out
    of the mask (+inf)."""
    m = np.where(rng.random(n) < 0.02, rng.exponential(2e-3, n), 0.0)
    return np.where(rng.random(n) < 5e-4, np.inf, m)


def margins_strategy(max_size: int = 400) -> st.SearchStrategy[list[float]]:
    return st.lists(
        st.one_of(
            st.just(0.0),
            st.floats(0.0, 3.0, allow_nan=False),
            st.just(math.inf),
        ),
        max_size=max_size,
    )


def bf16_test(rng: np.random.Generator, alpha: float = 1e-6) -> SequentialTest:
    tails = HonestTails.from_margins([bf16_like(rng, 1000) for _ in range(200)], 1.0)
    return SequentialTest.from_honest(tails, false_alarm_per_day=alpha)


def crossing_rate(
    test: SequentialTest,
    draw: npt.NDArray[np.float64],
    responses: int,
    rng: np.random.Generator,
) -> float:
    """Fraction of simulated provers whose stream of ``responses`` responses (16-1000
    tokens, margins drawn by ``draw``) crosses on day 1."""
    alarms = 0
    for stream in draw:
        state = start(test, 0.0)
        cursor = 0
        for length in rng.integers(16, 1001, responses):
            state = update(state, stream[cursor : cursor + length], 60.0)
            cursor += int(length)
        alarms += crossed(state)
    return alarms / len(draw)


def test_worst_case_honest_streams_cross_at_most_alpha() -> None:
    """Honest margins at exactly the tail bounds (the null's worst case: each product
    is a martingale) cross 1/alpha in at most alpha of streams, up to sampling error."""
    alpha = 0.05
    tails = HonestTails(1.0, 2000, (0.0, 0.01, 0.1), (40, 10, 2))
    test = SequentialTest.from_honest(tails, false_alarm_per_day=alpha)
    q = np.asarray(test.tails)
    levels = np.asarray(test.levels)
    rng = np.random.default_rng(1)
    streams, tokens = 600, 20_000
    u = rng.random((streams, tokens))
    # P(m > c_k) = q_k exactly: a margin just above the highest level it passes.
    passed = (u[:, :, None] < q[None, None, :]).sum(axis=2)
    values = np.concatenate([[0.0], levels + 1e-3])
    draw = values[passed]
    rate = crossing_rate(test, draw, 40, rng)
    assert rate <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / streams)


def test_honest_bf16_like_streams_never_cross_at_tight_alpha() -> None:
    """Calibrated on honest bfloat16-like traffic, 100 honest provers x 20,000 pooled
    tokens (2e6 in all) do not cross at alpha = 1e-6, nor at 1e-3."""
    rng = np.random.default_rng(2)
    for alpha in (1e-6, 1e-3):
        test = bf16_test(rng, alpha)
        draw = np.stack([bf16_like(rng, 20_000) for _ in range(100)])
        assert crossing_rate(test, draw, 40, rng) == 0.0


def test_bf16_calibration_keeps_levels_above_the_honest_noise() -> None:
    test = bf16_test(np.random.default_rng(3))
    assert test.levels[0] == 0.0 and len(test.levels) >= 3
    assert test.tails[0] > 0.01
    assert test.tails[-1] < 1e-3


def test_float32_calibration_keeps_only_level_zero() -> None:
    assert FLOAT32.levels == (0.0,)
    assert FLOAT32.tails[0] < 1e-4


@pytest.mark.parametrize("rate", [0.01, 0.1, 1.0])
def test_dishonest_streams_cross(rate: float) -> None:
    """Changed tokens at rate 1% (int8-like), 10% and every token cross, every time,
    within pooled-token budgets that shrink with the rate."""
    rng = np.random.default_rng(4)
    budget = {0.01: 5_000, 0.1: 400, 1.0: 4}[rate]
    for _ in range(100):
        m = np.where(rng.random(budget) < rate, rng.uniform(1e-4, 1.0, budget), 0.0)
        state = update(start(FLOAT32, 0.0), m, 1.0)
        assert crossed(state)
        assert state.alarm is not None and state.alarm.token <= budget


def test_out_of_mask_margins_count_as_delta_max() -> None:
    s = start(FLOAT32, 0.0)
    assert update(s, [math.inf, 0.0, 5.0], 1.0) == update(s, [1.0, 0.0, 1.0], 1.0)


@pytest.mark.parametrize("bad", [[0.0, math.nan], [-1e-9]])
def test_nan_and_negative_margins_are_rejected(bad: list[float]) -> None:
    with pytest.raises(SequentialTestError):
        update(start(FLOAT32, 0.0), bad, 1.0)


@settings(max_examples=60, deadline=None)
@given(margins_strategy(), st.lists(st.integers(0, 400), max_size=6))
def test_split_updates_equal_one_update(margins: list[float], cuts: list[int]) -> None:
    """Splitting the same tokens into several updates on one day changes nothing, the
    alarm included."""
    test = bf16_test(np.random.default_rng(5), alpha=1e-2)
    whole = update(start(test, 0.0), margins, 10.0)
    state = start(test, 0.0)
    bounds = sorted({0, len(margins), *(c for c in cuts if c < len(margins))})
    for a, b in itertools.pairwise(bounds):
        state = update(state, margins[a:b], 10.0)
    assert state == whole


@settings(max_examples=60, deadline=None)
@given(margins_strategy(), st.randoms(use_true_random=False))
def test_evidence_does_not_depend_on_token_order(margins: list[float], random: Random) -> None:
    shuffled = list(margins)
    random.shuffle(shuffled)
    test = bf16_test(np.random.default_rng(6))
    a = update(start(test, 0.0), margins, 1.0)
    b = update(start(test, 0.0), shuffled, 1.0)
    assert (a.tokens, a.exceedances, log_e_value(a)) == (b.tokens, b.exceedances, log_e_value(b))


@settings(max_examples=60, deadline=None)
@given(margins_strategy(), st.integers(0, 399), st.floats(1e-7, 2.0))
def test_a_larger_margin_is_never_less_evidence(
    margins: list[float], index: int, extra: float
) -> None:
    """Each factor is nondecreasing in the margin: what the bound for a prover
    stochastically no worse than calibration rests on."""
    if not margins:
        margins = [0.0]
    raised = list(margins)
    raised[index % len(raised)] += extra
    test = bf16_test(np.random.default_rng(7))
    assert log_e_value(update(start(test, 0.0), raised, 1.0)) >= log_e_value(
        update(start(test, 0.0), margins, 1.0)
    )


@settings(max_examples=40, deadline=None)
@given(st.lists(margins_strategy(200), max_size=4), st.floats(0, 40 * SECONDS_PER_DAY))
def test_state_round_trips_through_json(batches: list[list[float]], later: float) -> None:
    state = start(bf16_test(np.random.default_rng(8), alpha=0.2), 1.7e9)
    for i, batch in enumerate(batches):
        state = update(state, batch, 1.7e9 + later * i)
    assert SequentialState.from_json(state.to_json()) == state
    assert SequentialState.from_json(state.to_json().encode()) == state


@pytest.mark.parametrize("text", ["", "{}", '{"format": 2}', "[1]", '{"format": 1, "test": 3}'])
def test_garbage_is_not_a_state(text: str) -> None:
    with pytest.raises(SequentialTestError):
        SequentialState.from_json(text)


def test_days_count_from_the_start_and_lower_the_bound() -> None:
    state = start(FLOAT32, 1000.0)
    assert [day_of(state, 1000.0 + s) for s in (-5, 0, SECONDS_PER_DAY, SECONDS_PER_DAY + 1)] == [
        1,
        1,
        1,
        2,
    ]
    assert log_bound(state, 1000.0) == pytest.approx(math.log(1e6))
    assert log_bound(state, 1000.0 + 30 * SECONDS_PER_DAY) == pytest.approx(math.log(1e6 / 30))


def test_a_new_day_alarms_on_evidence_already_pooled() -> None:
    """Evidence between day 2's threshold and day 1's raises no alarm on day 1 and
    raises it on day 2 with no new token."""
    low, high = math.log(1e6 / 2), math.log(1e6)
    n = np.arange(2, 200_000, dtype=np.int64)
    log_e = FLOAT32.log_e_values(n, np.full((n.size, 1), 2, dtype=np.int64))
    tokens = int(n[np.flatnonzero((log_e > low) & (log_e < high))[0]])
    # Both exceeding tokens last: E is largest there, so nothing crossed on the way.
    state = update(start(FLOAT32, 0.0), [0.0] * (tokens - 2) + [0.5, 0.5], 1.0)
    assert not crossed(state) and low < log_e_value(state) < high
    assert not crossed(update(state, [], SECONDS_PER_DAY))
    alarmed = update(state, [], SECONDS_PER_DAY + 1)
    assert alarmed.alarm is not None
    assert (alarmed.alarm.day, alarmed.alarm.token) == (2, tokens)


def test_the_alarm_is_sticky() -> None:
    state = update(start(FLOAT32, 0.0), [1.0] * 10, 1.0)
    assert crossed(state)
    after = update(state, [0.0] * 100_000, 2.0)
    assert crossed(after) and after.alarm == state.alarm
    assert log_e_value(after) < log_e_value(state)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 100_000), st.data(), st.floats(1e-9, 0.5))
def test_tail_bound_holds_with_the_stated_miss(
    tokens: int, data: st.DataObject, miss: float
) -> None:
    """A true rate at the bound yields at most n exceedances with probability <= miss
    (the binomial lower tail, computed exactly in log space)."""
    n = data.draw(st.integers(0, min(tokens, 50)))
    q = tail_upper_bound(n, tokens, miss)
    assert n / tokens <= q <= 1.0
    if q < 1.0:
        log_terms = [
            math.lgamma(tokens + 1)
            - math.lgamma(i + 1)
            - math.lgamma(tokens - i + 1)
            + i * math.log(q)
            + (tokens - i) * math.log1p(-q)
            for i in range(n + 1)
        ]
        top = max(log_terms)
        log_cdf = top + math.log(sum(math.exp(t - top) for t in log_terms))
        assert log_cdf <= math.log(miss) + 1e-9


def test_calibration_counts_the_honest_tails_at_its_delta_max() -> None:
    """`verifierd calibrate` counts the honest tokens above each level, out-of-mask
    ones (+inf, or UNCLIPPED from an engine) at every level."""
    cal = calibrate(
        [np.array([0.0, 0.0, 2e-3, math.inf]), np.array([0.0, UNCLIPPED, 0.0, 0.0])],
        target_fpr=1e-3,
        sample_rate=1.0,
    )
    tails = cal.honest_tails
    assert (tails.tokens, tails.delta_max) == (8, cal.settings.delta_max)
    counts = dict(zip(tails.levels, tails.exceedances, strict=True))
    assert (counts[0.0], counts[1e-3], counts[1e-2], counts[0.1]) == (3, 3, 2, 2)

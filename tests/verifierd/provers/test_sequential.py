"""The per-prover sequential test: its false-alarm bound on simulated honest streams
(independent tokens, and clustered ones tested per response), its invariances, its
state's round trip, and that dishonest streams cross."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from dataclasses import replace
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
    StateFormatError,
    Unit,
    crossed,
    day_of,
    log_bound,
    log_e_value,
    start,
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
    """Calibrated on 200 bfloat16-like responses of 1,000 tokens: per response."""
    tails = HonestTails.from_margins([bf16_like(rng, 1000) for _ in range(200)], 1.0)
    return SequentialTest.from_honest(tails, false_alarm_per_day=alpha)


#: Calibrated on 200,000 one-token bfloat16-like responses (no response holds a
#: cluster): per token.
BF16_TOKEN_TAILS = HonestTails.from_margins(
    bf16_like(np.random.default_rng(3), 200_000)[:, None], 1.0
)


def bf16_token_test(alpha: float = 1e-6) -> SequentialTest:
    return SequentialTest.from_honest(BF16_TOKEN_TAILS, false_alarm_per_day=alpha)


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


def null_stream_rate(
    draw: Callable[[int, int], list[npt.NDArray[np.float64]]],
    calibration: tuple[int, int],
    stream: tuple[int, int],
    alpha: float,
    provers: int,
) -> float:
    """Fraction of honest provers crossing ``alpha`` when each has a calibration of its
    own and both draw their margins with ``draw(responses, tokens)`` (the null: one
    honest law); ``calibration`` and ``stream`` are (responses, tokens per response)."""
    alarms = 0
    for _ in range(provers):
        tails = HonestTails.from_margins(draw(*calibration), 1.0)
        state = start(SequentialTest.from_honest(tails, false_alarm_per_day=alpha), 0.0)
        for response in draw(*stream):
            state = update(state, response, 60.0)
        alarms += crossed(state)
    return alarms / provers


def test_independent_honest_tokens_cross_at_most_alpha() -> None:
    """The null per token: calibration and prover tokens above each level at one
    rate, independently (calibrated on one-token responses: no cluster), cross
    1/alpha in at most alpha of provers, up to sampling error."""
    alpha, provers = 0.05, 300
    rng = np.random.default_rng(1)
    values = np.array([0.0, 0.005, 0.05, 0.5])  # above 0, 0.01 and 0.1 at rates 2%, 0.5%, 0.1%
    p = np.array([1 - 0.02, 0.02 - 0.005, 0.005 - 0.001, 0.001])

    def draw(responses: int, tokens: int) -> list[npt.NDArray[np.float64]]:
        return list(rng.choice(values, size=(responses, tokens), p=p))

    test = SequentialTest.from_honest(HonestTails.from_margins(draw(1000, 1), 1.0))
    assert set(test.units) == {Unit.TOKEN}
    rate = null_stream_rate(draw, (1000, 1), (20, 250), alpha, provers)
    assert rate <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / provers)


def test_clustered_honest_responses_are_tested_per_response_and_cross_at_most_alpha() -> None:
    """Honest noise in clusters: 5% of responses (near ties) hold 2-8 tokens above 0,
    the rest none. Calibration sees clusters, so the test runs per response up to their
    margin (and per token above it, where nothing honest reaches); honest
    provers then cross at most alpha (a per-token test on these margins would not:
    a cluster looks like a prover changing tokens)."""
    alpha, provers = 0.05, 400
    rng = np.random.default_rng(9)

    def draw(responses: int, tokens: int) -> list[npt.NDArray[np.float64]]:
        out = []
        for _ in range(responses):
            m = np.zeros(tokens)
            if rng.random() < 0.05:
                m[rng.choice(tokens, int(rng.integers(2, 9)), replace=False)] = 0.02
            out.append(m)
        return out

    test = SequentialTest.from_honest(HonestTails.from_margins(draw(300, 100), 1.0))
    # Up to 0.02 per response (one level kept: its count is the same at each); above it
    # nothing honest, per token.
    assert test.units == (Unit.RESPONSE, Unit.TOKEN)
    assert test.calibration_units == (300, 30_000) and test.calibration_counts[1] == 0
    rate = null_stream_rate(draw, (300, 100), (40, 100), alpha, provers)
    assert rate <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / provers)


def test_one_response_is_one_unit_per_response() -> None:
    """Per response, a response counts once however many of its tokens exceed."""
    test = bf16_test(np.random.default_rng(10))
    state = update(start(test, 0.0), [0.5] * 7 + [0.0] * 3, 1.0)
    assert set(test.units) == {Unit.RESPONSE}
    assert (state.units[0], state.tokens, state.exceedances[0]) == (1, 10, 1)
    assert update(start(test, 0.0), [0.5], 1.0).exceedances == state.exceedances


def test_the_start_has_mean_at_most_one_under_the_null() -> None:
    """Before any prover token E is the calibration's factor; its mean over the
    calibration's outcomes at any honest rate is at most 1 (exactly, for N = 40)."""
    tokens = 40
    starts = [
        math.exp(
            log_e_value(start(SequentialTest(0.5, 1.0, (0.0,), (Unit.TOKEN,), (tokens,), (n,)), 0))
        )
        for n in range(tokens + 1)
    ]
    for p in (1e-4, 0.01, 0.1, 0.5, 0.9):
        mean = sum(
            math.comb(tokens, n) * p**n * (1 - p) ** (tokens - n) * e for n, e in enumerate(starts)
        )
        assert mean <= 1.0


def test_honest_bf16_like_streams_never_cross_at_tight_alpha() -> None:
    """Calibrated on honest bfloat16-like traffic, 100 honest provers x 20,000 pooled
    tokens (2e6 in all) do not cross at alpha = 1e-6, nor at 1e-3."""
    rng = np.random.default_rng(2)
    for alpha in (1e-6, 1e-3):
        test = bf16_test(rng, alpha)
        draw = np.stack([bf16_like(rng, 20_000) for _ in range(100)])
        assert crossing_rate(test, draw, 40, rng) == 0.0


def test_bf16_calibration_keeps_levels_above_the_honest_noise() -> None:
    test = bf16_token_test()
    assert set(test.units) == {Unit.TOKEN} and set(test.calibration_units) == {200_000}
    assert test.levels[0] == 0.0 and len(test.levels) >= 3
    assert test.calibration_counts[0] > 2000
    assert test.calibration_counts[-1] < 200


def test_float32_calibration_keeps_only_level_zero() -> None:
    assert FLOAT32.levels == (0.0,) and FLOAT32.units == (Unit.TOKEN,)
    assert (FLOAT32.calibration_units, FLOAT32.calibration_counts) == ((300_000,), (0,))


def test_three_changed_tokens_in_300_alarm_against_exact_float32() -> None:
    """Calibrated on 150,000 exact tokens, 3 exceeding tokens in 300 cross 1/alpha:
    an honest rate that would explain them would have shown in calibration."""
    test = SequentialTest.from_honest(HonestTails.from_margins([np.zeros(1000)] * 150, 1.0))
    state = update(start(test, 0.0), [0.0] * 297 + [0.3] * 3, 1.0)
    assert crossed(state)
    assert not crossed(update(start(test, 0.0), [0.0] * 298 + [0.3] * 2, 1.0))


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
    test = bf16_token_test(alpha=1e-2)
    whole = update(start(test, 0.0), margins, 10.0)
    state = start(test, 0.0)
    bounds = sorted({0, len(margins), *(c for c in cuts if c < len(margins))})
    for a, b in itertools.pairwise(bounds):
        state = update(state, margins[a:b], 10.0)
    assert replace(state, responses=0) == replace(whole, responses=0)


@settings(max_examples=60, deadline=None)
@given(margins_strategy(), st.randoms(use_true_random=False))
def test_evidence_does_not_depend_on_token_order(margins: list[float], random: Random) -> None:
    shuffled = list(margins)
    random.shuffle(shuffled)
    test = bf16_token_test()
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
    test = bf16_token_test()
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
    log_e = FLOAT32.log_e_values(n[:, None], np.full((n.size, 1), 2, dtype=np.int64))
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


def test_a_state_of_the_former_format_is_named_as_such() -> None:
    old = json.loads(start(FLOAT32, 0.0).to_json()) | {"format": 1}
    with pytest.raises(StateFormatError):
        SequentialState.from_json(json.dumps(old))


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
    responses = dict(zip(tails.levels, tails.response_exceedances, strict=True))
    assert (tails.responses, responses[0.0], responses[1e-2]) == (2, 2, 2)
    # The first response holds two tokens above 0 and above 1e-3 (clusters), one above 1e-2.
    clusters = dict(zip(tails.levels, tails.clusters or (), strict=True))
    assert (clusters[0.0], clusters[1e-3], clusters[1e-2]) == (1, 1, 0)


def clustered_low_isolated_high(
    rng: np.random.Generator, responses: int, tokens: int, high_rate: float = 1e-3
) -> list[npt.NDArray[np.float64]]:
    """bfloat16-like honest margins: 10% of responses (near ties) hold 2-8 tokens at
    0.005 (above the levels up to 1e-3), and every token independently exceeds 0.1 (at
    0.5) at ``high_rate``: clustered at the low levels, isolated at the high ones."""
    out = []
    for _ in range(responses):
        m = np.zeros(tokens)
        if rng.random() < 0.1:
            m[rng.choice(tokens, int(rng.integers(2, 9)), replace=False)] = 0.005
        out.append(np.where(rng.random(tokens) < high_rate, 0.5, m))
    return out


def test_each_level_has_its_unit() -> None:
    """Per response where an honest response held two tokens above the level, per token
    above that; each level's calibration units and counts are of its unit."""
    cal = [
        np.array([0.004, 0.004, 0.0]),  # a cluster up to 1e-3
        np.array([0.0, 0.3, 0.002]),  # another, and one token above 1e-2 and 0.1
        np.array([0.05, 0.0, 0.0]),  # one token above 1e-2
        np.zeros(3),
    ]
    tails = HonestTails.from_margins(cal, 1.0)
    assert tails.levels[-1] == 0.1 and tails.clusters == (2, 2, 2, 2, 2, 0, 0)
    test = SequentialTest.from_honest(tails)
    # 0 .. 1e-3 all see 3 responses: one kept; per token 1e-2 (2 tokens) and 0.1 (1).
    assert test.levels == (0.0, 1e-2, 0.1)
    assert test.units == (Unit.RESPONSE, Unit.TOKEN, Unit.TOKEN)
    assert test.calibration_units == (4, 12, 12)
    assert test.calibration_counts == (3, 2, 1)


def test_per_response_levels_must_lie_below_per_token_ones() -> None:
    with pytest.raises(SequentialTestError, match="below per-token"):
        SequentialTest(0.1, 1.0, (0.0, 0.1), (Unit.TOKEN, Unit.RESPONSE), (100, 10), (3, 1))


def test_mixed_units_cross_at_most_alpha() -> None:
    """The null with both units: honest noise clustered at the low levels and isolated
    at the high ones (calibration then tests the first per response and the others per
    token, in nearly every draw); honest provers cross at most alpha."""
    alpha, provers = 0.2, 150
    rng = np.random.default_rng(11)

    def draw(responses: int, tokens: int) -> list[npt.NDArray[np.float64]]:
        return clustered_low_isolated_high(rng, responses, tokens)

    test = SequentialTest.from_honest(HonestTails.from_margins(draw(300, 20), 1.0))
    assert Unit.RESPONSE in test.units and Unit.TOKEN in test.units
    rate = null_stream_rate(draw, (300, 20), (50, 40), alpha, provers)
    assert rate <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / provers)


def mixed_test(alpha: float = 1e-6) -> SequentialTest:
    tails = HonestTails.from_margins(
        clustered_low_isolated_high(np.random.default_rng(12), 300, 500, high_rate=2e-6), 1.0
    )
    test = SequentialTest.from_honest(tails, false_alarm_per_day=alpha)
    assert test.units[0] is Unit.RESPONSE and test.units[-1] is Unit.TOKEN
    return test


def test_a_mixed_test_checks_inside_a_response_only_above_the_per_token_levels() -> None:
    """Tokens above only the per-response levels are judged once the response ends;
    the first check inside one is at a token above the lowest per-token level, with its
    response counted as exceeding every per-response level."""
    test = mixed_test(alpha=0.2)
    low = 0.005  # above the per-response levels only
    assert low < test.levels[test.lowest_per_token]
    state = start(test, 0.0)
    for _ in range(40):
        state = update(state, [low] * 20, 1.0)
        if crossed(state):
            break
    assert state.alarm is not None and state.alarm.token == state.tokens
    high = update(start(test, 0.0), [0.0] * 7 + [0.5] * 3 + [0.0] * 90, 1.0)
    assert high.alarm is not None and 8 <= high.alarm.token <= 10
    assert (high.units, high.exceedances[0], high.exceedances[-1]) == (
        tuple(1 if u is Unit.RESPONSE else 100 for u in test.units),
        1,
        3,
    )


def test_a_wrong_seed_like_prover_alarms_within_a_few_tokens_per_level() -> None:
    """Every token changed by a large margin (a wrong seed, another model): against a
    calibration clustered only at the low levels it alarms within its first response,
    per token at the high levels; tested per response at every level (tails without
    per-level clusters) it needs over ten times as many tokens."""
    test = mixed_test()
    per_response = SequentialTest.from_honest(
        replace(
            HonestTails.from_margins(
                clustered_low_isolated_high(np.random.default_rng(12), 300, 500, 2e-6), 1.0
            ),
            clusters=None,
        )
    )
    assert set(per_response.units) == {Unit.RESPONSE}
    rng = np.random.default_rng(13)
    for _ in range(20):
        tokens_to_alarm = []
        for t in (test, per_response):
            state = start(t, 0.0)
            while not crossed(state) and state.tokens < 100_000:
                state = update(state, rng.uniform(0.2, 2.0, int(rng.integers(16, 200))), 1.0)
            assert state.alarm is not None
            tokens_to_alarm.append(state.alarm.token)
        assert tokens_to_alarm[0] <= 10 and 10 * tokens_to_alarm[0] <= tokens_to_alarm[1]


#: A state as the previous format (2) wrote it: one unit and calibration size for all
#: levels.
FORMAT_2_STATE = json.dumps(
    {
        "alarm": None,
        "exceedances": [3, 1],
        "format": 2,
        "responses": 40,
        "started_at": 1.7e9,
        "test": {
            "calibration_counts": [5, 4],
            "calibration_units": 150,
            "delta_max": 2.5,
            "false_alarm_per_day": 6.08e-7,
            "levels": [0.0, 0.1],
            "unit": "response",
        },
        "tokens": 9500,
    }
)


def test_a_state_of_the_previous_format_loads_with_its_evidence() -> None:
    state = SequentialState.from_json(FORMAT_2_STATE)
    assert state.test == SequentialTest(
        6.08e-7, 2.5, (0.0, 0.1), (Unit.RESPONSE, Unit.RESPONSE), (150, 150), (5, 4)
    )
    assert (state.tokens, state.responses, state.exceedances, state.units) == (
        9500,
        40,
        (3, 1),
        (40, 40),
    )
    assert SequentialState.from_json(state.to_json()) == state
    assert json.loads(state.to_json())["format"] == 3

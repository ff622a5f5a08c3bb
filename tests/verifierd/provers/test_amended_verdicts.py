"""A superseded verdict (the collector amended its record) in the prover's statistics.

Its prover's tallies count the superseding UNVERIFIABLE(record_amended) verdict instead,
and the sequential test keeps the response as one whose tokens did not exceed: exactly
the evidence of the same traffic with that response clean (sequential.withdraw).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from veritap.v1 import verifier_pb2

from tests.verifierd.provers.prover_fixtures import (
    CID,
    FLOAT32_TAILS,
    Outcome,
    Verifier,
    counts,
    honest,
)
from verifierd.config import HidingConfig, ProversConfig
from verifierd.provers import sequential
from verifierd.provers.identity import ProverKey
from verifierd.provers.sequential import HonestTails, SequentialTest

S = 1_000_000_000
FAIL = verifier_pb2.VERDICT_STATUS_FAIL
PASS = verifier_pb2.VERDICT_STATUS_PASS
UNVERIFIABLE = verifier_pb2.VERDICT_STATUS_UNVERIFIABLE
AMENDED = ProverKey("edge", "10.0.0.1", 8000)
#: The same traffic, the amended response clean.
CLEAN = ProverKey("edge", "10.0.0.3", 8000)
CONFIG = ProversConfig(
    hiding=HidingConfig(min_verdicts=3, reasons=(("record_amended", 0.4),)),
)


@pytest.fixture
def prover_config() -> ProversConfig:
    return CONFIG


def test_a_superseded_verdict_counts_as_amended_and_leaves_no_evidence(
    verifier: Verifier,
) -> None:
    verifier.tables.set_honest_tails(CID, FLOAT32_TAILS, actor="calibration")
    at = verifier.clock.now
    # One token off: evidence against the prover, short of the alarm.
    off = Outcome(FAIL, "score_over_threshold", (0.5,) + (0.0,) * 49, at)
    amended_ids = verifier.traffic.send(AMENDED, [honest(100, at), off, honest(100, at)])
    verifier.traffic.send(CLEAN, [honest(100, at), honest(50, at), honest(100, at)])
    before = verifier.prover(AMENDED).prover
    assert before.evidence > verifier.prover(CLEAN).prover.evidence
    assert not verifier.tables.alarms()

    verifier.clock.now = at + 10 * S
    verifier.amend(AMENDED, amended_ids[1])
    after = verifier.prover(AMENDED)
    expected = {(PASS, ""): 2, (UNVERIFIABLE, "record_amended"): 1}
    for window in after.prover.windows:
        assert counts(window) == expected, window.window_s
        assert (window.tokens_scored, window.inexact_tokens, window.margin_sum) == (200, 0, 0.0)
        assert window.unverifiable_share == {"record_amended": pytest.approx(1 / 3)}
    # The amended response's 50 tokens stay pooled as tokens that did not exceed.
    clean = verifier.prover(CLEAN).prover
    assert after.prover.pooled_tokens == clean.pooled_tokens == 250
    assert after.prover.evidence == pytest.approx(clean.evidence)
    assert after.evidence_history[-1].statistic == pytest.approx(clean.evidence)
    assert not verifier.tables.alarms()

    # A second amended record crosses the hiding rate for record_amended.
    verifier.amend(AMENDED, amended_ids[0])
    (alarm,) = verifier.tables.alarms()
    assert (alarm.alarm.kind, alarm.alarm.reason) == (
        verifier_pb2.ALARM_KIND_HIDING,
        "record_amended",
    )
    assert set(alarm.alarm.record_ids) == {amended_ids[0], amended_ids[1]}


TESTS = [
    SequentialTest.from_honest(FLOAT32_TAILS),
    SequentialTest.from_honest(
        HonestTails.from_margins([np.array([0.0, 0.2, 0.3])] + [np.zeros(10)] * 50, 10.0)
    ),
    # Per response up to 1e-3 (a cluster there), per token above (one isolated token).
    SequentialTest.from_honest(
        HonestTails.from_margins(
            [np.array([0.0, 2e-3, 3e-3]), np.array([0.0, 0.5])] + [np.zeros(10)] * 50, 10.0
        )
    ),
]


@settings(max_examples=60, deadline=None)
@given(
    test=st.sampled_from(TESTS),
    before=st.lists(st.lists(st.sampled_from([0.0, 1e-3, 0.5, 20.0]), max_size=8), max_size=4),
    withdrawn=st.lists(st.sampled_from([0.0, 1e-5, 0.5, 20.0]), max_size=8),
    after=st.lists(st.lists(st.sampled_from([0.0, 0.5]), max_size=8), max_size=3),
)
def test_withdrawing_a_response_is_folding_it_in_clean(
    test: SequentialTest,
    before: list[list[float]],
    withdrawn: list[float],
    after: list[list[float]],
) -> None:
    """Whatever came before and after it, a withdrawn response leaves the state the same
    response with every margin 0 would have left (the alarm aside), never more evidence."""
    state = clean = sequential.start(test, 0.0)
    for margins in before:
        state = sequential.update(state, margins, 1.0)
        clean = sequential.update(clean, margins, 1.0)
    state = sequential.update(state, withdrawn, 1.0)
    clean = sequential.update(clean, np.zeros(len(withdrawn)), 1.0)
    kept = sequential.log_e_value(state)
    for margins in after:
        state = sequential.update(state, margins, 2.0)
        clean = sequential.update(clean, margins, 2.0)
    state = sequential.withdraw(state, withdrawn)
    assert (state.tokens, state.responses, state.exceedances) == (
        clean.tokens,
        clean.responses,
        clean.exceedances,
    )
    assert sequential.log_e_value(state) == pytest.approx(sequential.log_e_value(clean))
    if not after:
        assert sequential.log_e_value(state) <= kept + 1e-9


def test_withdrawing_what_the_state_never_held_is_refused() -> None:
    state = sequential.start(TESTS[0], 0.0)
    with pytest.raises(sequential.SequentialTestError, match="not in the state"):
        sequential.withdraw(state, [0.5])

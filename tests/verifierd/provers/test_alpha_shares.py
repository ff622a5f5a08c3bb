"""The false-alarm probability is per prover: its tests share alpha in order of start."""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.verifierd.provers.prover_fixtures import (
    CHEAT,
    FLOAT32_TAILS,
    HONEST,
    Verifier,
    dishonest,
    honest,
)
from tests.verifierd.provers.test_store import CONFIG, S
from verifierd.config import ProversConfig
from verifierd.provers.sequential import SequentialTestError, alpha_share

ALPHA = CONFIG.false_alarm_per_day
#: Three commitments, first seen in this order (not their sorted order).
FIRST, SECOND, THIRD = "cc" * 32, "aa" * 32, "bb" * 32


def served(verifier: Verifier, *cids: str) -> None:
    for cid in cids:
        verifier.tables.set_honest_tails(cid, FLOAT32_TAILS, actor="calibration")


def cheat(verifier: Verifier, cid: str, at_ns: int = S) -> None:
    verifier.traffic.send(CHEAT, [replace(dishonest(50, at_ns), commitment_id=cid)] * 10)


def share_of(bound: float) -> float:
    """The share of alpha a day-1 alarm's bound ln(1 / (alpha * share)) stands for."""
    return math.exp(-bound) / ALPHA


def bounds(verifier: Verifier) -> dict[str, float]:
    """Commitment id -> the bound of its DISHONEST alarm in force."""
    return {a.alarm.commitment_ids[0]: a.alarm.bound for a in verifier.tables.alarms()}


@pytest.fixture
def prover_config() -> ProversConfig:
    return CONFIG


def test_the_shares_sum_to_one_and_fall_with_the_test_number() -> None:
    assert alpha_share(1) == pytest.approx(6 / math.pi**2)
    assert alpha_share(2) == pytest.approx(alpha_share(1) / 4)
    assert math.fsum(alpha_share(j) for j in range(1, 100_000)) < 1
    with pytest.raises(SequentialTestError):
        alpha_share(0)


def test_a_provers_commitments_test_at_their_share_in_order_of_first_sight(
    verifier: Verifier,
) -> None:
    served(verifier, FIRST, SECOND, THIRD)
    for cid in (FIRST, SECOND, THIRD):
        verifier.traffic.send(CHEAT, [replace(honest(50), commitment_id=cid)])
    for cid in (THIRD, SECOND, FIRST):
        cheat(verifier, cid)
    found = bounds(verifier)
    for j, cid in enumerate((FIRST, SECOND, THIRD), 1):
        assert found[cid] == pytest.approx(-math.log(ALPHA * alpha_share(j)))
    [second] = [a.alarm for a in verifier.tables.alarms() if a.alarm.commitment_ids[0] == SECOND]
    assert "the prover's test 2, share 0.152 of its 1e-06 per day" in second.detail
    # Each prover numbers its own tests: another one's first is at the first share.
    verifier.traffic.send(HONEST, [replace(dishonest(50), commitment_id=THIRD)] * 10)
    [other] = [a for a in verifier.tables.alarms() if a.alarm.prover.server_address == "10.0.0.1"]
    assert other.alarm.bound == pytest.approx(-math.log(ALPHA * alpha_share(1)))


def test_two_commitments_keep_their_split_bound_across_a_restart(verifier: Verifier) -> None:
    served(verifier, FIRST, SECOND)
    for cid in (FIRST, SECOND):
        verifier.traffic.send(HONEST, [replace(honest(1000), commitment_id=cid)] * 20)
        verifier.traffic.send(CHEAT, [replace(honest(50), commitment_id=cid)])
    verifier.restart()
    cheat(verifier, SECOND)
    [alarm] = verifier.tables.alarms()
    assert alarm.alarm.bound == pytest.approx(-math.log(ALPHA * alpha_share(2)))
    assert verifier.tables.alarms() == [alarm]
    honest_prover = verifier.tables.prover(HONEST)
    assert honest_prover is not None and honest_prover.prover.pooled_tokens == 20_000
    # A clear restarts the test as the prover's next one, also after a restart.
    verifier.tables.clear_alarm(alarm.alarm.alarm_id, actor="CN=ops-admin", why="redeployed")
    verifier.restart()
    cheat(verifier, SECOND)
    assert bounds(verifier) == {SECOND: pytest.approx(-math.log(ALPHA * alpha_share(3)))}


def test_tests_stored_before_shares_take_them_in_order_of_start(verifier: Verifier) -> None:
    """A summary of an earlier version ran each test at the whole alpha: its tests are
    numbered by when they started and keep their evidence at the stricter threshold."""
    served(verifier, FIRST, SECOND)
    verifier.traffic.send(CHEAT, [replace(honest(50, 2 * S), commitment_id=FIRST)])
    verifier.traffic.send(CHEAT, [replace(honest(50, 3 * S), commitment_id=SECOND)])
    store, key = verifier.store, CHEAT.to_bytes()
    provers = store.open_db("provers")

    def earlier(txn: Any) -> None:
        summary = json.loads(bytes(txn.get(key, db=provers)))
        for cid, raw in summary["tests"].items():
            state = json.loads(raw)
            state["test"]["false_alarm_per_day"] = ALPHA
            summary["tests"][cid] = json.dumps(state)
        del summary["shares"], summary["tests_started"]
        txn.put(key, json.dumps(summary).encode(), db=provers)

    store.write_transaction(earlier)
    cheat(verifier, SECOND, 4 * S)
    cheat(verifier, FIRST, 4 * S)
    found = bounds(verifier)
    assert found == {
        FIRST: pytest.approx(-math.log(ALPHA * alpha_share(1))),
        SECOND: pytest.approx(-math.log(ALPHA * alpha_share(2))),
    }
    [second] = [a.alarm for a in verifier.tables.alarms() if a.alarm.commitment_ids[0] == SECOND]
    assert second.pooled_tokens > 50  # the evidence before carried over


EVENTS = st.lists(
    st.tuples(st.sampled_from(["serve", "clear", "restart"]), st.sampled_from([FIRST, SECOND])),
    max_size=8,
)


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(EVENTS)
def test_shares_are_never_reused_whatever_the_order_of_sights_and_clears(
    events: list[tuple[str, str]],
) -> None:
    """Every serve of a commitment without an alarm in force starts its test (dishonest
    traffic alarms at once), every clear ends one: the alarms' shares are the prover's
    tests 1, 2, ... in order, and sum to at most 1."""
    with tempfile.TemporaryDirectory() as tmp:
        verifier = Verifier(Path(tmp) / "store", CONFIG)
        try:
            served(verifier, FIRST, SECOND)
            for n, (action, cid) in enumerate(events, 1):
                in_force = {a.alarm.commitment_ids[0]: a for a in verifier.tables.alarms()}
                if action == "serve":
                    cheat(verifier, cid, n * S)  # alarms are listed in order of raising
                elif action == "clear" and cid in in_force:
                    alarm_id = in_force[cid].alarm.alarm_id
                    verifier.tables.clear_alarm(alarm_id, actor="CN=ops-admin", why="fixed")
                elif action == "restart":
                    verifier.restart()
            every = verifier.tables.alarms(include_cleared=True)
            shares = [share_of(a.alarm.bound) for a in every]
            assert shares == pytest.approx([alpha_share(j) for j in range(1, len(every) + 1)])
            assert math.fsum(shares) <= 1
        finally:
            verifier.close()

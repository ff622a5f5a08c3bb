"""The provers' tables: counts per prover over windows, the alarm lifecycle, restarts."""

from __future__ import annotations

import json
from typing import Any

import pytest
from veritap.signing import Signer
from veritap.v1 import verifier_pb2

from appliance.journal import MessageId
from tests.verifierd.provers.prover_fixtures import (
    CHEAT,
    CID,
    FLOAT32_TAILS,
    HONEST,
    Verifier,
    counts,
    dishonest,
    honest,
    unverifiable,
)
from verifierd.config import HidingConfig, ProversConfig
from verifierd.provers.alarms import AlarmSignatureError, check_signed_alarm
from verifierd.provers.identity import ProverKey
from verifierd.provers.store import NoSuchAlarmError

S = 1_000_000_000
HOUR = 3600 * S
PASS = verifier_pb2.VERDICT_STATUS_PASS
FAIL = verifier_pb2.VERDICT_STATUS_FAIL
UNVERIFIABLE = verifier_pb2.VERDICT_STATUS_UNVERIFIABLE
DISHONEST = verifier_pb2.ALARM_KIND_DISHONEST
HIDING = verifier_pb2.ALARM_KIND_HIDING
CONFIG = ProversConfig(hiding=HidingConfig(min_verdicts=10, reasons=(("no_output", 0.9),)))


@pytest.fixture
def prover_config() -> ProversConfig:
    return CONFIG


def test_verdicts_are_counted_per_prover_by_status_and_reason(verifier: Verifier) -> None:
    verifier.traffic.send(HONEST, [honest(40), honest(10), unverifiable("no_seed")])
    verifier.traffic.send(CHEAT, [dishonest(50)])
    verifier.clock.now = 2 * S
    window = verifier.window(HONEST, 3600)
    assert counts(window) == {(PASS, ""): 2, (UNVERIFIABLE, "no_seed"): 1}
    assert (window.verdicts, window.tokens_scored, window.inexact_tokens) == (3, 50, 0)
    assert window.unverifiable_share == {"no_seed": pytest.approx(1 / 3)}
    assert window.unverifiable_ratio == pytest.approx(1 / 3)
    cheat = verifier.window(CHEAT, 0)
    assert counts(cheat) == {(FAIL, "score_over_threshold"): 1}
    assert (cheat.tokens_scored, cheat.inexact_tokens) == (50, 10)
    assert cheat.margin_sum == pytest.approx(5.0)
    listed = {ProverKey.of_proto(p.id) for p in verifier.tables.provers()}
    assert listed == {HONEST, CHEAT}
    assert verifier.tables.prover(ProverKey("edge", "10.0.0.1", 8001)) is None


def test_the_unseeded_share_counts_sampled_verdicts_only(verifier: Verifier) -> None:
    sampled = [honest(10, sampled=True), unverifiable("no_seed"), unverifiable("no_seed")]
    verifier.traffic.send(HONEST, [honest(10)] * 5 + sampled)
    verifier.clock.now = 2 * S
    for window_s in (3600, 0):
        window = verifier.window(HONEST, window_s)
        assert window.needs_seed_verdicts == 3
        assert window.unseeded_share == pytest.approx(2 / 3)
        assert window.unverifiable_share == {"no_seed": pytest.approx(2 / 8)}
    verifier.restart()
    assert verifier.window(HONEST, 0).unseeded_share == pytest.approx(2 / 3)


def test_windows_slide_and_since_first_seen_keeps_everything(verifier: Verifier) -> None:
    verifier.traffic.send(HONEST, [honest(10, at_ns=S)])
    verifier.traffic.send(HONEST, [unverifiable("capture_gap", at_ns=2 * HOUR)])
    verifier.clock.now = 2 * HOUR + S
    assert counts(verifier.window(HONEST, 3600)) == {(UNVERIFIABLE, "capture_gap"): 1}
    both = {(PASS, ""): 1, (UNVERIFIABLE, "capture_gap"): 1}
    assert counts(verifier.window(HONEST, 86400)) == both
    assert counts(verifier.window(HONEST, 0)) == both
    verifier.clock.now = 30 * HOUR
    assert verifier.window(HONEST, 86400).verdicts == 0
    assert verifier.window(HONEST, 0).verdicts == 2
    found = verifier.tables.prover(HONEST)
    assert found is not None
    assert (found.prover.first_seen_ns, found.prover.last_seen_ns) == (S, 2 * HOUR)


def test_a_dishonest_prover_raises_one_signed_sticky_alarm(verifier: Verifier) -> None:
    verifier.tables.set_honest_tails(CID, FLOAT32_TAILS, actor="calibration")
    ids = verifier.traffic.send(HONEST, [honest(200) for _ in range(20)])
    ids = verifier.traffic.send(CHEAT, [dishonest(50) for _ in range(10)])
    assert verifier.tables.alarms() == verifier.raised
    [state] = verifier.raised
    alarm = check_signed_alarm(state.signed, verifier.signer.verifier())
    assert alarm == state.alarm
    assert ProverKey.of_proto(alarm.prover) == CHEAT
    assert alarm.kind == DISHONEST and list(alarm.commitment_ids) == [CID]
    assert alarm.statistic >= alarm.bound > 0
    assert set(alarm.record_ids) <= set(ids) and alarm.record_ids
    # Raised as soon as the evidence crossed: within the first responses.
    assert alarm.pooled_tokens < 200
    verifier.traffic.send(CHEAT, [dishonest(50) for _ in range(5)])
    assert len(verifier.tables.alarms()) == 1
    [listed] = verifier.tables.provers(alarmed_only=True)
    assert ProverKey.of_proto(listed.id) == CHEAT
    assert listed.evidence >= listed.evidence_bound and len(listed.alarms) == 1
    honest_prover = verifier.tables.prover(HONEST)
    assert honest_prover is not None
    assert honest_prover.prover.evidence < 0 < honest_prover.prover.evidence_bound
    assert len(honest_prover.evidence_history) == 20
    assert honest_prover.evidence_history[-1].pooled_tokens == 4000


def test_alarm_survives_a_restart_and_clearing_is_audited(verifier: Verifier) -> None:
    verifier.tables.set_honest_tails(CID, FLOAT32_TAILS, actor="calibration")
    verifier.traffic.send(CHEAT, [dishonest(50) for _ in range(10)])
    verifier.restart()
    [state] = verifier.tables.alarms()
    verifier.traffic.send(CHEAT, [dishonest(50)])
    assert len(verifier.tables.alarms()) == 1
    verifier.clock.now = 5 * S
    cleared = verifier.tables.clear_alarm(
        state.alarm.alarm_id, actor="CN=ops-admin", why="prover redeployed"
    )
    assert (cleared.cleared_at_ns, cleared.cleared_by, cleared.clear_reason) == (
        5 * S,
        "CN=ops-admin",
        "prover redeployed",
    )
    assert cleared.signed == state.signed
    assert verifier.raised[-1] == cleared
    assert verifier.tables.alarms() == []
    assert verifier.tables.alarms(include_cleared=True) == [cleared]
    [event] = [e for e in verifier.store.audit_log() if e.action == "clear_prover_alarm"]
    assert event.actor == "CN=ops-admin"
    detail = json.loads(event.detail)
    assert detail["alarm_id"] == state.alarm.alarm_id and detail["why"] == "prover redeployed"
    assert detail["prover"] == CHEAT.label
    with pytest.raises(NoSuchAlarmError):
        verifier.tables.clear_alarm(state.alarm.alarm_id, actor="CN=ops-admin", why="again")
    with pytest.raises(NoSuchAlarmError):
        verifier.tables.clear_alarm("not hex", actor="CN=ops-admin", why="typo")
    # The test restarted at the clear: the evidence pools afresh, and crosses again.
    after = verifier.tables.prover(CHEAT)
    assert after is not None and after.prover.pooled_tokens == 0
    verifier.traffic.send(CHEAT, [dishonest(50) for _ in range(10)])
    assert len(verifier.tables.alarms()) == 1
    assert len(verifier.tables.alarms(include_cleared=True)) == 2


def test_a_tampered_alarm_does_not_verify(verifier: Verifier) -> None:
    verifier.tables.set_honest_tails(CID, FLOAT32_TAILS, actor="calibration")
    verifier.traffic.send(CHEAT, [dishonest(50) for _ in range(10)])
    [state] = verifier.tables.alarms()
    forged = verifier_pb2.SignedProverAlarm()
    forged.CopyFrom(state.signed)
    alarm = verifier_pb2.ProverAlarm.FromString(forged.alarm)
    alarm.prover.server_address = "10.0.0.1"
    forged.alarm = alarm.SerializeToString()
    with pytest.raises(AlarmSignatureError):
        check_signed_alarm(forged, verifier.signer.verifier())
    with pytest.raises(AlarmSignatureError):
        check_signed_alarm(state.signed, Signer.generate("other").verifier())


def test_no_test_runs_without_honest_tails(verifier: Verifier) -> None:
    verifier.traffic.send(CHEAT, [dishonest(50) for _ in range(10)])
    assert verifier.tables.alarms() == []
    found = verifier.tables.prover(CHEAT)
    assert found is not None
    assert (found.prover.evidence, found.prover.evidence_bound) == (0.0, 0.0)


def test_a_state_of_an_earlier_format_restarts_the_test(
    verifier: Verifier, caplog: pytest.LogCaptureFixture
) -> None:
    """A test state stored by an earlier version of the test is not evidence of this
    one: the prover is listed without it, and its test restarts at its next verdict."""
    verifier.tables.set_honest_tails(CID, FLOAT32_TAILS, actor="calibration")
    verifier.traffic.send(CHEAT, [honest(100)])
    store, key = verifier.store, CHEAT.to_bytes()
    provers = store.open_db("provers")

    def downgrade(txn: Any) -> None:
        summary = json.loads(bytes(txn.get(key, db=provers)))
        summary["tests"][CID] = json.dumps(json.loads(summary["tests"][CID]) | {"format": 1})
        txn.put(key, json.dumps(summary).encode(), db=provers)

    store.write_transaction(downgrade)
    listed = verifier.tables.prover(CHEAT)
    assert listed is not None and listed.prover.pooled_tokens == 0
    verifier.traffic.send(CHEAT, [dishonest(50) for _ in range(10)])
    assert "prover test restarted: state of an earlier format" in caplog.text
    found = verifier.tables.prover(CHEAT)
    assert found is not None and found.prover.pooled_tokens == 500
    assert len(verifier.tables.alarms()) == 1


def test_hiding_raises_an_alarm_per_reason_once_the_window_is_large_enough(
    verifier: Verifier, caplog: pytest.LogCaptureFixture
) -> None:
    verifier.traffic.send(CHEAT, [unverifiable("no_seed") for _ in range(9)])
    assert verifier.tables.alarms() == []  # 9 verdicts: below min_verdicts
    ids = verifier.traffic.send(CHEAT, [unverifiable("no_seed")])
    [state] = verifier.tables.alarms()
    alarm = state.alarm
    assert (alarm.kind, alarm.reason, alarm.window_s) == (HIDING, "no_seed", 3600)
    assert (alarm.statistic, alarm.bound) == (1.0, 0.5)
    assert alarm.record_ids[-1] == ids[-1] and len(alarm.record_ids) == 10
    [logged] = [r for r in caplog.records if r.getMessage() == "prover alarm raised"]
    assert logged.__dict__["message_id"] == MessageId.PROVER_ALARM
    assert logged.__dict__["alarm_id"] == alarm.alarm_id
    check_signed_alarm(state.signed, verifier.signer.verifier())
    verifier.traffic.send(CHEAT, [unverifiable("no_seed") for _ in range(5)])
    assert len(verifier.tables.alarms()) == 1


def test_hiding_respects_per_reason_rates_and_never_blames_the_verifier(
    verifier: Verifier,
) -> None:
    verifier.traffic.send(HONEST, [honest(10) for _ in range(10)])
    # The verifier's own failures, a reason rated 0.9, and a share under the default rate.
    verifier.traffic.send(HONEST, [unverifiable("engine_error") for _ in range(30)])
    verifier.traffic.send(HONEST, [unverifiable("no_output") for _ in range(30)])
    verifier.traffic.send(HONEST, [unverifiable("no_seed") for _ in range(5)])
    assert verifier.tables.alarms() == []


def test_a_failure_in_the_judgement_never_stops_a_verdict_nor_its_counts(
    verifier: Verifier, caplog: pytest.LogCaptureFixture
) -> None:
    store = verifier.store
    tails = store.open_db("honest_tails")
    store.write_transaction(lambda txn: txn.put(CID.encode(), b"not json", db=tails))
    verifier.traffic.send(CHEAT, [dishonest(50)])
    assert store.counts().verdicts == 1
    assert "prover judgement failed" in caplog.text
    verifier.clock.now = 2 * S
    assert verifier.window(CHEAT, 0).verdicts == 1

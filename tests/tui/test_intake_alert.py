"""Clearing an intake alert from the console's Overview (Textual Pilot, real daemons).

The daemons' intake is stopped by an alert recorded in verifierd's store (as one raised
before a restart would be); the collector still serves the log verifierd stored, so
clearing is accepted from the admin certificate, refused from an operator's, and refused
while the collector is away.
"""

from __future__ import annotations

import time

import pytest
from textual.widgets import Static
from veritap.v1 import ledger_pb2

from tests.recorded_traffic import ORIGIN
from tests.service_pki import ADMIN_SUBJECT
from tests.tui.daemons import Daemons
from tests.tui.pilot_waits import loaded, shown_text, until
from tests.tui.recording_console import RecordingConsole, notified
from tui.app import VeritapConsole
from tui.screens.clear_alert import ClearAlertScreen
from tui.widgets.keyed_table import KeyedTable

pytestmark = pytest.mark.timeout(120)

SIZE = (80, 24)
DETAIL = "checkpoint of size 3: signature does not verify"


async def stop_intake_by_an_alert(daemons: Daemons) -> None:
    intake = daemons.intake
    assert intake is not None
    await daemons.acall(intake.stop())
    cursor = daemons.store.cursor(ORIGIN)
    evidence = ledger_pb2.IntakeEvidence(
        origin=ORIGIN,
        reason="bad_signature",
        detail=DETAIL,
        cursor_seq=cursor.seq,
        cursor_hash=cursor.hash,
        detected_at_ns=time.time_ns(),
    )
    daemons.store.set_alert(ORIGIN, "bad_signature", evidence.SerializeToString())
    await daemons.acall(intake.start())


def intake_states(app: VeritapConsole) -> list[str]:
    table = app.screen.query_one("#collectors", KeyedTable)
    return [str(table.get_row_at(i)[-1]) for i in range(table.row_count)]


async def test_the_admin_sees_the_evidence_and_clears_the_alert(daemons: Daemons) -> None:
    await stop_intake_by_an_alert(daemons)
    stored = daemons.store.cursor(ORIGIN).seq
    app = RecordingConsole(daemons.client(daemons.pki.admin), refresh_s=3600)
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        assert intake_states(app) == ["alert: bad_signature"]
        assert screen.check_action("clear_alert", ()) is True
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, ClearAlertScreen), "the question")
        evidence = shown_text(app.screen.query_one("#clear-alert-evidence", Static))
        assert f"stored up to seq {stored}" in evidence and DETAIL in evidence
        await pilot.press("enter")  # no reason: nothing is sent
        keys = app.screen.query_one("#clear-alert-keys", Static)
        await until(pilot, lambda: "a reason is required" in shown_text(keys), "the hint")
        await pilot.press(*"the collector was restarted", "enter")
        await until(pilot, lambda: app.screen is screen, "the question to close")
        await until(pilot, lambda: bool(notified(app, f"{ORIGIN}: intake resumes")), "the news")
        intake = daemons.intake
        assert intake is not None
        await until(pilot, lambda: intake.status()[0].state == "streaming", "the link to stream")
        await pilot.press("r")
        await until(pilot, lambda: intake_states(app) == ["streaming"], "the Overview to say so")
        assert screen.check_action("clear_alert", ()) is False
    assert daemons.store.alerts() == []
    [cleared] = daemons.store.cleared_alerts()
    assert (cleared.actor, cleared.why) == (ADMIN_SUBJECT, "the collector was restarted")
    assert cleared.alert.reason == "bad_signature"


async def test_an_operator_or_an_absent_collector_gets_a_refusal(daemons: Daemons) -> None:
    await stop_intake_by_an_alert(daemons)
    app = RecordingConsole(daemons.client(), refresh_s=3600)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, ClearAlertScreen), "the question")
        await pilot.press(*"try", "enter")
        await until(pilot, lambda: bool(notified(app, "not cleared")), "the refusal")
        [message] = notified(app, "not cleared")
        assert message == "CN=ops-operator,O=veritap does not hold the admin role"
    await daemons.stop_collector()
    app = RecordingConsole(daemons.client(daemons.pki.admin), refresh_s=3600)
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        # The collector does not answer: its row says so, and its intake has a row of its own.
        assert intake_states(app) == ["", "alert: bad_signature"]
        assert screen.check_action("clear_alert", ()) is False
        await pilot.press("down", "c")
        await until(pilot, lambda: isinstance(app.screen, ClearAlertScreen), "the question")
        await pilot.press(*"try", "enter")
        await until(pilot, lambda: bool(notified(app, "not cleared")), "the refusal")
        [message] = notified(app, "not cleared")
        assert message.startswith("not cleared: the collector did not answer")
        assert intake_states(app) == ["", "alert: bad_signature"]
    assert [a.reason for a in daemons.store.alerts()] == ["bad_signature"]
    assert daemons.store.cleared_alerts() == []

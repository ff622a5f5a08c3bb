"""Provers and their alarms in the console, against real daemons whose prover tables hold
an honest prover and a dishonest one (tests.tui.daemons)."""

from __future__ import annotations

import asyncio

import pytest
from textual.widgets import Sparkline, Static

from tests.tui.daemons import DISHONEST_PROVER, HONEST_PROVER, Daemons
from tests.tui.pilot_waits import loaded, shown_text, until
from tests.tui.recording_console import RecordingConsole, notified
from tests.verifierd.provers.prover_fixtures import dishonest, honest, unverifiable
from tui.app import VeritapConsole
from tui.screens.clear_alert import ClearWithReasonScreen
from tui.screens.provers import ProversScreen
from tui.screens.record import RecordScreen
from tui.widgets.keyed_table import KeyedTable
from verifierd.provers.identity import ProverKey

pytestmark = pytest.mark.timeout(120)

SIZE = (80, 24)


def rows(app: VeritapConsole, selector: str) -> list[list[str]]:
    table = app.screen.query_one(selector, KeyedTable)
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


async def test_the_overview_shows_the_alarms_in_force_and_one_raised_at_once(
    prover_daemons: Daemons,
) -> None:
    app = VeritapConsole(prover_daemons.client(), refresh_s=3600)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        alarms = app.screen.query_one("#overview-alarms", Static)
        text = shown_text(alarms)
        assert DISHONEST_PROVER.label in text and HONEST_PROVER.label not in text
        assert "DISHONEST" in text

        await app.alarms.wait_ready(timeout_s=30)
        another = ProverKey("edge-2.lab", "10.20.2.99", 8000)
        await asyncio.to_thread(prover_daemons.judge, another, [dishonest(50)] * 3)
        await until(pilot, lambda: another.label in shown_text(alarms), "the raised alarm")


async def test_without_prover_tables_the_overview_says_so(fixed_daemons: Daemons) -> None:
    app = VeritapConsole(fixed_daemons.client(), refresh_s=3600)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        text = shown_text(app.screen.query_one("#overview-alarms", Static))
        assert text == "not kept by this verifierd (UNIMPLEMENTED)"


async def test_the_provers_screen_shows_state_statistic_and_the_records_behind_an_alarm(
    prover_daemons: Daemons,
) -> None:
    app = VeritapConsole(prover_daemons.client(), refresh_s=3600)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("7")
        screen = await loaded(pilot)
        assert isinstance(screen, ProversScreen)
        states = {row[0]: row[1] for row in rows(app, "#provers")}
        assert states[DISHONEST_PROVER.label] == "DISHONEST"
        assert states[HONEST_PROVER.label] == "ok"

        table = app.screen.query_one("#provers", KeyedTable)
        dishonest_row = list(states).index(DISHONEST_PROVER.label)
        table.move_cursor(row=dishonest_row)
        records = app.screen.query_one("#alarm-records", KeyedTable)
        await until(pilot, lambda: records.row_count > 0, "the alarm's records")
        history = app.screen.query_one("#prover-evidence", Sparkline).data
        assert history is not None and len(history) == 12 and history[-1] > history[0]
        assert "DISHONEST" in shown_text(app.screen.query_one("#alarms", Static))

        record_id = rows(app, "#alarm-records")[0][0]
        records.focus()
        await pilot.press("enter")
        detail = await loaded(pilot)
        assert isinstance(detail, RecordScreen) and detail.record_id == record_id


async def test_provers_show_the_unseeded_share_of_sampled_traffic_beside_the_unverifiable_one(
    prover_daemons: Daemons,
) -> None:
    """Of the new prover's 6 verdicts 2 are UNVERIFIABLE (33%); of the 4 whose request
    sampled, 1 came without a seed (25%): the greedy verdict is in neither denominator of
    the unseeded share. A prover that never sampled shows "—", not 0%. The verdict's
    reason is the verifier's string: shown escaped, never as markup."""
    sampling = ProverKey("edge-3.lab", "10.20.3.4", 8000)
    traffic = [honest(100, sampled=True)] * 3 + [
        unverifiable("no_seed"),
        unverifiable("[/x]\x1b[2J"),
        honest(100),
    ]
    await asyncio.to_thread(prover_daemons.judge, sampling, traffic)
    app = VeritapConsole(prover_daemons.client(), refresh_s=3600)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("7")
        await loaded(pilot)
        shown = rows(app, "#provers")
        shares = {row[0]: (row[4], row[5]) for row in shown}
        assert shares[sampling.label] == ("33%", "25%")
        assert shares[HONEST_PROVER.label] == ("0%", "—")

        traffic_line = app.screen.query_one("#prover-traffic", Static)
        app.screen.query_one("#provers", KeyedTable).move_cursor(
            row=[row[0] for row in shown].index(sampling.label)
        )
        await until(pilot, lambda: "6 verdicts" in shown_text(traffic_line), "its traffic")
        assert shown_text(traffic_line) == (
            "Traffic since first seen: 6 verdicts, 33% UNVERIFIABLE "
            "([/x]\\x1b[2J 17%, no_seed 17%); 25% of 4 sampled without a seed"
        )


async def test_an_admin_clears_an_alarm_with_a_reason_and_an_operator_may_not(
    prover_daemons: Daemons,
) -> None:
    operator = RecordingConsole(prover_daemons.client(), refresh_s=3600)
    async with operator.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("7")
        await loaded(pilot)
        await pilot.press("c")
        await until(pilot, lambda: isinstance(operator.screen, ClearWithReasonScreen), "ask")
        await pilot.press(*"looked fine", "enter")
        await until(pilot, lambda: bool(notified(operator, "not cleared")), "the refusal")
        assert "PERMISSION_DENIED" in notified(operator, "not cleared")[0]

    admin = RecordingConsole(prover_daemons.client(prover_daemons.pki.admin), refresh_s=3600)
    async with admin.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("7")
        await loaded(pilot)
        await pilot.press("c")
        await until(pilot, lambda: isinstance(admin.screen, ClearWithReasonScreen), "ask")
        evidence = shown_text(admin.screen.query_one("#clear-alert-evidence", Static))
        assert evidence.startswith("DISHONEST: ln e")
        await pilot.press(*"redeployed the committed model", "enter")
        await until(pilot, lambda: bool(notified(admin, "alarms cleared")), "the clearing")

        def state() -> str:
            return {r[0]: r[1] for r in rows(admin, "#provers")}[DISHONEST_PROVER.label]

        await until(pilot, lambda: state() != "DISHONEST", "the cleared state")
        assert state() == "no test"  # cleared: its test starts again from the next verdict
    assert prover_daemons.provers is not None and prover_daemons.provers.alarms() == []
    [cleared] = prover_daemons.provers.alarms(include_cleared=True)
    assert cleared.clear_reason == "redeployed the committed model"

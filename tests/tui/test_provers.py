"""Provers and their alarms in the console, against real daemons whose prover tables hold
an honest prover and a dishonest one (tests.tui.daemons)."""

from __future__ import annotations

import asyncio

import pytest
from textual.widgets import Sparkline, Static

from tests.tui.daemons import DISHONEST_PROVER, HONEST_PROVER, Daemons
from tests.tui.pilot_waits import loaded, shown_text, until
from tests.verifierd.provers.prover_fixtures import dishonest
from tui.app import VeritapConsole
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

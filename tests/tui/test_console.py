"""The operator console driven by keys (Textual Pilot) against real daemons.

Each test starts a collector and a verifierd on loopback with mutual TLS (tests.tui.daemons),
holding the recorded traffic, and runs the console at 80x24 as an operator would.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from rich.text import Text
from textual.widgets import Input, Sparkline, Static

from tests.recorded_traffic import EXCHANGES, FAIL, ORIGIN, PENDING, margins_for
from tests.service_pki import ADMIN_SUBJECT
from tests.tui.daemons import Daemons
from tests.tui.pilot_waits import loaded, shown_text, until
from tui.app import VeritapConsole
from tui.screens.failures import FailuresScreen
from tui.screens.models import ModelsScreen
from tui.screens.overview import OverviewScreen
from tui.screens.pending import PendingScreen
from tui.screens.record import RecordScreen
from tui.screens.settings import SettingsScreen
from tui.screens.verdicts import VerdictsScreen
from tui.widgets.connection_banner import ConnectionBanner
from tui.widgets.keyed_table import KeyedTable
from tui.widgets.verdict_table import VerdictTable

pytestmark = pytest.mark.timeout(120)

SIZE = (80, 24)
DECIDED = [e for e in EXCHANGES if e.status != PENDING]


def table(app: VeritapConsole, selector: str) -> KeyedTable:
    return app.screen.query_one(selector, KeyedTable)


def cells(app: VeritapConsole, selector: str) -> list[list[str]]:
    t = table(app, selector)
    return [[str(c) for c in t.get_row_at(i)] for i in range(t.row_count)]


async def test_every_screen_is_one_key_away_and_shows_the_daemons_data(daemons: Daemons) -> None:
    app = VeritapConsole(daemons.client(), refresh_s=3600)
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        assert isinstance(screen, OverviewScreen)
        [collector] = cells(app, "#collectors")
        assert collector[0] == "edge-1"
        assert collector[3:6] == [str(len(EXCHANGES)), "0", "streaming"]
        summary = shown_text(app.screen.query_one("#verifier-summary", Static))
        assert "FAIL 3" in summary and "PASS 10" in summary and "backlog 3" in summary

        expected = {
            "2": PendingScreen,
            "3": VerdictsScreen,
            "4": FailuresScreen,
            "5": ModelsScreen,
            "6": SettingsScreen,
            "1": OverviewScreen,
        }
        for key, kind in expected.items():
            await pilot.press(key)
            assert isinstance(await loaded(pilot), kind)

        await pilot.press("2")
        await loaded(pilot)
        pending = [row[2] for row in cells(app, "#pending")]
        assert pending == [e.record_id for e in EXCHANGES if e.status == PENDING]
        await pilot.press("5")
        await loaded(pilot)
        [engine] = cells(app, "#engines")
        assert engine[0] == "tiny-chat" and engine[1] == "UNLOADED" and engine[4] == "3"


async def test_verdicts_arrive_live_and_reach_the_failures_screen(daemons: Daemons) -> None:
    app = VeritapConsole(daemons.client(), refresh_s=3600)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("4")
        await loaded(pilot)
        failures = app.screen.query_one(VerdictTable)
        assert failures.row_count == 3
        await pilot.press("3")
        await loaded(pilot)
        verdicts = app.screen.query_one(VerdictTable)
        assert verdicts.row_count == len(DECIDED)

        [passed] = await asyncio.to_thread(daemons.decide_pending, 1)
        [failed] = await asyncio.to_thread(daemons.decide_pending, 1, FAIL)
        await until(pilot, lambda: verdicts.row_count == len(DECIDED) + 2, "live verdicts")
        newest = [str(verdicts.get_row_at(i)[-1]) for i in range(2)]
        assert set(newest) == {passed, failed}
        await pilot.press("4")
        await until(pilot, lambda: failures.row_count == 4, "the live failure")
        assert failed in {str(failures.get_row_at(i)[-1]) for i in range(4)}


async def test_the_filter_line_narrows_the_verdicts(daemons: Daemons) -> None:
    app = VeritapConsole(daemons.client(), refresh_s=3600)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("3")
        await loaded(pilot)
        verdicts = app.screen.query_one(VerdictTable)
        await pilot.press("slash")
        assert app.screen.query_one("#filter", Input).has_focus
        await pilot.press(*"fail score>=3.4", "enter")
        tokenizer = daemons.model.tokenizer
        expected = [
            e.record_id
            for e in reversed(DECIDED)
            if e.status == FAIL
            and margins_for(e, len(tokenizer.encode(e.answer).ids)).mean() >= 3.4
        ]
        assert 0 < len(expected) < 3
        await until(pilot, lambda: verdicts.row_count == len(expected), "the filtered list")
        assert [str(verdicts.get_row_at(i)[-1]) for i in range(verdicts.row_count)] == expected
        assert verdicts.has_focus

        await pilot.press("slash", *" bogus:1", "enter")
        count = app.screen.query_one("#count", Static)
        await until(pilot, lambda: "bogus" in shown_text(count), "the filter error")
        assert verdicts.row_count == len(expected)


async def test_a_record_shows_its_tokens_coloured_by_margin_and_its_evidence(
    daemons: Daemons,
) -> None:
    app = VeritapConsole(daemons.client(), refresh_s=3600)
    failing = [e for e in DECIDED if e.status == FAIL][-1]
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("4")
        await loaded(pilot)
        await pilot.press("enter")
        screen = await loaded(pilot)
        assert isinstance(screen, RecordScreen)
        assert screen.record_id == failing.record_id
        response = screen.query_one("#response", Static).content
        assert isinstance(response, Text)
        assert response.plain == failing.answer
        assert len({str(span.style) for span in response.spans}) >= 3
        count = len(daemons.model.tokenizer.encode(failing.answer).ids)
        expected = margins_for(failing, count).astype(np.float16).astype(float)
        assert list(screen.query_one("#margins", Sparkline).data or []) == list(expected)
        evidence = shown_text(screen.query_one("#evidence", Static))
        assert daemons.signer.key_id.hex() in evidence
        assert f"{ORIGIN} seq {failing.index}" in evidence
        await pilot.press("escape")
        assert isinstance(app.screen, FailuresScreen)


async def test_a_settings_change_without_the_admin_certificate_is_refused(
    daemons: Daemons,
) -> None:
    app = VeritapConsole(daemons.client(), refresh_s=3600)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("6")
        await loaded(pilot)
        await pilot.press("e", "ctrl+a", "ctrl+k", *"0.2", "enter")
        await until(pilot, lambda: type(app.screen).__name__ == "ConfirmScreen", "confirm")
        await pilot.press("y")
        status = app.screen.query_one("#settings-status", Static)
        await until(pilot, lambda: "refused" in shown_text(status), "the refusal")
        assert "PERMISSION_DENIED" in shown_text(status)
        assert "ops-operator" in shown_text(status)
    commitment_id = daemons.model.commitment.commitment_id
    assert daemons.store.difr_override(commitment_id) is None
    assert daemons.store.audit_log() == []


async def test_the_admin_changes_settings_after_confirming_and_it_is_audited(
    daemons: Daemons,
) -> None:
    app = VeritapConsole(daemons.client(daemons.pki.admin), refresh_s=3600)
    commitment_id = daemons.model.commitment.commitment_id
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("6")
        screen = await loaded(pilot)
        await pilot.press("e", "ctrl+a", "ctrl+k", *"0.2", "enter")
        await until(pilot, lambda: type(app.screen).__name__ == "ConfirmScreen", "confirm")
        await pilot.press("n")
        assert app.screen is screen
        assert daemons.store.audit_log() == []

        await pilot.press("escape", "r")
        await until(pilot, lambda: screen.loads > 1, "a refresh")
        assert screen.query_one("#threshold", Input).value == "0.2"
        await pilot.press("a")
        await until(pilot, lambda: type(app.screen).__name__ == "ConfirmScreen", "confirm")
        await pilot.press("y")
        status = app.screen.query_one("#settings-status", Static)
        await until(pilot, lambda: "applied" in shown_text(status), "the change")
        await until(pilot, lambda: len(cells(app, "#audit")) == 1, "the audit row")
        [row] = cells(app, "#audit")
        assert row[1] == ADMIN_SUBJECT and row[2] == "tiny-chat: 0.2/10/1"
        assert cells(app, "#commitments")[0][2:] == ["0.2", "10", "1", "*"]
    override = daemons.store.difr_override(commitment_id)
    assert override is not None and override.threshold == 0.2
    [event] = daemons.store.audit_log()
    assert event.actor == ADMIN_SUBJECT


async def test_a_banner_shows_while_verifierd_is_away_and_the_console_keeps_working(
    daemons: Daemons,
) -> None:
    app = VeritapConsole(daemons.client(timeout_s=1.0), refresh_s=0.3)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("3")
        await loaded(pilot)
        verdicts = app.screen.query_one(VerdictTable)
        banner = app.screen.query_one(ConnectionBanner)
        assert not banner.display

        await daemons.stop_verifier()
        await pilot.press("1")
        overview_banner = app.screen.query_one(ConnectionBanner)
        await until(pilot, lambda: overview_banner.display, "the banner")
        assert "verifierd (UNAVAILABLE)" in shown_text(overview_banner)
        # Keys still work while it is away: screens switch and keep their last data.
        for key, kind in (("2", PendingScreen), ("5", ModelsScreen), ("3", VerdictsScreen)):
            await pilot.press(key)
            assert isinstance(app.screen, kind)
        assert verdicts.row_count == len(DECIDED)

        decided = await asyncio.to_thread(daemons.decide_pending, 2)
        await daemons.restart_verifier()
        await until(pilot, lambda: not banner.display, "the banner to go", timeout_s=60)
        await until(
            pilot, lambda: verdicts.row_count == len(DECIDED) + 2, "the verdicts decided meanwhile"
        )
        assert {str(verdicts.get_row_at(i)[-1]) for i in range(2)} == set(decided)


async def test_an_unreachable_collector_is_named_and_its_return_noticed(daemons: Daemons) -> None:
    app = VeritapConsole(daemons.client(timeout_s=1.0), refresh_s=0.3)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        banner = app.screen.query_one(ConnectionBanner)
        await daemons.stop_collector()
        await until(pilot, lambda: banner.display, "the banner")
        assert "edge-1 (UNAVAILABLE)" in shown_text(banner)
        await until(
            pilot, lambda: "unreachable" in cells(app, "#collectors")[0][1], "the collector row"
        )
        await daemons.restart_collector()
        await until(pilot, lambda: not banner.display, "the banner to go", timeout_s=60)
        await until(
            pilot, lambda: cells(app, "#collectors")[0][3] == str(len(EXCHANGES)), "its head"
        )


async def test_a_queued_record_opens_from_the_pending_screen(daemons: Daemons) -> None:
    queued = next(e for e in EXCHANGES if e.status == PENDING)
    app = VeritapConsole(daemons.client(), refresh_s=3600)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        await loaded(pilot)
        await pilot.press("enter")
        screen = await loaded(pilot)
        assert isinstance(screen, RecordScreen)
        assert screen.record_id == queued.record_id
        assert "waiting for its engine" in shown_text(screen.query_one("#headline", Static))
        assert "not decided yet" in shown_text(screen.query_one("#evidence", Static))

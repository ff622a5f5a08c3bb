"""A prover's text reaches the operator's screen as text: never markup, never a control.

The console runs against daemons holding the hostile records (tests.tui.hostile_traffic)
and every view is read back from the screen Textual drew.
"""

from __future__ import annotations

import pytest
from veritap.control_chars import escape_controls

from tests.tui.daemons import Daemons
from tests.tui.hostile_traffic import HOSTILE_TEXT, HOSTILE_VIEWS, SHOWING_IT
from tests.tui.pilot_waits import loaded
from tui.app import VeritapConsole
from tui.screens.record import RecordScreen

pytestmark = pytest.mark.timeout(120)

SIZE = (80, 24)


@pytest.mark.parametrize("view", HOSTILE_VIEWS)
async def test_every_view_shows_the_provers_text_literally_and_escaped(
    hostile_daemons: Daemons, view: str
) -> None:
    app = VeritapConsole(hostile_daemons.client(), refresh_s=3600)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        for key in HOSTILE_VIEWS[view]:
            await pilot.press(key)
            await loaded(pilot)
        drawn = app.export_screenshot()
    acting = {c for c in drawn if c not in "\n\t\\" and escape_controls(c) != c}
    assert not acting, "a control or bidi character reached the screen"
    if view in SHOWING_IT:
        assert "[/x][link=" in drawn, "the markup is shown as written"


async def test_a_hostile_records_detail_reads_back_as_its_escaped_text(
    hostile_daemons: Daemons,
) -> None:
    app = VeritapConsole(hostile_daemons.client(), refresh_s=3600)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        for key in ("4", "enter"):
            await pilot.press(key)
            await loaded(pilot)
        screen = app.screen
        assert isinstance(screen, RecordScreen)
        prompt = screen.query_one("#prompt").render()
        response = screen.query_one("#response").render()
    escaped = escape_controls(HOSTILE_TEXT)
    assert f"user: Repeat after me: {escaped}" in str(prompt)
    assert str(response).startswith(f"Sure: {escaped}")

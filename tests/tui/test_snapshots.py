"""SVG snapshots of every console screen at 80x24, against real daemons.

The recorded traffic fixes every id, time, score and margin; screens that show entry hashes
use daemons whose store holds the records with fixed log stamps (tests.tui.daemons). Ages
are shown coarsely ("<1m"), so the queue looks the same on every run. Regenerate after a
deliberate change with `pytest tests/tui/test_snapshots.py --snapshot-update` and look at
the SVGs before committing them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from textual.pilot import Pilot

from tests.tui.daemons import Daemons
from tests.tui.hostile_traffic import HOSTILE_VIEWS
from tests.tui.pilot_waits import loaded, until
from tui.app import VeritapConsole
from tui.widgets.connection_banner import ConnectionBanner

pytestmark = pytest.mark.timeout(120)

SIZE = (80, 24)
SnapCompare = Callable[..., bool]


def after(*keys: str) -> Callable[[Pilot[None]], Awaitable[None]]:
    """Wait for the first screen's data, then press each key and wait for the data again."""

    async def run_before(pilot: Pilot[None]) -> None:
        await loaded(pilot)
        for key in keys:
            await pilot.press(key)
            await loaded(pilot)

    return run_before


def console(daemons: Daemons, **kwargs: Any) -> VeritapConsole:
    return VeritapConsole(daemons.client(**kwargs), refresh_s=3600)


def test_overview(snap_compare: SnapCompare, daemons: Daemons) -> None:
    assert snap_compare(console(daemons), terminal_size=SIZE, run_before=after())


def test_pending(snap_compare: SnapCompare, fixed_daemons: Daemons) -> None:
    assert snap_compare(console(fixed_daemons), terminal_size=SIZE, run_before=after("2"))


def test_verdicts(snap_compare: SnapCompare, fixed_daemons: Daemons) -> None:
    assert snap_compare(console(fixed_daemons), terminal_size=SIZE, run_before=after("3"))


def test_verdicts_filtered(snap_compare: SnapCompare, fixed_daemons: Daemons) -> None:
    async def run_before(pilot: Pilot[None]) -> None:
        await after("3")(pilot)
        screen = pilot.app.screen
        before = getattr(screen, "loads", 0)
        await pilot.press("slash", *"unverifiable skipped", "enter")
        await until(pilot, lambda: getattr(screen, "loads", 0) > before, "the filtered list")

    assert snap_compare(console(fixed_daemons), terminal_size=SIZE, run_before=run_before)


def test_failures(snap_compare: SnapCompare, fixed_daemons: Daemons) -> None:
    assert snap_compare(console(fixed_daemons), terminal_size=SIZE, run_before=after("4"))


def test_record_detail(snap_compare: SnapCompare, fixed_daemons: Daemons) -> None:
    assert snap_compare(console(fixed_daemons), terminal_size=SIZE, run_before=after("4", "enter"))


def test_models(snap_compare: SnapCompare, fixed_daemons: Daemons) -> None:
    assert snap_compare(console(fixed_daemons), terminal_size=SIZE, run_before=after("5"))


def test_settings(snap_compare: SnapCompare, fixed_daemons: Daemons) -> None:
    assert snap_compare(console(fixed_daemons), terminal_size=SIZE, run_before=after("6"))


def test_settings_confirmation(snap_compare: SnapCompare, fixed_daemons: Daemons) -> None:
    async def run_before(pilot: Pilot[None]) -> None:
        await after("6")(pilot)
        await pilot.press("e", "ctrl+a", "ctrl+k", *"0.2", "tab", "ctrl+a", "ctrl+k", "8")
        await pilot.press("enter")
        await until(pilot, lambda: type(pilot.app.screen).__name__ == "ConfirmScreen", "confirm")

    assert snap_compare(console(fixed_daemons), terminal_size=SIZE, run_before=run_before)


def test_verifierd_away(snap_compare: SnapCompare, fixed_daemons: Daemons) -> None:
    async def run_before(pilot: Pilot[None]) -> None:
        await after("3")(pilot)
        await fixed_daemons.stop_verifier()
        await pilot.press("r")
        banner = pilot.app.screen.query_one(ConnectionBanner)
        await until(pilot, lambda: banner.display, "the banner")

    assert snap_compare(
        console(fixed_daemons, timeout_s=1.0), terminal_size=SIZE, run_before=run_before
    )


@pytest.mark.parametrize("keys", HOSTILE_VIEWS.values(), ids=HOSTILE_VIEWS.keys())
def test_hostile_record(
    snap_compare: SnapCompare, hostile_daemons: Daemons, keys: tuple[str, ...]
) -> None:
    """The prover's markup, escape sequences, bidi overrides and 10,000-character model
    name are shown as text, escaped, on every screen (tests.tui.hostile_traffic)."""
    assert snap_compare(console(hostile_daemons), terminal_size=SIZE, run_before=after(*keys))


def test_provers(snap_compare: SnapCompare, prover_daemons: Daemons) -> None:
    assert snap_compare(console(prover_daemons), terminal_size=SIZE, run_before=after("7"))


def test_overview_with_a_prover_alarm(snap_compare: SnapCompare, prover_daemons: Daemons) -> None:
    assert snap_compare(console(prover_daemons), terminal_size=SIZE, run_before=after())

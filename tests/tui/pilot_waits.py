"""Pilot test helpers: bounded waits between frames, and the text a widget shows."""

from __future__ import annotations

import io
import time
from collections.abc import Callable

from rich.console import Console
from rich.text import Text
from textual.pilot import Pilot
from textual.widgets import Static

from tui.screens.console_screen import ConsoleScreen


async def until(
    pilot: Pilot[None], condition: Callable[[], bool], what: str, timeout_s: float = 30.0
) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.05)


async def loaded(pilot: Pilot[None], timeout_s: float = 30.0) -> ConsoleScreen:
    """The current screen, once it has shown data at least once."""

    def ready() -> bool:
        screen = pilot.app.screen
        return isinstance(screen, ConsoleScreen) and screen.loads > 0

    await until(pilot, ready, f"{type(pilot.app.screen).__name__} to load", timeout_s)
    await pilot.pause()
    screen = pilot.app.screen
    assert isinstance(screen, ConsoleScreen)
    return screen


def shown_text(static: Static) -> str:
    """The plain text a Static shows (its Text, string or Rich renderable)."""
    content = static.content
    if isinstance(content, Text):
        return content.plain
    if isinstance(content, str):
        return content
    out = io.StringIO()
    Console(width=200, file=out, color_system=None).print(content)
    return out.getvalue()

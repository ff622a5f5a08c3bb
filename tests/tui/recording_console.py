"""The console keeping every notification it shows, and the messages shown under a title."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from textual.notifications import SeverityLevel

import tui.app
from tui.app import VeritapConsole


class RecordingConsole(VeritapConsole):
    """The console, keeping every notification it shows as (title, message)."""

    # Textual reads a relative CSS_PATH beside the subclass's module.
    CSS_PATH = str(Path(tui.app.__file__).with_name("console.tcss"))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.notifications: list[tuple[str, str]] = []

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = True,
    ) -> None:
        self.notifications.append((title, message))
        super().notify(message, title=title, severity=severity, timeout=timeout, markup=markup)


def notified(app: RecordingConsole, title: str) -> list[str]:
    return [message for shown, message in app.notifications if shown.startswith(title)]

"""The top line: the console's screens with their keys, the current one lit (the name is
the terminal's title: seven screens fill the 80 columns)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

#: (key, mode, label) of every screen reachable from anywhere.
NAVIGATION = (
    ("1", "overview", "Overview"),
    ("2", "pending", "Pending"),
    ("3", "verdicts", "Verdicts"),
    ("4", "failures", "Failures"),
    ("5", "models", "Models"),
    ("6", "settings", "Settings"),
    ("7", "provers", "Provers"),
)


class NavBar(Static):
    def __init__(self, current: str) -> None:
        super().__init__()
        self._current = current

    def render(self) -> Text:
        text = Text()
        for key, mode, label in NAVIGATION:
            if mode == self._current:
                text.append(f" {key} {label} ", style="reverse bold")
            else:
                text.append(f" {key}", style="bold cyan")
                text.append(f" {label} ")
        return text

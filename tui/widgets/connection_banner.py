"""A banner that appears while a daemon does not answer, and goes when it is back."""

from __future__ import annotations

from textual.widgets import Static

from tui import formats


class ConnectionBanner(Static):
    """Shows the app's ``outage`` text; hidden while it is empty."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, markup=False)

    def on_mount(self) -> None:
        self.watch(self.app, "outage", self._show, init=True)

    def _show(self, text: str) -> None:
        self.update(formats.shown(text))
        self.display = bool(text)

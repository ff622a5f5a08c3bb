"""A yes/no question over the current screen: nothing changes until the operator says yes."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

from tui import formats


class ConfirmScreen(ModalScreen[bool]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n", "answer(False)", "No"),
        Binding("escape", "answer(False)", "No", show=False),
    ]

    def __init__(self, title: str, lines: list[str]) -> None:
        super().__init__()
        self._title = title
        self._lines = lines

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm"):
            yield Static(formats.shown(self._title), id="confirm-title", markup=False)
            yield Static(formats.shown("\n".join(self._lines)), id="confirm-body", markup=False)
            yield Static("[b]y[/] apply    [b]n[/] cancel", id="confirm-keys")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)

"""Verdicts: every verdict, newest first, filtered by a line the operator types, live."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import Input, Static

from tui import formats
from tui.screens.verdict_list import LISTED, VerdictListScreen
from tui.verdict_filter import FilterSyntaxError, VerdictFilterSpec, parse_filter
from tui.widgets.verdict_table import VerdictTable

_PLACEHOLDER = "filter: fail error model:NAME score>=1.5 since:2025-03-01T09:00  (Enter)"


class VerdictsScreen(VerdictListScreen):
    NAV = "verdicts"
    AUTO_FOCUS = "VerdictTable"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash", "focus_filter", "Filter"),
        Binding("escape", "focus_table", "Table", show=False),
    ]

    def compose_body(self) -> ComposeResult:
        yield Input(placeholder=_PLACEHOLDER, id="filter", compact=True)
        yield Static(id="count", classes="note", markup=False)
        yield VerdictTable(VerdictFilterSpec(), limit=LISTED)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        try:
            spec = parse_filter(event.value)
        except FilterSyntaxError as exc:
            self.query_one("#count", Static).update(
                Text.assemble(("filter: ", "bold red"), formats.shown(str(exc)))
            )
            return
        self.table().spec = spec
        self.table().focus()
        self.action_reload()

    def action_focus_filter(self) -> None:
        self.query_one("#filter", Input).focus()

    def action_focus_table(self) -> None:
        self.table().focus()

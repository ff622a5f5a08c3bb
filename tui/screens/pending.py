"""Pending: the verifier's queue, per model and record by record (oldest first)."""

from __future__ import annotations

import asyncio
import time

from textual.app import ComposeResult
from textual.widgets import DataTable, Label

from tui import formats
from tui.screens.console_screen import ConsoleScreen
from tui.widgets.backlog_table import BacklogTable
from tui.widgets.keyed_table import KeyedTable, OpenableTable

_SHOWN = 200


class PendingScreen(ConsoleScreen):
    NAV = "pending"
    AUTO_FOCUS = "#pending"

    def __init__(self) -> None:
        super().__init__()
        #: (record id, origin) by row key.
        self._pending: dict[str, tuple[str, str]] = {}

    def compose_body(self) -> ComposeResult:
        yield Label("Backlog by model", classes="section")
        yield BacklogTable(id="backlog")
        yield Label("Waiting records, oldest first", classes="section")
        yield OpenableTable(id="pending")

    def on_mount(self) -> None:
        pending = self.query_one("#pending", KeyedTable)
        pending.add_column("Age", width=5)
        pending.add_column("Model", width=12)
        pending.add_column("Record", width=26)
        pending.add_column("Tries", width=5)
        pending.add_column("Last error", width=16)

    async def load(self) -> None:
        stats, items, commitments = await asyncio.gather(
            self.client.stats(), self.client.pending(_SHOWN), self.client.commitments()
        )
        names = {c.commitment_id: ", ".join(c.served_model_names) for c in commitments}
        self.query_one("#backlog", BacklogTable).show_backlog(stats.backlog, names)
        now = time.time_ns()
        self._pending = {f"{p.origin}\x00{p.seq}": (p.record_id, p.origin) for p in items}
        self.query_one("#pending", KeyedTable).show_rows(
            [
                (
                    f"{p.origin}\x00{p.seq}",
                    (
                        formats.age(now - p.enqueued_at_ns),
                        p.model or names.get(p.commitment_id, "?"),
                        p.record_id,
                        str(p.attempts),
                        formats.shown(p.last_error, style="yellow") if p.last_error else "",
                    ),
                )
                for p in items
            ]
        )

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id == "pending":
            self.action_open()

    def action_open(self) -> None:
        key = self.query_one("#pending", KeyedTable).current_key()
        if key is not None and key in self._pending:
            record_id, origin = self._pending[key]
            self.console.open_record(record_id, origin)

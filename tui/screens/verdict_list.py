"""The frame of the Verdicts and Failures screens: a verdict table fed by ListVerdicts and
kept current by the app's WatchVerdicts stream."""

from __future__ import annotations

from textual.widgets import DataTable, Static
from veritap.v1 import verifier_pb2

from tui.screens.console_screen import ConsoleScreen
from tui.verdict_filter import VerdictFilterSpec
from tui.widgets.verdict_table import VerdictTable

#: Verdicts a screen lists (the newest that match); live ones are added on top.
LISTED = 500


class VerdictListScreen(ConsoleScreen):
    POLL = False

    def table(self) -> VerdictTable:
        return self.query_one(VerdictTable)

    def on_mount(self) -> None:
        self._unsubscribe = self.console.live.subscribe(self._live, self.action_reload)

    def on_unmount(self) -> None:
        self._unsubscribe()

    def spec(self) -> VerdictFilterSpec:
        return self.table().spec

    async def load(self) -> None:
        await self.console.live.wait_ready()
        self.table().listing()
        self.table().replace(await self.client.verdicts(self.spec(), LISTED))
        self._count()

    def _live(self, verdict: verifier_pb2.Verdict) -> None:
        if self.table().add_live(verdict):
            self._count()

    def _count(self) -> None:
        shown = self.table().shown
        text = f"{shown} verdict{'s' if shown != 1 else ''}, newest first"
        if shown >= LISTED:
            text += f" (the newest {LISTED}: narrow the filter for older ones)"
        self.query_one("#count", Static).update(text)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open()

    def action_open(self) -> None:
        verdict = self.table().verdict_at_cursor()
        if verdict is not None:
            self.console.open_record(verdict.record_id, verdict.origin)

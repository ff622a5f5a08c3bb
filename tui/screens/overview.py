"""Overview: every collector (capture, drops, log head, intake lag), the verifier
(verdict counts, verdicts superseded by amendments, backlog, throughput, VCA) and the
prover alarms in force on one screen.

The alarms are the provers' in force (ListProvers), listed again whenever the app's
WatchAlarms stream says one was raised or cleared, so a new alarm shows at once; the
Provers screen (7) has their evidence and records.

A collector whose intake stopped on an alert (fork, rollback, gap, bad signature) shows
``alert: REASON`` in red; with its row highlighted, ``c`` shows the evidence and clears
the alert with a reason (admin certificate; verifierd refuses while the collector's log
still disagrees with what it stored, and the notification says why)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import DataTable, Label, Static
from veritap.v1 import ledger_pb2, verifier_pb2

from tui import formats
from tui.client import CallRefusedError, CollectorReading, DaemonUnavailableError
from tui.screens.clear_alert import ClearAlertScreen
from tui.screens.console_screen import ConsoleScreen
from tui.widgets.backlog_table import BacklogTable
from tui.widgets.keyed_table import KeyedTable, Row
from tui.widgets.verdict_table import STATUS_STYLES

_COUNTED = (
    verifier_pb2.VERDICT_STATUS_PASS,
    verifier_pb2.VERDICT_STATUS_FAIL,
    verifier_pb2.VERDICT_STATUS_UNVERIFIABLE,
    verifier_pb2.VERDICT_STATUS_SKIPPED,
    verifier_pb2.VERDICT_STATUS_ERROR,
)


@dataclass(frozen=True)
class _Sample:
    packets: int
    at: float


class OverviewScreen(ConsoleScreen):
    NAV = "overview"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("c", "clear_alert", "Clear alert…"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self._samples: dict[str, _Sample] = {}
        #: Collector rows whose intake is stopped by an alert: row key -> origin.
        self._alerted: dict[str, str] = {}

    def compose_body(self) -> ComposeResult:
        yield Label("Collectors", classes="section")
        yield KeyedTable(id="collectors")
        yield Label("Verifier", classes="section")
        yield Static(id="verifier-summary")
        yield Label("Prover alarms", classes="section")
        yield Static(id="overview-alarms", markup=False)
        yield Label("Backlog", classes="section")
        yield BacklogTable(id="backlog")

    def on_mount(self) -> None:
        # After a reconnection the stream sends the alarms in force again, each a reload;
        # one cleared meanwhile goes at the next refresh.
        self._stop_hearing = self.console.alarms.subscribe(
            lambda _: self.action_reload(), lambda: None
        )
        collectors = self.query_one("#collectors", KeyedTable)
        collectors.add_column("Collector", width=14)
        collectors.add_column("Capture", width=13)
        collectors.add_column("Drops", width=6)
        collectors.add_column("Log head", width=8)
        collectors.add_column("Lag", width=5)
        collectors.add_column("Intake", width=16)

    def on_unmount(self) -> None:
        self._stop_hearing()

    async def _alarmed_provers(self) -> list[verifier_pb2.Prover] | str:
        """The provers with an alarm in force, or why verifierd gives none."""
        try:
            return await self.client.provers(alarmed_only=True)
        except CallRefusedError as exc:
            return f"not kept by this verifierd ({exc.code})"

    def _show_alarms(self, alarmed: list[verifier_pb2.Prover] | str) -> None:
        if isinstance(alarmed, str):
            text = formats.shown(alarmed, "dim")
        elif not alarmed:
            text = formats.shown("none in force", "green")
        else:
            lines = [
                f"{formats.prover_label(p.id)}  {formats.alarm_line(state.alarm)}"
                for p in alarmed
                for state in p.alarms
            ]
            text = formats.shown("\n".join(lines), "bold red")
        self.query_one("#overview-alarms", Static).update(text)

    async def load(self) -> None:
        stats, readings, commitments, alarmed = await asyncio.gather(
            self.client.stats(),
            self.client.collector_readings(),
            self.client.commitments(),
            self._alarmed_provers(),
        )
        self._show_collectors(stats, readings)
        self._show_summary(stats)
        self._show_alarms(alarmed)
        names = {c.commitment_id: ", ".join(c.served_model_names) for c in commitments}
        self.query_one("#backlog", BacklogTable).show_backlog(stats.backlog, names)

    def _capture(self, name: str, status: ledger_pb2.GetStatusResponse) -> str:
        if not status.HasField("capture"):
            return "not capturing"
        now = time.monotonic()
        previous = self._samples.get(name)
        self._samples[name] = _Sample(status.capture.packets, now)
        if previous is None or now <= previous.at:
            return "—"
        return formats.rate((status.capture.packets - previous.packets) / (now - previous.at))

    def _show_collectors(
        self, stats: verifier_pb2.GetStatsResponse, readings: list[CollectorReading]
    ) -> None:
        intake = {i.origin: i for i in stats.intake}
        rows: list[Row] = []
        seen: set[str] = set()
        alerted = {origin for origin, link in intake.items() if link.state.startswith("alert")}
        self._alerted = {}
        for reading in readings:
            name = reading.endpoint.name
            if reading.status is None:
                rows.append(
                    (
                        name,
                        (
                            name,
                            formats.shown(f"unreachable ({reading.code})", "red"),
                            "",
                            "",
                            "",
                            "",
                        ),
                    )
                )
                continue
            status = reading.status
            seen.add(status.origin)
            link = intake.get(status.origin)
            if status.origin in alerted:
                self._alerted[name] = status.origin
            lag = "" if link is None else formats.count(max(0, status.head_seq - link.stored_seq))
            drops = (
                formats.count(status.capture.kernel_drops) if status.HasField("capture") else "—"
            )
            rows.append(
                (
                    name,
                    (
                        name,
                        self._capture(name, status),
                        drops,
                        formats.count(status.head_seq),
                        lag,
                        _intake_state(link),
                    ),
                )
            )
        for origin, link in sorted(intake.items()):
            if origin not in seen:
                if origin in alerted:
                    self._alerted[origin] = origin
                lag = formats.count(max(0, link.remote_head_seq - link.stored_seq))
                rows.append((origin, (origin, "—", "—", "—", lag, _intake_state(link))))
        self.query_one("#collectors", KeyedTable).show_rows(rows)
        self.refresh_bindings()

    # -- clearing an intake alert -------------------------------------------------------

    def _alerted_origin(self) -> str | None:
        return self._alerted.get(self.query_one("#collectors", KeyedTable).current_key() or "")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "clear_alert":
            return self._alerted_origin() is not None
        return True

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "collectors":
            self.refresh_bindings()

    def action_clear_alert(self) -> None:
        origin = self._alerted_origin()
        if origin is not None:
            self._ask_clear(origin)

    @work(exclusive=True, group="clear-alert")
    async def _ask_clear(self, origin: str) -> None:
        try:
            alerts = await self.client.intake_alerts()
        except (CallRefusedError, DaemonUnavailableError) as exc:
            self.tell(str(exc), title="no alert list", severity="error")
            return
        alert = next((a for a in alerts if a.origin == origin), None)
        if alert is None:
            self.tell(f"{origin} has no alert in force", title="nothing to clear")
            self.action_reload()
            return
        reason = await self.app.push_screen_wait(ClearAlertScreen(alert))
        if reason is None:
            return
        self.tell(f"asking verifierd to resume {origin}…", title="clearing")
        try:
            cleared = await self.client.clear_intake_alert(origin, reason)
        except CallRefusedError as exc:
            self.tell(exc.details, title=f"not cleared ({exc.code})", severity="error", timeout=20)
            return
        except DaemonUnavailableError as exc:
            self.tell(str(exc), title="not cleared", severity="error")
            return
        self.tell(cleared.clear_check, title=f"{origin}: intake resumes", timeout=10)
        self.action_reload()

    def _show_summary(self, stats: verifier_pb2.GetStatsResponse) -> None:
        counts = Text()
        for status in _COUNTED:
            name = formats.status_name(status)
            number = stats.verdicts_by_status.get(verifier_pb2.VerdictStatus.Name(status), 0)
            counts.append(f"{name} ", style=STATUS_STYLES.get(status, ""))
            counts.append(f"{formats.count(number)}   ")
        vca = f"{stats.vca:.1f}x ({stats.vca_method})" if stats.vca_method else "n/a"
        line = (
            f"backlog {formats.count(stats.pending)}   inbox {formats.count(stats.inbox)} "
            f"({formats.count(stats.awaiting_checkpoint)} awaiting checkpoint)   "
            f"verdicts {formats.rate(stats.verdicts_per_second)}   VCA {vca}"
        )
        summary = Text.assemble(counts, "\n", _superseded(stats.verdicts_superseded), "\n", line)
        self.query_one("#verifier-summary", Static).update(summary)


def _superseded(number: int) -> Text:
    """How many verdicts amendments replaced. The counts by status are each record's
    current verdict: a FAIL an amendment withdrew is counted here and its record under
    UNVERIFIABLE (record_amended), no more under FAIL."""
    return Text.assemble(
        "superseded by amendments ",
        (formats.count(number), "yellow" if number else ""),
        (" (each record counts once, by its current verdict)", "dim"),
    )


def _intake_state(link: verifier_pb2.CollectorIntake | None) -> Text:
    if link is None:
        return formats.shown("not subscribed", "dim")
    style = "red" if link.state.startswith("alert") else ""
    if link.state.startswith("retrying"):
        style = "yellow"
    return formats.shown(link.state, style)

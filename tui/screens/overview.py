"""Overview: every collector (capture, drops, log head, intake lag) and the verifier
(verdict counts, backlog, throughput, VCA) on one screen."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Label, Static
from veritap.v1 import ledger_pb2, verifier_pb2

from tui import formats
from tui.client import CollectorReading
from tui.screens.console_screen import ConsoleScreen
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

    def __init__(self) -> None:
        super().__init__()
        self._samples: dict[str, _Sample] = {}

    def compose_body(self) -> ComposeResult:
        yield Label("Collectors", classes="section")
        yield KeyedTable(id="collectors")
        yield Label("Verifier", classes="section")
        yield Static(id="verifier-summary")
        yield Label("Backlog", classes="section")
        yield KeyedTable(id="backlog")

    def on_mount(self) -> None:
        collectors = self.query_one("#collectors", KeyedTable)
        collectors.add_column("Collector", width=14)
        collectors.add_column("Capture", width=13)
        collectors.add_column("Drops", width=6)
        collectors.add_column("Log head", width=8)
        collectors.add_column("Lag", width=5)
        collectors.add_column("Intake", width=16)
        backlog = self.query_one("#backlog", KeyedTable)
        backlog.add_column("Model", width=14)
        backlog.add_column("Commitment", width=12)
        backlog.add_column("Pending", width=8)
        backlog.add_column("Oldest", width=8)

    async def load(self) -> None:
        stats, readings, commitments = await asyncio.gather(
            self.client.stats(), self.client.collector_readings(), self.client.commitments()
        )
        self._show_collectors(stats, readings)
        self._show_summary(stats)
        names = {c.commitment_id: ", ".join(c.served_model_names) for c in commitments}
        self.query_one("#backlog", KeyedTable).show_rows(
            [
                (
                    b.commitment_id,
                    (
                        names.get(b.commitment_id, "?"),
                        formats.short_id(b.commitment_id),
                        formats.count(b.pending),
                        formats.age(b.oldest_pending_age_ns),
                    ),
                )
                for b in stats.backlog
            ]
        )

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
        for reading in readings:
            name = reading.endpoint.name
            if reading.status is None:
                rows.append(
                    (
                        name,
                        (name, Text(f"unreachable ({reading.code})", style="red"), "", "", "", ""),
                    )
                )
                continue
            status = reading.status
            seen.add(status.origin)
            link = intake.get(status.origin)
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
                lag = formats.count(max(0, link.remote_head_seq - link.stored_seq))
                rows.append((origin, (origin, "—", "—", "—", lag, _intake_state(link))))
        self.query_one("#collectors", KeyedTable).show_rows(rows)

    def _show_summary(self, stats: verifier_pb2.GetStatsResponse) -> None:
        counts = Text()
        for status in _COUNTED:
            name = formats.status_name(status)
            number = stats.verdicts_by_status.get(verifier_pb2.VerdictStatus.Name(status), 0)
            counts.append(f"{name} ", style=STATUS_STYLES.get(status, ""))
            counts.append(f"{formats.count(number)}   ")
        vca = f"{stats.vca:.1f}x ({stats.vca_method})" if stats.vca_method else "n/a"
        line = (
            f"backlog {formats.count(stats.pending)}   inbox {formats.count(stats.inbox)}   "
            f"verdicts {formats.rate(stats.verdicts_per_second)}   VCA {vca}"
        )
        self.query_one("#verifier-summary", Static).update(Text.assemble(counts, "\n", line))


def _intake_state(link: verifier_pb2.CollectorIntake | None) -> Text:
    if link is None:
        return Text("not subscribed", style="dim")
    style = "red" if link.state.startswith("alert") else ""
    if link.state.startswith("retrying"):
        style = "yellow"
    return Text(link.state, style=style)

"""Provers: each (collector origin, server address and port) verifierd judges, its state,
the sequential test's statistic over time, and the records behind its alarms.

The table lists every prover (ListProvers), those with an alarm first: its state (the
alarms in force, or ``ok``, or ``no test`` while none runs: no honest calibration is
stored for what it serves, or an alarm was just cleared), the test's statistic against
the bound that raises an alarm, the tokens pooled, and, since first seen, its share of
UNVERIFIABLE verdicts and the share of its sampled traffic (requests at a temperature
above 0) that came without a seed ("—" while none sampled): what the site's seed
gateway leaves unverifiable. For the highlighted prover (GetProver): its traffic since
first seen (verdicts, the UNVERIFIABLE share by reason, the sampled verdicts without a
seed), the statistic after each verdict that moved it as a sparkline, its alarms, and
the records of the verdicts that drove them; Enter on one opens it. ``c`` clears the
highlighted prover's alarms in force with a reason (admin certificate; each alarm is
kept, marked cleared, and the audit log keeps the reason).
"""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import DataTable, Label, Sparkline, Static
from veritap.v1 import verifier_pb2

from tui import formats
from tui.client import CallRefusedError, DaemonUnavailableError
from tui.screens.clear_alert import ClearWithReasonScreen
from tui.screens.console_screen import ConsoleScreen
from tui.widgets.keyed_table import KeyedTable, OpenableTable, Row

_ALARM_STYLE = "bold red"


def prover_key(prover: verifier_pb2.ProverId) -> str:
    return f"{prover.origin}\x00{prover.server_address}\x00{prover.server_port}"


def state_text(prover: verifier_pb2.Prover) -> Text:
    if prover.alarms:
        kinds = sorted({formats.alarm_kind_name(a.alarm.kind) for a in prover.alarms})
        return formats.shown(" ".join(kinds), _ALARM_STYLE)
    if not prover.evidence_bound:
        return formats.shown("no test", "dim")
    return formats.shown("ok", "green")


def _since_first_seen(prover: verifier_pb2.Prover) -> verifier_pb2.ProverWindow | None:
    return next((w for w in prover.windows if w.window_s == 0), None)


def unseeded_cell(window: verifier_pb2.ProverWindow | None) -> str:
    """The share of the window's sampled verdicts that came without a seed ("—": none
    sampled, so the share says nothing)."""
    if window is None or not window.needs_seed_verdicts:
        return "—"
    return f"{window.unseeded_share:.0%}"


def prover_row(prover: verifier_pb2.Prover) -> Row:
    whole = _since_first_seen(prover)
    evidence = (
        f"{prover.evidence:.1f} / {prover.evidence_bound:.1f}" if prover.evidence_bound else "—"
    )
    return (
        prover_key(prover.id),
        (
            formats.prover_label(prover.id),
            state_text(prover),
            evidence,
            formats.count(prover.pooled_tokens),
            f"{whole.unverifiable_ratio:.0%}" if whole is not None else "—",
            unseeded_cell(whole),
        ),
    )


def traffic_text(prover: verifier_pb2.Prover) -> Text:
    """The prover's traffic since first seen: its verdicts, the UNVERIFIABLE share by
    reason (largest first), and its sampled verdicts without a seed."""
    whole = _since_first_seen(prover)
    if whole is None or not whole.verdicts:
        return formats.shown("Traffic: no verdict yet", "dim")
    line = f"Traffic since first seen: {formats.count(whole.verdicts)} verdicts"
    if whole.unverifiable_share:
        reasons = sorted(whole.unverifiable_share.items(), key=lambda item: (-item[1], item[0]))
        shares = ", ".join(f"{reason} {share:.0%}" for reason, share in reasons)
        line += f", {whole.unverifiable_ratio:.0%} UNVERIFIABLE ({shares})"
    if whole.needs_seed_verdicts:
        line += (
            f"; {whole.unseeded_share:.0%} of {formats.count(whole.needs_seed_verdicts)} "
            "sampled without a seed"
        )
    return formats.shown(line)


def alarms_text(alarms: list[verifier_pb2.AlarmState]) -> Text:
    """Every alarm, oldest first: in force in red, cleared ones with who cleared them."""
    if not alarms:
        return formats.shown("no alarm so far", "dim")
    text = Text()
    for n, state in enumerate(alarms):
        if n:
            text.append("\n")
        line = formats.alarm_line(state.alarm)
        if state.cleared_at_ns:
            text.append_text(formats.shown(line, "dim"))
            text.append_text(
                formats.shown(
                    f"\n  cleared {formats.utc_time(state.cleared_at_ns)} UTC by "
                    f"{state.cleared_by}: {state.clear_reason}",
                    "dim",
                )
            )
        else:
            text.append_text(formats.shown(line, _ALARM_STYLE))
        if state.alarm.detail:
            text.append_text(formats.shown(f"\n  {state.alarm.detail}"))
    return text


class ProversScreen(ConsoleScreen):
    NAV = "provers"
    AUTO_FOCUS = "#provers"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("c", "clear_alarm", "Clear alarm…"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self._provers: dict[str, verifier_pb2.Prover] = {}
        #: (record id, origin) by row key of the records behind the alarms.
        self._records: dict[str, tuple[str, str]] = {}

    def compose_body(self) -> ComposeResult:
        yield Label("Provers", classes="section")
        yield KeyedTable(id="provers")
        yield Static(id="prover-traffic", markup=False)
        yield Label(id="evidence-title", classes="section", markup=False)
        yield Sparkline([], id="prover-evidence")
        yield Label("Alarms", classes="section")
        yield Static(id="alarms", markup=False)
        yield Label("Records behind the alarms, newest last", classes="section")
        yield OpenableTable(id="alarm-records")

    def on_mount(self) -> None:
        provers = self.query_one("#provers", KeyedTable)
        provers.add_column("Prover", width=25)
        provers.add_column("State", width=9)
        provers.add_column("ln e / bound", width=12)
        provers.add_column("Tokens", width=7)
        provers.add_column("Unver.", width=6)
        provers.add_column("Unseeded", width=8)
        records = self.query_one("#alarm-records", KeyedTable)
        records.add_column("Record", width=28)
        records.add_column("Alarm", width=10)
        records.add_column("Raised (UTC)", width=14)

    async def load(self) -> None:
        provers = sorted(
            await self.client.provers(),
            key=lambda p: (not p.alarms, formats.prover_label(p.id)),
        )
        self._provers = {prover_key(p.id): p for p in provers}
        self.query_one("#provers", KeyedTable).show_rows([prover_row(p) for p in provers])
        self.refresh_bindings()
        await self._show_detail()

    async def _show_detail(self) -> None:
        key = self.query_one("#provers", KeyedTable).current_key()
        prover = self._provers.get(key or "")
        traffic = self.query_one("#prover-traffic", Static)
        if prover is None:
            traffic.update("")
            self._show_title("no prover judged yet")
            return
        detail = await self.client.prover(prover.id)
        traffic.update(traffic_text(detail.prover))
        points = [p.statistic for p in detail.evidence_history]
        sparkline = self.query_one("#prover-evidence", Sparkline)
        sparkline.data = points
        sparkline.display = bool(points)
        bound = detail.prover.evidence_bound
        self._show_title(
            f"Test statistic (ln e-value), last {len(points)} verdicts; alarm at {bound:.1f}"
            if bound
            else "Test statistic: no test running"
        )
        self.query_one("#alarms", Static).update(alarms_text(list(detail.alarms)))
        rows: list[Row] = []
        self._records = {}
        for state in detail.alarms:
            alarm = state.alarm
            for n, record_id in enumerate(alarm.record_ids):
                row_key = f"{alarm.alarm_id}\x00{n}"
                self._records[row_key] = (record_id, alarm.prover.origin)
                rows.append(
                    (
                        row_key,
                        (
                            record_id,
                            formats.alarm_kind_name(alarm.kind),
                            formats.utc_time(alarm.raised_at_ns),
                        ),
                    )
                )
        self.query_one("#alarm-records", KeyedTable).show_rows(rows)

    def _show_title(self, text: str) -> None:
        self.query_one("#evidence-title", Label).update(formats.shown(text))

    def _highlighted(self) -> verifier_pb2.Prover | None:
        return self._provers.get(self.query_one("#provers", KeyedTable).current_key() or "")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "clear_alarm":
            prover = self._highlighted()
            return prover is not None and bool(prover.alarms)
        return True

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "provers":
            self.refresh_bindings()
            self._reload_detail()

    def action_clear_alarm(self) -> None:
        prover = self._highlighted()
        if prover is not None and prover.alarms:
            self._ask_clear(prover)

    @work(exclusive=True, group="clear-alarm")
    async def _ask_clear(self, prover: verifier_pb2.Prover) -> None:
        label = formats.prover_label(prover.id)
        lines = [formats.alarm_line(state.alarm) for state in prover.alarms]
        reason = await self.app.push_screen_wait(
            ClearWithReasonScreen(
                f"Clear the alarms on {label}?",
                lines,
                "The alarms are kept, marked cleared; a DISHONEST one restarts the test.",
            )
        )
        if reason is None:
            return
        for state in prover.alarms:
            try:
                await self.client.clear_alarm(state.alarm.alarm_id, reason)
            except (CallRefusedError, DaemonUnavailableError) as exc:
                self.tell(str(exc), title="not cleared", severity="error", timeout=20)
                return
        self.tell(f"{label}: {len(prover.alarms)} cleared", title="alarms cleared")
        self.action_reload()

    @work(exclusive=True, group="prover")
    async def _reload_detail(self) -> None:
        try:
            await self._show_detail()
        except DaemonUnavailableError:
            return
        except CallRefusedError as exc:
            self.tell(str(exc), title="verifierd refused", severity="error")

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id == "alarm-records":
            key = self.query_one("#alarm-records", KeyedTable).current_key()
            if key is not None and key in self._records:
                self.console.open_record(*self._records[key])

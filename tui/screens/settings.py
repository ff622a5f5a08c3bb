"""Settings: a commitment's DiFR threshold, Δmax and sample rate, changed with a
confirmation step (verifierd accepts the change only from the admin certificate and
writes it to its audit log, shown below the form)."""

from __future__ import annotations

import asyncio
import json
from typing import ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.widgets import DataTable, Input, Label, Static
from veritap.v1 import verifier_pb2

from tui import formats
from tui.client import CallRefusedError, DaemonUnavailableError
from tui.screens.confirm import ConfirmScreen
from tui.screens.console_screen import ConsoleScreen
from tui.settings_form import SettingsInputError, change_lines, parse_settings
from tui.widgets.keyed_table import KeyedTable

_AUDIT_SHOWN = 20
_FIELDS = ("threshold", "delta_max", "sample_rate")


class SettingsScreen(ConsoleScreen):
    NAV = "settings"
    AUTO_FOCUS = "#commitments"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("a", "apply", "Apply…"),
        Binding("e", "edit", "Edit"),
        Binding("escape", "focus_table", "Table", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self._commitments: dict[str, verifier_pb2.Commitment] = {}
        #: The commitment the form shows, and the values it was filled with.
        self._editing = ""
        self._filled: dict[str, str] = {}

    def compose_body(self) -> ComposeResult:
        yield Label("Commitments (* = changed from the commitment file)", classes="section")
        yield KeyedTable(id="commitments")
        with Horizontal(id="form"):
            yield Label("threshold")
            yield Input(id="threshold", compact=True)
            yield Label("Δmax")
            yield Input(id="delta_max", compact=True)
            yield Label("sample")
            yield Input(id="sample_rate", compact=True)
        yield Static(id="settings-status", classes="note", markup=False)
        yield Label("Audit log, newest first", classes="section")
        yield KeyedTable(id="audit")

    def on_mount(self) -> None:
        table = self.query_one("#commitments", KeyedTable)
        table.add_column("Model", width=14)
        table.add_column("Commitment", width=12)
        table.add_column("Threshold", width=9)
        table.add_column("Δmax", width=6)
        table.add_column("Sample", width=6)
        table.add_column("", width=1)
        audit = self.query_one("#audit", KeyedTable)
        audit.add_column("When (UTC)", width=14)
        audit.add_column("Who", width=22)
        audit.add_column("Change", width=32)

    async def load(self) -> None:
        commitments, events = await asyncio.gather(
            self.client.commitments(), self.client.audit(_AUDIT_SHOWN)
        )
        self._commitments = {c.commitment_id: c for c in commitments}
        names = {c.commitment_id: ", ".join(c.served_model_names) for c in commitments}
        self.query_one("#commitments", KeyedTable).show_rows(
            [
                (
                    c.commitment_id,
                    (
                        names[c.commitment_id],
                        formats.short_id(c.commitment_id),
                        f"{c.settings.threshold:g}",
                        f"{c.settings.delta_max:g}",
                        f"{c.settings.sample_rate:g}",
                        Text("*", style="bold yellow")
                        if c.settings != c.committed_settings
                        else "",
                    ),
                )
                for c in commitments
            ]
        )
        self.query_one("#audit", KeyedTable).show_rows(
            [(f"{e.at_ns}\x00{n}", _audit_row(e, names)) for n, e in enumerate(events)]
        )
        self._fill_form()

    def _fill_form(self) -> None:
        """Show the highlighted commitment's settings, unless the operator has typed
        changes to them that are not applied yet."""
        key = self.query_one("#commitments", KeyedTable).current_key()
        commitment = self._commitments.get(key or "")
        if commitment is None or (key == self._editing and self._typed()):
            return
        self._editing = commitment.commitment_id
        self._filled = {f: f"{getattr(commitment.settings, f):g}" for f in _FIELDS}
        for field, text in self._filled.items():
            self.query_one(f"#{field}", Input).value = text

    def _typed(self) -> bool:
        return any(self.query_one(f"#{f}", Input).value != self._filled.get(f) for f in _FIELDS)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "commitments":
            self._fill_form()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.action_apply()

    def action_edit(self) -> None:
        self.query_one("#threshold", Input).focus()

    def action_focus_table(self) -> None:
        self.query_one("#commitments", KeyedTable).focus()

    def _status(self, text: str, style: str = "") -> None:
        self.query_one("#settings-status", Static).update(formats.shown(text, style))

    def action_apply(self) -> None:
        commitment = self._commitments.get(self._editing)
        if commitment is None:
            self._status("choose a commitment first", "yellow")
            return
        try:
            wanted = parse_settings(
                *(self.query_one(f"#{field}", Input).value for field in _FIELDS)
            )
        except SettingsInputError as exc:
            self._status(str(exc), "bold red")
            return
        names = ", ".join(commitment.served_model_names)
        question = (
            f"Change the DiFR settings of {names} ({formats.short_id(commitment.commitment_id)})?"
        )
        lines = change_lines(commitment.settings, wanted)
        self.app.push_screen(
            ConfirmScreen(question, lines),
            lambda yes: self._confirmed(commitment.commitment_id, wanted) if yes else None,
        )

    def _confirmed(self, commitment_id: str, wanted: verifier_pb2.DifrSettings) -> None:
        self._status("sending…")
        self._send(commitment_id, wanted)

    @work(exclusive=True, group="apply")
    async def _send(self, commitment_id: str, wanted: verifier_pb2.DifrSettings) -> None:
        try:
            await self.client.set_difr_settings(commitment_id, wanted)
        except CallRefusedError as exc:
            self._status(f"refused: {exc.code}: {exc.details}", "bold red")
            return
        except DaemonUnavailableError as exc:
            self._status(f"not sent: {exc}", "bold red")
            return
        self._status(f"applied: {formats.settings_line(wanted)}", "green")
        self._filled = {f: f"{getattr(wanted, f):g}" for f in _FIELDS}
        self.action_focus_table()
        self.action_reload()


def _audit_row(event: verifier_pb2.AuditEvent, names: dict[str, str]) -> tuple[str, str, str]:
    change = event.action
    try:
        detail = json.loads(event.detail_json)
    except json.JSONDecodeError:
        detail = None
    if isinstance(detail, dict) and isinstance(detail.get("current"), dict):
        current = detail["current"]
        model = names.get(str(detail.get("commitment_id", "")), "?")
        change = (
            f"{model}: {current.get('threshold', 0):g}/{current.get('delta_max', 0):g}/"
            f"{current.get('sample_rate', 0):g}"
        )
    return (formats.utc_time(event.at_ns), event.actor, change)

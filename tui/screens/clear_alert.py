"""Clear an intake alert: the evidence in short, and the reason the audit log will keep.

Nothing is sent until the operator types a reason and presses Enter. verifierd then asks
the collector and resumes intake only if its log agrees again with what was stored;
otherwise it answers what still disagrees, which the Overview shows.
"""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static
from veritap.v1 import verifier_pb2

from tui import formats


def _short(digest: bytes) -> str:
    return digest.hex()[:16] + "…" if digest else "-"


def evidence_lines(alert: verifier_pb2.IntakeAlert) -> list[str]:
    """What stopped intake and the evidence kept, in a few lines."""
    evidence = alert.evidence
    lines = [
        f"detected {formats.utc_time(alert.detected_at_ns)} UTC",
        f"stored up to seq {evidence.cursor_seq} ({_short(evidence.cursor_hash)})",
    ]
    if evidence.remote_hash:
        lines.append(f"the collector's entry there: {_short(evidence.remote_hash)}")
    if evidence.checkpoints:
        sizes = ", ".join(str(c.tree_size) for c in evidence.checkpoints)
        lines.append(f"signed checkpoints kept: size {sizes}")
    if evidence.entries:
        lines.append(f"entries kept: {len(evidence.entries)}")
    if evidence.detail:
        lines.append(evidence.detail)
    return lines


class ClearAlertScreen(ModalScreen[str | None]):
    """Answers the reason typed, or None when cancelled."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", show=False),
    ]

    def __init__(self, alert: verifier_pb2.IntakeAlert) -> None:
        super().__init__()
        self._alert = alert

    def compose(self) -> ComposeResult:
        alert = self._alert
        with Vertical(id="clear-alert"):
            yield Static(
                formats.shown(f"Resume intake from {alert.origin} ({alert.reason})?"),
                id="clear-alert-title",
                markup=False,
            )
            yield Static(
                formats.shown("\n".join(evidence_lines(alert))),
                id="clear-alert-evidence",
                markup=False,
            )
            yield Input(placeholder="why (kept in the audit log)", id="clear-alert-reason")
            yield Static(
                "verifierd resumes only if the collector's log agrees with what it stored.\n"
                "[b]Enter[/] clear    [b]Esc[/] cancel",
                id="clear-alert-keys",
            )

    def on_input_submitted(self, event: Input.Submitted) -> None:
        reason = event.value.strip()
        if not reason:
            self.query_one("#clear-alert-keys", Static).update(
                "[b red]a reason is required[/]    [b]Esc[/] cancel"
            )
            return
        self.dismiss(reason)

    def action_cancel(self) -> None:
        self.dismiss(None)

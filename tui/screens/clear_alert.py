"""Clear an alert or an alarm: the evidence in short, and the reason the audit log will keep.

Nothing is sent until the operator types a reason and presses Enter. For an intake
alert verifierd then asks the collector and resumes intake only if its log agrees again
with what was stored; otherwise it answers what still disagrees, which the Overview shows.
A prover alarm is kept, marked cleared (Provers screen).
"""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
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


class ClearWithReasonScreen(ModalScreen[str | None]):
    """Asks why; answers the reason typed, or None when cancelled."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", show=False),
    ]

    def __init__(self, question: str, evidence: list[str], consequence: str) -> None:
        super().__init__()
        self._question = question
        self._evidence = evidence
        self._consequence = consequence

    def compose(self) -> ComposeResult:
        with Vertical(id="clear-alert"):
            yield Static(formats.shown(self._question), id="clear-alert-title", markup=False)
            yield Static(
                formats.shown("\n".join(self._evidence)), id="clear-alert-evidence", markup=False
            )
            yield Input(placeholder="why (kept in the audit log)", id="clear-alert-reason")
            yield Static(
                Text.assemble(
                    formats.shown(self._consequence),
                    "\n",
                    ("Enter", "bold"),
                    " clear    ",
                    ("Esc", "bold"),
                    " cancel",
                ),
                id="clear-alert-keys",
                markup=False,
            )

    def on_input_submitted(self, event: Input.Submitted) -> None:
        reason = event.value.strip()
        if not reason:
            self.query_one("#clear-alert-keys", Static).update(
                Text.assemble(
                    ("a reason is required", "bold red"), "    ", ("Esc", "bold"), " cancel"
                )
            )
            return
        self.dismiss(reason)

    def action_cancel(self) -> None:
        self.dismiss(None)


class ClearAlertScreen(ClearWithReasonScreen):
    """Clearing an intake alert: resume intake from its collector."""

    def __init__(self, alert: verifier_pb2.IntakeAlert) -> None:
        super().__init__(
            f"Resume intake from {alert.origin} ({alert.reason})?",
            evidence_lines(alert),
            "verifierd resumes only if the collector's log agrees with what it stored.",
        )

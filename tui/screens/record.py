"""Record detail: the prompt, the response with each token coloured by its DiFR margin,
a sparkline of the margins, and the verdict's evidence."""

from __future__ import annotations

from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.widgets import Label, Sparkline, Static
from veritap.v1 import verifier_pb2

from tui import formats, heatmap
from tui.client import RecordDetail
from tui.screens.console_screen import ConsoleScreen
from tui.widgets.verdict_table import status_text


class RecordScreen(ConsoleScreen):
    POLL = False
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "Back"),
    ]

    def __init__(self, record_id: str, origin: str, nav: str) -> None:
        super().__init__()
        self.record_id = record_id
        self.origin = origin
        self._nav = nav

    def nav(self) -> str:
        return self._nav

    def compose_body(self) -> ComposeResult:
        with VerticalScroll(id="record-body"):
            yield Static(
                formats.shown(f"Record {self.record_id} from {self.origin}"),
                id="headline",
                markup=False,
            )
            yield Label("Prompt", classes="section")
            yield Static(id="prompt", classes="prose", markup=False)
            yield Label("Response, each token coloured by its DiFR margin", classes="section")
            yield Static(id="response", classes="prose", markup=False)
            yield Static(heatmap.legend(), id="legend", classes="note")
            yield Label("Margins by token", classes="section")
            yield Sparkline([], id="margins")
            yield Label("Evidence", classes="section")
            yield Static(id="evidence", markup=False)

    async def load(self) -> None:
        detail = await self.client.record(self.record_id, self.origin)
        self._show(detail)

    def _show(self, detail: RecordDetail) -> None:
        verdict = detail.verdict
        headline = Text.assemble(
            formats.shown(detail.record.record_id, "bold"),
            formats.shown(f"  {verdict.origin} #{verdict.seq}  "),
            status_text(verdict.status),
            "  ",
            formats.shown(_judgement(verdict)),
        )
        self.query_one("#headline", Static).update(headline)
        self.query_one("#prompt", Static).update(formats.shown(formats.prompt_text(detail.record)))
        self.query_one("#response", Static).update(_response(detail))
        self.query_one("#margins", Sparkline).data = list(detail.margins) or [0.0]
        self.query_one("#evidence", Static).update(_evidence(detail))

    def action_back(self) -> None:
        self.app.pop_screen()


def _judgement(verdict: verifier_pb2.Verdict) -> str:
    if verdict.status in (verifier_pb2.VERDICT_STATUS_PASS, verifier_pb2.VERDICT_STATUS_FAIL):
        relation = ">" if verdict.score > verdict.settings.threshold else "≤"
        return f"{verdict.score:.3f} {relation} {verdict.settings.threshold:g}"
    if verdict.status == verifier_pb2.VERDICT_STATUS_PENDING:
        return "waiting for its engine"
    return formats.reason_line(verdict)


def _response(detail: RecordDetail) -> Text:
    if detail.token_texts:
        text = heatmap.heat_text(
            detail.token_texts, detail.margins, detail.verdict.settings.delta_max
        )
    else:
        choice = next(
            (c for c in detail.record.api.choices if c.index == detail.verdict.choice_index),
            None,
        )
        text = formats.shown(choice.text if choice is not None else "")
    if detail.tokens_note:
        text.append_text(formats.shown(f"\n({detail.tokens_note})", "dim italic"))
    return text


def _evidence(detail: RecordDetail) -> Table:
    verdict = detail.verdict
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    rows: list[tuple[str, str]] = [
        ("record", f"{verdict.record_id} ({verdict.origin} seq {verdict.seq})"),
        ("entry hash", verdict.entry_hash.hex() or "—"),
        ("checkpoint", formats.checkpoint_line(verdict)),
        ("logprobs", formats.logprobs_line(verdict)),
        ("commitment", verdict.commitment_id or "—"),
        ("model", verdict.model or detail.record.api.model),
        (
            "settings",
            formats.settings_line(verdict.settings) if verdict.settings.delta_max else "—",
        ),
        (
            "tokens",
            f"{verdict.token_count} scored, {verdict.exact_matches} exact, "
            f"{verdict.out_of_mask} outside the mask"
            + (", re-tokenized" if verdict.retokenized else ""),
        ),
        (
            "sampler",
            f"{verdict.sampler_profile or '—'}  engine {verdict.engine} {verdict.engine_version}",
        ),
        (
            "timings",
            f"prefill {verdict.timings.prefill_ns / 1e6:.0f} ms, scoring "
            f"{verdict.timings.scoring_ns / 1e6:.0f} ms, batch of {verdict.timings.batch_size}",
        ),
        ("decided", formats.utc_time(verdict.decided_at_ns) + " UTC"),
        ("signed by", detail.key_id.hex() if detail.key_id else "— (not decided yet)"),
    ]
    if verdict.reason or verdict.detail:
        rows.insert(1, ("reason", formats.reason_line(verdict)))
    if verdict.amended_by_record_id:
        rows.append(("amended by", verdict.amended_by_record_id))
    if verdict.HasField("supersedes"):
        rows.append(("supersedes", formats.superseded_line(verdict)))
    for name, value in rows:
        table.add_row(name, formats.shown(value))
    return table

"""Models: the commitments this verifier holds and the state of their engines."""

from __future__ import annotations

import asyncio

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Label
from veritap.v1 import verifier_pb2

from tui import formats
from tui.screens.console_screen import ConsoleScreen
from tui.widgets.keyed_table import KeyedTable

ENGINE_STYLES = {
    verifier_pb2.ENGINE_STATE_READY: "green",
    verifier_pb2.ENGINE_STATE_BUSY: "bold green",
    verifier_pb2.ENGINE_STATE_LOADING: "cyan",
    verifier_pb2.ENGINE_STATE_FAILED: "bold red",
    verifier_pb2.ENGINE_STATE_UNLOADED: "dim",
}


class ModelsScreen(ConsoleScreen):
    NAV = "models"

    def compose_body(self) -> ComposeResult:
        yield Label("Commitments", classes="section")
        yield KeyedTable(id="commitments")
        yield Label("Engines", classes="section")
        yield KeyedTable(id="engines")

    def on_mount(self) -> None:
        commitments = self.query_one("#commitments", KeyedTable)
        commitments.add_column("Model", width=14)
        commitments.add_column("Commitment", width=12)
        commitments.add_column("dtype", width=8)
        commitments.add_column("Sampler", width=17)
        commitments.add_column("Thr/Δmax/rate", width=15)
        engines = self.query_one("#engines", KeyedTable)
        engines.add_column("Model", width=14)
        engines.add_column("State", width=9)
        engines.add_column("Memory", width=9)
        engines.add_column("GPUs", width=5)
        engines.add_column("Queue", width=6)
        engines.add_column("Detail", width=20)

    async def load(self) -> None:
        commitments, engines = await asyncio.gather(
            self.client.commitments(), self.client.engines()
        )
        names = {c.commitment_id: ", ".join(c.served_model_names) for c in commitments}
        self.query_one("#commitments", KeyedTable).show_rows(
            [
                (
                    c.commitment_id,
                    (
                        names[c.commitment_id],
                        formats.short_id(c.commitment_id),
                        c.dtype,
                        c.sampler_profile,
                        _settings(c),
                    ),
                )
                for c in commitments
            ]
        )
        self.query_one("#engines", KeyedTable).show_rows(
            [
                (
                    e.commitment_id,
                    (
                        names.get(e.commitment_id, formats.short_id(e.commitment_id)),
                        Text(
                            formats.engine_state_name(e.state),
                            style=ENGINE_STYLES.get(e.state, ""),
                        ),
                        formats.size(e.memory_bytes) if e.memory_bytes else "—",
                        ",".join(str(g) for g in e.gpu_indices) or "cpu",
                        formats.count(e.queue_depth),
                        e.detail,
                    ),
                )
                for e in engines
            ]
        )


def _settings(commitment: verifier_pb2.Commitment) -> Text:
    s = commitment.settings
    text = Text(f"{s.threshold:g}/{s.delta_max:g}/{s.sample_rate:g}")
    if commitment.settings != commitment.committed_settings:
        text.append(" *", style="bold yellow")
    return text

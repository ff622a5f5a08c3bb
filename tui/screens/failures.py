"""Failures: the verdicts whose DiFR score exceeded their threshold, newest first, live."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.widgets import Static
from veritap.v1 import verifier_pb2

from tui.screens.verdict_list import LISTED, VerdictListScreen
from tui.verdict_filter import VerdictFilterSpec
from tui.widgets.verdict_table import VerdictTable

FAILURES = VerdictFilterSpec(statuses=frozenset({verifier_pb2.VERDICT_STATUS_FAIL}))


class FailuresScreen(VerdictListScreen):
    NAV = "failures"

    def compose_body(self) -> ComposeResult:
        yield Static(id="count", classes="note", markup=False)
        yield VerdictTable(FAILURES, limit=LISTED)

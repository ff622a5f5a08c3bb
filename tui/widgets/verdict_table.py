"""A table of verdicts, newest first, that takes live verdicts as they arrive."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from rich.text import Text
from veritap.v1 import verifier_pb2

from tui import formats
from tui.verdict_filter import VerdictFilterSpec
from tui.widgets.keyed_table import OpenableTable, Row

STATUS_STYLES = {
    verifier_pb2.VERDICT_STATUS_PASS: "green",
    verifier_pb2.VERDICT_STATUS_FAIL: "bold red",
    verifier_pb2.VERDICT_STATUS_UNVERIFIABLE: "yellow",
    verifier_pb2.VERDICT_STATUS_SKIPPED: "dim",
    verifier_pb2.VERDICT_STATUS_ERROR: "magenta",
    verifier_pb2.VERDICT_STATUS_PENDING: "cyan",
}


def status_text(status: verifier_pb2.VerdictStatus.ValueType) -> Text:
    return Text(formats.status_name(status), style=STATUS_STYLES.get(status, ""))


def verdict_key(verdict: verifier_pb2.Verdict) -> str:
    return f"{verdict.origin}\x00{verdict.seq}"


#: Live verdicts are shown in batches at most this often (a busy verifier decides hundreds
#: a second; redrawing the table for each would starve the keyboard).
LIVE_BATCH_S = 0.25

#: Live verdicts kept aside while a listing is in flight (the newest; one per record). Only
#: more than this many records decided during one ListVerdicts call could let a listing
#: bring back a verdict that one of the older ones superseded.
ARRIVED_DURING_LISTING = 5_000


class VerdictTable(OpenableTable):
    """Keeps at most ``limit`` verdicts (the newest) of those its spec accepts."""

    def __init__(self, spec: VerdictFilterSpec, *, limit: int = 500, id: str | None = None):
        super().__init__(id=id)
        self.spec = spec
        self.limit = limit
        self._verdicts: dict[str, verifier_pb2.Verdict] = {}
        self._refill_due = False
        self._arrived: OrderedDict[str, verifier_pb2.Verdict] | None = None

    def on_mount(self) -> None:
        self.add_column("Decided (UTC)", width=14)
        self.add_column("Status", width=12)
        self.add_column("Score / why", width=12)
        self.add_column("Model", width=10)
        self.add_column("Record", width=18)

    def listing(self) -> None:
        """A listing for `replace` is being fetched: live verdicts that arrive meanwhile are
        kept aside too, so that a listing taken before them does not bring back a verdict
        they superseded (a withdrawn FAIL would return to the Failures screen)."""
        self._arrived = OrderedDict()

    def replace(self, verdicts: Iterable[verifier_pb2.Verdict]) -> None:
        """Show ``verdicts`` (a listing), except where a live verdict that arrived since
        `listing` is the record's newer one."""
        current = {verdict_key(v): v for v in verdicts}
        for key, live in (self._arrived or {}).items():
            listed = current.get(key)
            if listed is None or live.decided_at_ns >= listed.decided_at_ns:
                current[key] = live
        self._arrived = None
        self._verdicts = {key: v for key, v in current.items() if self.spec.accept(v)}
        self._refill()

    def add_live(self, verdict: verifier_pb2.Verdict) -> bool:
        """Add a verdict from the live stream; returns whether the table changed. A record has
        one row: a verdict superseding the one shown for its record (``supersedes``, the
        collector amended it) replaces that row, or removes it when the filter does not
        keep the new verdict (a FAIL withdrawn leaves the Failures screen)."""
        key = verdict_key(verdict)
        if self._arrived is not None:
            self._arrived.pop(key, None)
            self._arrived[key] = verdict
            if len(self._arrived) > ARRIVED_DURING_LISTING:
                self._arrived.popitem(last=False)
        if self.spec.accept(verdict):
            self._verdicts[key] = verdict
        elif self._verdicts.pop(key, None) is None:
            return False
        if not self._refill_due:
            self._refill_due = True
            self.set_timer(LIVE_BATCH_S, self._refill)
        return True

    def verdict_at_cursor(self) -> verifier_pb2.Verdict | None:
        key = self.current_key()
        return None if key is None else self._verdicts.get(key)

    @property
    def shown(self) -> int:
        return min(len(self._verdicts), self.limit)

    def _refill(self) -> None:
        self._refill_due = False
        newest = sorted(
            self._verdicts.items(),
            key=lambda kv: (kv[1].decided_at_ns, kv[1].origin, kv[1].seq),
            reverse=True,
        )[: self.limit]
        self._verdicts = dict(newest)
        self.show_rows([_row(key, v) for key, v in newest])


def _row(key: str, verdict: verifier_pb2.Verdict) -> Row:
    score = formats.score(verdict)
    over = (
        verdict.status == verifier_pb2.VERDICT_STATUS_FAIL
        or verdict.score > verdict.settings.threshold > 0
    )
    return (
        key,
        (
            formats.utc_time(verdict.decided_at_ns),
            status_text(verdict.status),
            formats.shown(score, style="bold red" if over else ""),
            verdict.model,
            verdict.record_id,
        ),
    )

"""The verdict table's live verdicts: one row per record, a superseded verdict replaced."""

from __future__ import annotations

from textual.app import App, ComposeResult
from veritap.v1 import verifier_pb2

from tests.tui.pilot_waits import until
from tui.verdict_filter import VerdictFilterSpec
from tui.widgets.verdict_table import VerdictTable

PASS = verifier_pb2.VERDICT_STATUS_PASS
FAIL = verifier_pb2.VERDICT_STATUS_FAIL
UNVERIFIABLE = verifier_pb2.VERDICT_STATUS_UNVERIFIABLE


class TableApp(App[None]):
    def __init__(self, spec: VerdictFilterSpec) -> None:
        super().__init__()
        self.spec = spec

    def compose(self) -> ComposeResult:
        yield VerdictTable(self.spec)


def verdict(seq: int, status: int, at_s: int) -> verifier_pb2.Verdict:
    return verifier_pb2.Verdict(
        origin="edge-1",
        seq=seq,
        record_id=f"r{seq}",
        status=status,  # type: ignore[arg-type]
        decided_at_ns=at_s * 1_000_000_000,
    )


def withdrawing(superseded: verifier_pb2.Verdict, at_s: int) -> verifier_pb2.Verdict:
    """The record_amended verdict that supersedes ``superseded``."""
    new = verdict(superseded.seq, UNVERIFIABLE, at_s)
    new.reason = "record_amended"
    new.supersedes.status = superseded.status
    new.supersedes.decided_at_ns = superseded.decided_at_ns
    return new


def rows(table: VerdictTable) -> list[tuple[str, str]]:
    """(record id, status) of each row, top first."""
    return [
        (str(table.get_row_at(i)[-1]), str(table.get_row_at(i)[1])) for i in range(table.row_count)
    ]


async def test_a_withdrawn_verdict_leaves_a_list_that_does_not_keep_the_new_one() -> None:
    app = TableApp(VerdictFilterSpec(statuses=frozenset({FAIL})))
    async with app.run_test() as pilot:
        table = app.query_one(VerdictTable)
        failed, other = verdict(1, FAIL, 10), verdict(2, FAIL, 11)
        table.replace([failed, other])
        await until(pilot, lambda: table.row_count == 2, "the listed failures")
        assert table.add_live(withdrawing(failed, 20))
        await until(pilot, lambda: table.row_count == 1, "the withdrawn FAIL to go")
        assert rows(table) == [("r2", "FAIL")]
        assert table.shown == 1
        # A verdict the filter does not keep, about a record not shown, changes nothing.
        assert not table.add_live(withdrawing(verdict(3, PASS, 12), 21))
        assert not table.add_live(verdict(4, PASS, 22))


async def test_a_superseding_verdict_replaces_its_records_row() -> None:
    app = TableApp(VerdictFilterSpec())
    async with app.run_test() as pilot:
        table = app.query_one(VerdictTable)
        failed, passed = verdict(1, FAIL, 10), verdict(2, PASS, 11)
        table.replace([failed, passed])
        await until(pilot, lambda: table.row_count == 2, "the listed verdicts")
        assert table.add_live(withdrawing(failed, 20))
        await until(pilot, lambda: rows(table)[0] == ("r1", "UNVERIFIABLE"), "the new verdict")
        assert rows(table) == [("r1", "UNVERIFIABLE"), ("r2", "PASS")]


async def test_a_listing_taken_before_a_live_verdict_does_not_undo_it() -> None:
    app = TableApp(VerdictFilterSpec(statuses=frozenset({FAIL})))
    async with app.run_test() as pilot:
        table = app.query_one(VerdictTable)
        failed, other, new = verdict(1, FAIL, 10), verdict(2, FAIL, 11), verdict(3, FAIL, 30)
        table.listing()
        # While the listing is in flight, r1's FAIL is withdrawn and r3 fails.
        table.add_live(withdrawing(failed, 20))
        table.add_live(new)
        table.replace([failed, other])
        await until(pilot, lambda: table.row_count == 2, "the listing merged with live verdicts")
        assert rows(table) == [("r3", "FAIL"), ("r2", "FAIL")]
        # The next listing is the server's alone.
        table.replace([failed, other])
        await until(pilot, lambda: rows(table)[-1] == ("r1", "FAIL"), "the plain listing")


async def test_a_listing_newer_than_a_live_verdict_wins() -> None:
    app = TableApp(VerdictFilterSpec())
    async with app.run_test() as pilot:
        table = app.query_one(VerdictTable)
        failed = verdict(1, FAIL, 10)
        table.listing()
        table.add_live(failed)
        table.replace([withdrawing(failed, 20)])
        await until(pilot, lambda: table.row_count == 1, "the listed verdict")
        assert rows(table) == [("r1", "UNVERIFIABLE")]

"""verifierd's LMDB store: exactly-once intake, the queue, verdicts, settings, alerts."""

from __future__ import annotations

import hashlib
import itertools
import json
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import lmdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from veritap.v1 import log_pb2, verifier_pb2

from verifierd.store import (
    Enqueue,
    NoAlertError,
    Retry,
    SequenceGapError,
    Store,
    StoreError,
    Tampered,
    VerdictWrite,
    ekey,
)

CID = "ab" * 32
CID2 = "cd" * 32


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.open(tmp_path / "store")
    yield s
    s.close()


def entries(first: int, last: int, origin: str = "edge") -> list[tuple[int, bytes, bytes]]:
    out = []
    for seq in range(first, last + 1):
        envelope = f"{origin}/{seq}".encode()
        out.append((seq, envelope, hashlib.sha256(b"\x00" + envelope).digest()))
    return out


def covering(size: int, origin: str = "edge") -> log_pb2.Checkpoint:
    """A checkpoint as the intake stores it once verified (the store does not check it)."""
    return log_pb2.Checkpoint(origin=origin, tree_size=size, root_hash=b"r" * 32)


def verdict(origin: str, seq: int, status: int, decided_at_ns: int = 1) -> VerdictWrite:
    v = verifier_pb2.Verdict(
        record_id=f"R{seq}", origin=origin, seq=seq, status=status, decided_at_ns=decided_at_ns
    )
    signed = verifier_pb2.SignedVerdict(verdict=v.SerializeToString(), signature=b"s" * 64)
    return VerdictWrite(origin, seq, f"R{seq}", signed, v)


def test_new_origin_cursor(store: Store) -> None:
    cursor = store.cursor("edge")
    assert (cursor.seq, cursor.hash, cursor.checkpoint) == (0, bytes(32), None)


def test_ingest_advances_cursor_and_queues(store: Store) -> None:
    batch = entries(1, 5)
    checkpoint = log_pb2.Checkpoint(origin="edge", tree_size=5, root_hash=b"r" * 32)
    store.ingest("edge", batch, checkpoint=checkpoint)
    cursor = store.cursor("edge")
    assert (cursor.seq, cursor.hash) == (5, batch[-1][2])
    assert cursor.checkpoint == checkpoint
    store.ingest("edge", entries(6, 7))
    assert store.cursor("edge").checkpoint == checkpoint
    # Only what the stored checkpoint covers may be judged; the rest waits for one.
    assert [(e.origin, e.seq) for e in store.inbox(10)] == [("edge", s) for s in range(1, 6)]
    assert (store.counts().inbox, store.counts().awaiting_checkpoint) == (7, 2)
    store.ingest("edge", [], checkpoint=covering(7))
    assert [e.seq for e in store.inbox(10)] == list(range(1, 8))
    assert store.counts().awaiting_checkpoint == 0
    stored = store.entry("edge", 3)
    assert stored is not None and stored.envelope == b"edge/3"
    assert store.counts().entries == 7
    assert store.origins() == ["edge"]


def test_ingest_refuses_gaps_and_repeats_atomically(store: Store) -> None:
    store.ingest("edge", entries(1, 3))
    with pytest.raises(SequenceGapError):
        store.ingest("edge", entries(5, 6))
    with pytest.raises(SequenceGapError):
        store.ingest("edge", entries(3, 4))
    with pytest.raises(SequenceGapError):
        store.ingest("edge", [*entries(4, 5), *entries(7, 7)])
    assert store.cursor("edge").seq == 3
    assert store.entry("edge", 4) is None
    with pytest.raises(StoreError, match="past seq"):
        store.ingest("edge", [], checkpoint=log_pb2.Checkpoint(tree_size=9))


def test_hash_only_entries_advance_but_are_not_queued(store: Store) -> None:
    store.ingest("edge", [(1, b"", b"h" * 32), *entries(2, 2)], checkpoint=covering(2))
    assert store.cursor("edge").seq == 2
    assert [e.seq for e in store.inbox(10)] == [2]


def test_origins_are_independent(store: Store) -> None:
    store.ingest("a", entries(1, 2, "a"))
    store.ingest("b", entries(1, 1, "b"))
    assert store.cursor("a").seq == 2 and store.cursor("b").seq == 1


def test_classify_then_finish_gives_one_verdict(store: Store) -> None:
    store.ingest("edge", entries(1, 3))
    pass_ = verifier_pb2.VERDICT_STATUS_PASS
    skipped = verifier_pb2.VERDICT_STATUS_SKIPPED
    store.classify(
        [
            Enqueue("edge", 1, "R1", CID),
            verdict("edge", 2, skipped),
            Enqueue("edge", 3, "R3", CID2),
        ]
    )
    assert store.inbox(10) == []
    assert store.counts().pending == 2
    assert [(b.commitment_id, b.pending) for b in store.backlog()] == [(CID, 1), (CID2, 1)]
    [item] = store.take_pending(CID, 10, now_ns=0)
    assert (item.origin, item.seq, item.attempts) == ("edge", 1, 0)
    seen: list[int] = []
    store.add_verdict_listener(lambda vs: seen.extend(v.seq for v in vs))
    assert store.finish([(item.key, verdict("edge", 1, pass_))]) == 1
    assert store.finish([(item.key, verdict("edge", 1, verifier_pb2.VERDICT_STATUS_FAIL))]) == 0
    assert seen == [1]
    stored = store.verdict("edge", 1)
    assert stored is not None and stored.verdict.status == pass_
    assert store.take_pending(CID, 10, now_ns=0) == []
    assert store.verdict_counts() == {"VERDICT_STATUS_PASS": 1, "VERDICT_STATUS_SKIPPED": 1}
    assert [v.seq for v in store.verdicts_for_record("R2")] == [2]
    assert store.record_location("R3") == ("edge", 3)
    assert store.record_location("R9") is None
    store.classify([Enqueue("edge", 2, "R2", CID)])
    assert store.counts().pending == 1


def test_retries_back_off_and_count_attempts(store: Store) -> None:
    store.ingest("edge", entries(1, 2))
    store.classify([Enqueue("edge", 1, "R1", CID), Enqueue("edge", 2, "R2", CID)])
    first, second = store.take_pending(CID, 10, now_ns=0)
    store.finish([], [Retry(first.key, not_before_ns=1000, error="engine crashed")])
    assert [i.seq for i in store.take_pending(CID, 10, now_ns=999)] == [2]
    [again, _] = store.take_pending(CID, 10, now_ns=1000)
    assert (again.attempts, again.last_error, again.not_before_ns) == (1, "engine crashed", 1000)
    assert store.take_pending(CID, 1, now_ns=999) == [second]


def test_list_verdicts_pages_in_time_order(store: Store) -> None:
    store.ingest("edge", entries(1, 7))
    store.classify(
        [
            verdict("edge", s, verifier_pb2.VERDICT_STATUS_SKIPPED, decided_at_ns=100 + s)
            for s in range(1, 8)
        ]
    )
    pages, token = [], b""
    while True:
        page, token = store.list_verdicts(limit=3, after=token, accept=lambda v: v.seq != 4)
        pages.append([v.seq for v in page])
        if not token:
            break
    assert pages == [[1, 2, 3], [5, 6, 7]]
    window, _ = store.list_verdicts(from_ns=103, to_ns=105)
    assert [v.seq for v in window] == [3, 4, 5]


def test_difr_override_is_audited(store: Store) -> None:
    first = verifier_pb2.DifrSettings(threshold=0.1, delta_max=5, sample_rate=1)
    second = verifier_pb2.DifrSettings(threshold=0.2, delta_max=5, sample_rate=0.5)
    assert store.set_difr_override(CID, first, actor="admin@tui") is None
    assert store.set_difr_override(CID, second, actor="admin@tui") == first
    assert store.difr_override(CID) == second
    events = store.audit_log()
    assert [e.actor for e in events] == ["admin@tui", "admin@tui"]
    assert '"sample_rate": 0.5' in events[1].detail
    assert "logprobs_tolerance" not in events[1].detail  # neither names one
    third = verifier_pb2.DifrSettings(threshold=0.2, delta_max=5, logprobs_tolerance=1e-3)
    store.set_difr_override(CID, third, actor="admin@tui")
    assert json.loads(store.audit_log()[2].detail)["current"]["logprobs_tolerance"] == 1e-3


def test_alerts(store: Store) -> None:
    store.set_alert("edge", "fork", b"note-a\x00note-b")
    [alert] = store.alerts()
    assert (alert.origin, alert.reason, alert.evidence) == ("edge", "fork", b"note-a\x00note-b")


def test_a_cleared_alert_is_kept_with_its_evidence_and_audited(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "store")
    store.set_alert("edge", "fork", b"note-a\x00note-b")
    store.set_alert("edge-2", "gap", b"gap evidence")
    with pytest.raises(NoAlertError):
        store.clear_alert("edge-3", actor="CN=ops", why="?", check="")
    cleared = store.clear_alert(
        "edge", actor="CN=ops-admin,O=veritap", why="restored from backup", check="agrees"
    )
    assert (cleared.alert.origin, cleared.alert.reason) == ("edge", "fork")
    assert cleared.alert.evidence == b"note-a\x00note-b"
    assert [a.origin for a in store.alerts()] == ["edge-2"]
    with pytest.raises(NoAlertError):  # once only
        store.clear_alert("edge", actor="CN=ops", why="again", check="")
    store.set_alert("edge", "bad_signature", b"second")
    second = store.clear_alert("edge", actor="CN=ops", why="transient", check="agrees")
    store.close()
    store = Store.open(tmp_path / "store")
    kept = store.cleared_alerts()
    assert kept == [cleared, second]
    [event, event2] = [e for e in store.audit_log() if e.action == "clear_intake_alert"]
    assert event.actor == "CN=ops-admin,O=veritap"
    assert json.loads(event.detail) == {
        "origin": "edge",
        "alert_reason": "fork",
        "alert_at_ns": cleared.alert.at_ns,
        "why": "restored from backup",
        "check": "agrees",
    }
    assert json.loads(event2.detail)["alert_reason"] == "bad_signature"
    store.close()


def test_reopen_keeps_everything(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "s")
    store.ingest("edge", entries(1, 4), checkpoint=covering(4))
    store.classify([Enqueue("edge", 1, "R1", CID)])
    store.set_difr_override(CID, verifier_pb2.DifrSettings(threshold=1), actor="a")
    store.close()
    store = Store.open(tmp_path / "s")
    assert store.cursor("edge").seq == 4
    assert len(store.inbox(10)) == 3
    assert len(store.take_pending(CID, 10, now_ns=0)) == 1
    store.set_difr_override(CID, verifier_pb2.DifrSettings(threshold=2), actor="b")
    assert len(store.audit_log()) == 2
    store.close()


def test_map_grows_when_full(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "s", map_size=256 * 1024)
    big = [(s, bytes([s % 256]) * 20_000, bytes(32)) for s in range(1, 101)]
    for start in range(0, 100, 10):
        store.ingest("edge", big[start : start + 10])
    assert store.cursor("edge").seq == 100
    assert store.counts().inbox == 100
    store.close()


_GROW_IN_ANOTHER_PROCESS = """
import sys
from verifierd.store import Store
store = Store.open(__import__("pathlib").Path(sys.argv[1]))
big = [(s, bytes([s % 256]) * 20_000, bytes(32)) for s in range(1, 101)]
for start in range(0, 100, 10):
    store.ingest("other", big[start : start + 10])
store.close()
"""


def test_a_map_grown_by_another_process_is_adopted(tmp_path: Path) -> None:
    """`verifierd calibrate --apply` writes to the daemon's store from its own process."""
    store = Store.open(tmp_path / "s", map_size=256 * 1024)
    store.ingest("edge", entries(1, 3))
    grown = subprocess.run(
        [sys.executable, "-c", _GROW_IN_ANOTHER_PROCESS, str(tmp_path / "s")], check=False
    )
    assert grown.returncode == 0
    assert store.cursor("other").seq == 100  # a read first
    store.ingest("edge", entries(4, 6))  # then a write
    assert store.counts().entries == 106
    store.close()


@settings(max_examples=25, deadline=None)
@given(cuts=st.lists(st.integers(1, 29), max_size=8, unique=True))
def test_any_batching_gives_the_same_store(
    tmp_path_factory: pytest.TempPathFactory, cuts: list[int]
) -> None:
    all_entries = entries(1, 30)
    bounds = [0, *sorted(cuts), 30]
    store = Store.open(tmp_path_factory.mktemp("s"))
    for a, b in itertools.pairwise(bounds):
        store.ingest("edge", all_entries[a:b])
    store.ingest("edge", [], checkpoint=covering(30))
    assert store.cursor("edge").hash == all_entries[-1][2]
    assert [e.seq for e in store.inbox(100)] == list(range(1, 31))
    assert store.counts().entries == 30
    store.close()


def test_an_origin_waiting_for_a_checkpoint_or_under_an_alert_does_not_hold_up_others(
    store: Store,
) -> None:
    store.ingest("a", entries(1, 20, "a"))
    store.ingest("b", entries(1, 3, "b"), checkpoint=covering(3, "b"))
    store.ingest("c", entries(1, 2, "c"), checkpoint=covering(2, "c"))
    assert [(e.origin, e.seq) for e in store.inbox(4)] == [("b", 1), ("b", 2), ("b", 3), ("c", 1)]
    assert [e.origin for e in store.inbox(10, origins={"c"})] == ["c", "c"]
    store.set_alert("b", "fork", b"evidence")
    assert [(e.origin, e.seq) for e in store.inbox(10)] == [("c", 1), ("c", 2)]
    assert store.counts().awaiting_checkpoint == 23
    store.clear_alert("b", actor="op", why="checked", check="agrees")
    assert len(store.inbox(10)) == 5


def test_a_tampered_entry_leaves_the_inbox_with_an_alert_and_no_verdict(store: Store) -> None:
    store.ingest("edge", entries(1, 2), checkpoint=covering(2))
    store.classify([Tampered("edge", 1, "stored_envelope_altered", b"evidence")])
    assert [e.seq for e in store.inbox(10)] == []  # judging from "edge" stops
    assert store.verdict("edge", 1) is None and store.counts().verdicts == 0
    [alert] = store.alerts()
    assert (alert.origin, alert.reason, alert.evidence) == (
        "edge",
        "stored_envelope_altered",
        b"evidence",
    )
    assert store.counts().inbox == 1


def test_a_pending_item_keeps_its_checkpoint_and_can_be_set_aside(store: Store) -> None:
    store.ingest("edge", entries(1, 2), checkpoint=covering(2))
    store.classify(
        [
            Enqueue(
                "edge",
                1,
                "R1",
                CID,
                checkpoint_tree_size=2,
                checkpoint_root_hash=b"r" * 32,
                tag=b"t" * 32,
            ),
            Enqueue("edge", 2, "R2", CID, checkpoint_tree_size=2, checkpoint_root_hash=b"r" * 32),
        ]
    )
    first, second = store.take_pending(CID, 10, now_ns=0)
    store.finish([], [Retry(first.key, not_before_ns=0, error="engine crashed")])
    again = store.pending_item(first.key)
    assert again is not None and again.attempts == 1
    assert (again.checkpoint_tree_size, again.checkpoint_root_hash, again.tag) == (
        2,
        b"r" * 32,
        b"t" * 32,
    )
    tampered = Tampered("edge", 2, "stored_envelope_altered", b"evidence")
    assert store.set_aside_pending(second.key, tampered)
    assert not store.set_aside_pending(second.key, tampered)
    assert [i.seq for i in store.take_pending(CID, 10, now_ns=0)] == [1]
    assert store.counts().pending == 1 and store.counts().verdicts == 0
    assert [a.reason for a in store.alerts()] == ["stored_envelope_altered"]


def test_leaf_hashes_are_read_in_order_and_a_missing_one_is_an_error(store: Store) -> None:
    batch = [(1, b"", b"h" * 32), *entries(2, 3)]
    store.ingest("edge", batch)
    assert store.leaf_hashes("edge", 1, 3) == [
        (b"h" * 32, False),
        (batch[1][2], True),
        (batch[2][2], True),
    ]
    assert store.leaf_hashes("edge", 3, 2) == []
    with pytest.raises(StoreError, match="edge/4"):
        store.leaf_hashes("edge", 2, 4)


def _queue_as_format_1(env: lmdb.Environment, keys: list[bytes], commitment_id: str) -> None:
    """Move inbox items to the queue as format 1's Store.classify wrote them (11bcff6):
    ``cid ‖ order`` → attempts, not_before_ns, enqueued_ns, key length (>IQQH), key, error."""
    dbs = {name: env.open_db(name.encode()) for name in ("inbox", "pending", "by_record", "meta")}
    counters = env.open_db(b"counters")

    def incr(txn: lmdb.Transaction, name: str, delta: int) -> None:
        raw = txn.get(name.encode(), db=counters)
        value = (struct.unpack(">Q", raw)[0] if raw else 0) + delta
        txn.put(name.encode(), struct.pack(">Q", value), db=counters)

    with env.begin(write=True) as txn:
        for order, key in enumerate(keys, start=1):
            assert txn.delete(key, db=dbs["inbox"])
            incr(txn, "inbox", -1)
            seq = struct.unpack(">Q", key[-8:])[0]
            txn.put(f"R{seq}".encode() + b"\x00" + key, b"", db=dbs["by_record"])
            value = struct.pack(">IQQH", 1, 0, 5, len(key)) + key + b"engine busy"
            txn.put(
                bytes.fromhex(commitment_id) + struct.pack(">Q", order), value, db=dbs["pending"]
            )
            incr(txn, "pending", 1)
            incr(txn, f"pending:{commitment_id}", 1)
        txn.put(b"format", b"1", db=dbs["meta"])


def test_a_format_1_store_is_upgraded_on_open_and_its_queue_authenticated_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = Store.open(tmp_path / "s")
    store.ingest("edge", entries(1, 4), checkpoint=covering(3))
    store.classify([verdict("edge", 1, verifier_pb2.VERDICT_STATUS_PASS)])
    settings_ = verifier_pb2.DifrSettings(threshold=0.2, delta_max=5, sample_rate=1)
    store.set_difr_override(CID, settings_, actor="admin")
    store.close()
    with lmdb.open(str(tmp_path / "s"), max_dbs=64) as env:
        # Format 1 queued without a checkpoint: 4 is past the one stored.
        _queue_as_format_1(env, [ekey("edge", 2), ekey("edge", 4)], CID)

    store = Store.open(tmp_path / "s")
    counts = store.counts()
    assert (counts.inbox, counts.pending, counts.awaiting_checkpoint) == (3, 0, 1)
    assert store.backlog() == [] and store.take_pending(CID, 10, now_ns=1 << 62) == []
    # Offered for classification again only as far as a stored checkpoint covers them.
    assert [e.seq for e in store.inbox(10)] == [2, 3]
    store.classify([Enqueue("edge", 2, "R2", CID, 3, b"r" * 32, tag=b"t" * 32)])
    [item] = store.take_pending(CID, 10, now_ns=1 << 62)
    assert (item.seq, item.checkpoint_tree_size, item.tag) == (2, 3, b"t" * 32)
    assert [b.pending for b in store.backlog()] == [1]
    kept = store.verdict("edge", 1)
    assert kept is not None and kept.verdict.status == verifier_pb2.VERDICT_STATUS_PASS
    assert store.difr_override(CID) == settings_
    upgrade = store.audit_log()[-1]
    assert (upgrade.action, json.loads(upgrade.detail)["requeued"]) == ("store_upgrade", 2)
    assert any("upgraded from format 1" in r.getMessage() for r in caplog.records)
    store.close()
    store = Store.open(tmp_path / "s")  # format 2 now: nothing to upgrade
    assert [e.action for e in store.audit_log()].count("store_upgrade") == 1
    store.close()


def test_a_store_of_an_unknown_format_is_refused(tmp_path: Path) -> None:
    Store.open(tmp_path / "s").close()
    with lmdb.open(str(tmp_path / "s"), max_dbs=64) as env, env.begin(write=True) as txn:
        txn.put(b"format", b"9", db=env.open_db(b"meta", txn=txn))
    with pytest.raises(StoreError, match="store format b'9'"):
        Store.open(tmp_path / "s")

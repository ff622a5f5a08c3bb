"""collector.log.Log: appends, group commit, dedup, checkpoints, proofs, prune, map growth."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import lmdb
import pytest
from veritap import merkle
from veritap.chain import ChainVerifier
from veritap.envelope import ZERO_HASH, decode_envelope, decode_record, entry_hash
from veritap.note import open_checkpoint
from veritap.signing import Signer

from collector.log import (
    InvalidRecordError,
    Log,
    LogClosedError,
    LogOpenError,
    LogPrunedError,
    LogRangeError,
    LogReadOnlyError,
    LogWriteError,
)
from collector.log.audit import audit_log
from collector.log.writer import GroupCommitWriter
from tests.collector.log.log_fixtures import ORIGIN, make_record, open_log


@pytest.fixture
def signer() -> Signer:
    return Signer.generate(ORIGIN)


def leaves(log: Log) -> list[bytes]:
    return [entry_hash(envelope) for _, envelope in log.iter_entries(log.retention_floor)]


def test_appends_are_chained_envelopes_in_order(tmp_path: Path, signer: Signer) -> None:
    with open_log(tmp_path / "log", signer) as log:
        assert log.head().seq == 0
        assert log.head().hash == ZERO_HASH
        assert log.append(make_record(1)) == 1
        assert log.append_many([make_record(i) for i in range(2, 12)]) == list(range(2, 12))
        assert log.append_many([]) == []
        chain = ChainVerifier(origin=ORIGIN, verifier=signer.verifier())
        for seq, envelope in log.iter_entries(1):
            entry = chain.add(seq, envelope)
            assert entry.origin == ORIGIN
            assert entry.key_id == signer.key_id
            assert decode_record(entry) == make_record(seq)
            assert envelope == log.entry(seq)
        assert log.head().seq == 11
        assert log.head().hash == chain.head_hash
        assert [seq for seq, _ in log.iter_entries(4, 6)] == [4, 5, 6]
        assert log.record(5) == make_record(5)
        assert log.find_record(make_record(7).record_id) == 7
        assert log.find_record("no-such-record") is None


def test_a_known_record_id_returns_its_seq(tmp_path: Path, signer: Signer) -> None:
    with open_log(tmp_path / "log", signer) as log:
        log.append_many([make_record(i) for i in range(1, 4)])
        assert log.append(make_record(2)) == 2
        assert log.append_many([make_record(4), make_record(1), make_record(4)]) == [4, 1, 4]
    with open_log(tmp_path / "log", signer) as log:
        assert log.append(make_record(3)) == 3
        assert log.head().seq == 4


def test_concurrent_appends_are_group_committed(tmp_path: Path, signer: Signer) -> None:
    heads: list[int] = []
    results: dict[int, list[int]] = {}
    with open_log(tmp_path / "log", signer) as log:
        log.add_commit_listener(heads.append)

        def worker(number: int) -> None:
            results[number] = [log.append(make_record(number * 1000 + i)) for i in range(40)]

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(s for seqs in results.values() for s in seqs) == list(range(1, 321))
        for number, seqs in results.items():
            assert seqs == sorted(seqs)
            for i, seq in enumerate(seqs):
                assert log.find_record(make_record(number * 1000 + i).record_id) == seq
        assert heads == sorted(heads)
        assert heads[-1] == 320
        # One durable transaction served several callers at least once.
        assert len(heads) < 320


def test_a_lone_caller_commits_itself_and_later_callers_queue_behind_it(
    tmp_path: Path, signer: Signer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller that finds the log idle commits its records in its own thread; callers
    arriving during that commit are batched by the writer thread once it is durable."""
    real_put = GroupCommitWriter._put
    entered = threading.Event()
    release = threading.Event()
    putters: list[str] = []

    def held_put(self: GroupCommitWriter, txn: object, prepared: object, state: object) -> int:
        putters.append(threading.current_thread().name)
        if len(putters) == 1:
            entered.set()
            assert release.wait(10)
        return real_put(self, txn, prepared, state)  # type: ignore[arg-type]

    monkeypatch.setattr(GroupCommitWriter, "_put", held_put)
    results: dict[int, list[int]] = {}
    committers: list[tuple[int, str]] = []
    with open_log(tmp_path / "log", signer, checkpoint_interval_s=3600) as log:
        log.add_commit_listener(
            lambda head: committers.append((head, threading.current_thread().name))
        )

        def caller(number: int) -> None:
            results[number] = log.append_many([make_record(number * 10 + k) for k in range(3)])

        leader = threading.Thread(target=caller, args=(0,), name="leader")
        leader.start()
        assert entered.wait(10)
        others = [threading.Thread(target=caller, args=(n,)) for n in range(1, 4)]
        for thread in others:
            thread.start()
        writer = log._writer
        assert writer is not None
        deadline = time.monotonic() + 10
        while writer._queued < 9 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert writer._queued == 9
        release.set()
        for thread in [leader, *others]:
            thread.join()
        assert results[0] == [1, 2, 3]
        assert sorted(s for n in range(1, 4) for s in results[n]) == list(range(4, 13))
        assert committers[0] == (3, "leader")
        assert committers[-1][0] == 12
        assert {name for _, name in committers[1:]} == {"log-writer"}
        assert putters[0] == "leader"
    assert audit_log(tmp_path / "log", signer.verifier()).problem is None


def test_listener_sees_durable_entries(tmp_path: Path, signer: Signer) -> None:
    seen: list[tuple[int, bytes]] = []
    with open_log(tmp_path / "log", signer) as log:
        log.add_commit_listener(lambda head: seen.append((head, log.entry(head))))
        log.add_commit_listener(lambda head: (_ for _ in ()).throw(RuntimeError("listener bug")))
        log.append(make_record(1))
        log.append(make_record(2))
        log.append(make_record(1))
    assert [head for head, _ in seen] == [1, 2]
    assert decode_envelope(seen[1][1]).seq == 2


def test_checkpoints_every_n_records_and_on_close(tmp_path: Path, signer: Signer) -> None:
    with open_log(tmp_path / "log", signer, checkpoint_every=10, checkpoint_interval_s=3600) as log:
        for i in range(1, 26):
            log.append(make_record(i))
        sizes = [cp.tree_size for cp in log.checkpoints_between(0, 100)]
        assert sizes == [10, 20]
    with Log.open_readonly(tmp_path / "log") as log:
        all_leaves = leaves(log)
        checkpoints = log.checkpoints_between(0, 100)
        assert [cp.tree_size for cp in checkpoints] == [10, 20, 25]
        assert [cp.tree_size for cp in log.checkpoints_between(11, 25)] == [20, 25]
        for cp in checkpoints:
            body = open_checkpoint(cp.note, signer.verifier(), origin=ORIGIN)
            assert body.tree_size == cp.tree_size
            assert body.root_hash == cp.root_hash == merkle.root_of(all_leaves[: cp.tree_size])
        latest = log.latest_checkpoint()
        assert latest is not None
        assert latest.tree_size == 25
        assert log.checkpoint_at(20) == checkpoints[1]
        assert log.checkpoint_at(21) is None


def test_checkpoint_after_the_interval_without_more_records(tmp_path: Path, signer: Signer) -> None:
    with open_log(tmp_path / "log", signer, checkpoint_interval_s=0.05) as log:
        log.append_many([make_record(1), make_record(2)])
        log.append(make_record(3))
        deadline = time.monotonic() + 30
        latest = log.latest_checkpoint()
        while (latest is None or latest.tree_size < 3) and time.monotonic() < deadline:
            time.sleep(0.02)
            latest = log.latest_checkpoint()
        assert latest is not None
        assert latest.tree_size == 3


def test_no_signer_means_no_checkpoints(tmp_path: Path) -> None:
    with open_log(tmp_path / "log", None, checkpoint_every=1) as log:
        log.append_many([make_record(i) for i in range(1, 5)])
        assert log.latest_checkpoint() is None
        assert decode_envelope(log.entry(1)).key_id == b""


def test_inclusion_and_consistency_proofs(tmp_path: Path, signer: Signer) -> None:
    with open_log(tmp_path / "log", signer) as log:
        log.append_many([make_record(i) for i in range(1, 601)])
        all_leaves = leaves(log)
        for size in (1, 2, 255, 256, 257, 512, 600):
            root = merkle.root_of(all_leaves[:size])
            assert log.root_at(size) == root
            for seq in {1, size // 3 + 1, size // 2 + 1, size}:
                proof = log.inclusion_proof(seq, size)
                merkle.verify_inclusion(seq - 1, size, all_leaves[seq - 1], proof, root)
        for old, new in ((0, 600), (1, 600), (255, 600), (256, 513), (300, 600), (600, 600)):
            proof = log.consistency_proof(old, new)
            merkle.verify_consistency(
                old,
                new,
                merkle.root_of(all_leaves[:old]),
                merkle.root_of(all_leaves[:new]),
                proof,
            )
        with pytest.raises(LogRangeError):
            log.inclusion_proof(5, 601)
        with pytest.raises(LogRangeError):
            log.inclusion_proof(7, 6)
        with pytest.raises(LogRangeError):
            log.entry(601)
        with pytest.raises(LogRangeError):
            list(log.iter_entries(1, 700))


def test_prune_keeps_proofs_above_the_floor(tmp_path: Path, signer: Signer) -> None:
    key = signer.verifier()
    with open_log(tmp_path / "log", signer, checkpoint_every=100) as log:
        log.append_many([make_record(i) for i in range(1, 601)])
        all_leaves = leaves(log)
        assert log.prune(1) == 0
        assert log.prune(300) == 299
        assert log.prune(301) == 1
        assert log.retention_floor == 301
        with pytest.raises(LogPrunedError):
            log.entry(300)
        with pytest.raises(LogPrunedError):
            list(log.iter_entries(299))
        with pytest.raises(LogRangeError):
            log.prune(602)
        assert log.find_record(make_record(5).record_id) is None
        assert log.find_by_model("tiny-llama", limit=1) == [301]
        root = merkle.root_of(all_leaves)
        for seq in (301, 302, 400, 512, 513, 600):
            proof = log.inclusion_proof(seq, 600)
            merkle.verify_inclusion(seq - 1, 600, all_leaves[seq - 1], proof, root)
        assert log.root_at(600) == root
        log.append(make_record(601))
    report = audit_log(tmp_path / "log", key)
    assert report.problem is None
    assert (report.floor, report.head_seq, report.entries) == (301, 601, 301)
    with open_log(tmp_path / "log", signer) as log:
        assert log.retention_floor == 301
        assert log.prune(602) == 301
        assert log.head().seq == 601
    with open_log(tmp_path / "log", signer) as log:
        assert log.append(make_record(602)) == 602
    assert audit_log(tmp_path / "log", key).problem is None


def test_map_full_grows_the_map(tmp_path: Path, signer: Signer) -> None:
    with open_log(tmp_path / "log", signer, map_size=64 * 1024, checkpoint_every=50) as log:
        first = log.stats().map_size
        seqs = []
        for start in range(1, 301, 30):
            seqs += log.append_many(
                [make_record(i, body_size=4000) for i in range(start, start + 30)]
            )
        assert seqs == list(range(1, 301))
        assert log.stats().map_size > first
        assert log.record(300) == make_record(300, body_size=4000)
    assert audit_log(tmp_path / "log", signer.verifier()).problem is None


def test_model_time_index(tmp_path: Path, signer: Signer) -> None:
    with open_log(tmp_path / "log", signer) as log:
        log.append_many([make_record(i, model="a" if i % 2 else "b" * 300) for i in range(1, 21)])
        assert log.find_by_model("a") == list(range(1, 21, 2))
        assert log.find_by_model("b" * 300) == list(range(2, 21, 2))
        start = make_record(5).request_first_byte_ns
        end = make_record(11).request_first_byte_ns
        assert log.find_by_model("a", start, end) == [5, 7, 9]
        assert log.find_by_model("a", limit=2) == [1, 3]
        assert log.find_by_model("c") == []


def test_invalid_records_are_refused(tmp_path: Path, signer: Signer) -> None:
    with open_log(tmp_path / "log", signer) as log:
        record = make_record(1)
        record.record_id = ""
        with pytest.raises(InvalidRecordError):
            log.append(record)
        record = make_record(1)
        record.origin = "someone.else/log"
        with pytest.raises(InvalidRecordError):
            log.append(record)
        assert log.head().seq == 0


def test_reopen_checks_origin_key_and_writer(tmp_path: Path, signer: Signer) -> None:
    path = tmp_path / "log"
    with open_log(path, signer) as log:
        log.append_many([make_record(i) for i in range(1, 6)])
        with pytest.raises(LogOpenError):
            open_log(path, signer)
    with pytest.raises(LogOpenError, match="origin"):
        Log.open(path, origin="other.test/log", signer=signer)
    with pytest.raises(LogOpenError, match="key id"):
        open_log(path, Signer.generate(ORIGIN))
    with open_log(path, signer) as log:
        head = log.head()
        assert head.seq == 5
        assert log.append(make_record(6)) == 6
    with Log.open_readonly(path) as log:
        assert log.head().seq == 6
        assert log.retention_floor == 1
        with pytest.raises(LogReadOnlyError):
            log.append(make_record(7))
    assert audit_log(path, signer.verifier()).problem is None
    with pytest.raises(LogOpenError):
        Log.open_readonly(tmp_path / "nothing")


def test_closed_log_refuses_work(tmp_path: Path, signer: Signer) -> None:
    log = open_log(tmp_path / "log", signer)
    log.close()
    log.close()
    with pytest.raises(LogClosedError):
        log.append(make_record(1))
    with pytest.raises(LogClosedError):
        log.entry(1)


def test_a_failed_commit_fails_only_its_callers(
    tmp_path: Path, signer: Signer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction that cannot commit answers its callers with LogWriteError; batches
    prepared after it on its speculative state are rebuilt, and the chain stays whole."""
    poison = make_record(5_000).record_id.encode()
    real_put = GroupCommitWriter._put

    speculated: list[bool] = []

    def failing_put(self: GroupCommitWriter, txn: object, prepared: object, state: object) -> int:
        if any(record_id == poison for record_id, _ in prepared.id_rows):  # type: ignore[attr-defined]
            # Fail only once the next batch was built on this one's state.
            deadline = time.monotonic() + 10
            while self._slot is None and time.monotonic() < deadline:
                time.sleep(0.001)
            speculated.append(self._slot is not None)
            raise lmdb.DiskError("injected I/O error")
        return real_put(self, txn, prepared, state)  # type: ignore[arg-type]

    monkeypatch.setattr(GroupCommitWriter, "_put", failing_put)
    outcomes: dict[int, list[int] | str] = {}
    # Small batches: the next one is sealed (full) while the poisoned one is committing.
    with open_log(tmp_path / "log", signer, checkpoint_every=7, max_batch=6) as log:

        def worker(number: int) -> None:
            for i in range(number * 1000, number * 1000 + 30, 3):
                records = [make_record(i + k) for k in range(3)]
                try:
                    outcomes[i] = log.append_many(records)
                except LogWriteError as exc:
                    outcomes[i] = str(exc)

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(1, 7)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        failed = [i for i, outcome in outcomes.items() if isinstance(outcome, str)]
        # The poisoned request failed, with whatever other requests shared its transaction;
        # none of their records is stored, every other request's are, at their seqs.
        assert 5_000 in failed
        assert speculated == [True]
        assert "injected I/O error" in str(outcomes[5_000])
        for i, outcome in outcomes.items():
            for k in range(3):
                found = log.find_record(make_record(i + k).record_id)
                assert found == (None if i in failed else outcome[k])  # type: ignore[index]
        stored = sorted(
            s for outcome in outcomes.values() if isinstance(outcome, list) for s in outcome
        )
        assert stored == list(range(1, len(stored) + 1))
        assert log.head().seq == len(stored)
        assert log.append(make_record(77_777)) == len(stored) + 1
    assert audit_log(tmp_path / "log", signer.verifier()).problem is None


def test_prune_between_concurrent_appends(tmp_path: Path, signer: Signer) -> None:
    with open_log(tmp_path / "log", signer, checkpoint_every=10) as log:
        log.append_many([make_record(i) for i in range(1, 101)])
        stop = threading.Event()

        def appender() -> None:
            index = 1_000
            while not stop.is_set():
                log.append_many([make_record(index), make_record(index + 1)])
                index += 2

        thread = threading.Thread(target=appender)
        thread.start()
        try:
            assert log.prune(51) == 50
            assert log.prune(101) == 50
        finally:
            stop.set()
            thread.join()
        assert log.retention_floor == 101
    report = audit_log(tmp_path / "log", signer.verifier())
    assert report.problem is None
    assert report.floor == 101


READER = """
import sys
from pathlib import Path
from collector.log import Log
log = Log.open(Path(sys.argv[1]), origin=sys.argv[2], readonly=True, map_size=64 * 1024)
print(log.head().seq, flush=True)
sys.stdin.readline()
head = log.head().seq
entries = len(list(log.iter_entries(1)))
print(head, log.record(head).record_id, entries, log.stats().map_size > 64 * 1024, flush=True)
"""


def test_a_reader_in_another_process_follows_map_growth(tmp_path: Path, signer: Signer) -> None:
    path = tmp_path / "log"
    with open_log(path, signer, map_size=64 * 1024) as log:
        log.append(make_record(1))
        reader = subprocess.Popen(
            [sys.executable, "-c", READER, str(path), ORIGIN],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([".", "protos"])},
        )
        assert reader.stdout is not None
        assert reader.stdout.readline().strip() == "1"
        first = log.stats().map_size
        for start in range(2, 200, 20):
            log.append_many([make_record(i, body_size=3000) for i in range(start, start + 20)])
        assert log.stats().map_size > first
        out, _ = reader.communicate("go\n", timeout=60)
    # The reader adopted the map the writer grew (MDB_MAP_RESIZED) and read on.
    assert out.split() == ["201", make_record(201).record_id, "201", "True"]


HOLDER = """
import sys, time
import lmdb
env = lmdb.open(sys.argv[1], readonly=True, max_dbs=8)
txn = env.begin()
print("reading", flush=True)
time.sleep(600)
"""


def test_a_killed_readers_slot_is_freed_at_the_next_checkpoint(
    tmp_path: Path, signer: Signer, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "log"
    with open_log(path, signer, checkpoint_every=1) as log:
        log.append(make_record(1))
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE, text=True
        )
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "reading"
        holder.kill()
        holder.wait()
        with caplog.at_level("WARNING", logger="collector.log.writer"):
            log.append(make_record(2))
        cleared = [r for r in caplog.records if r.getMessage() == "cleared stale LMDB readers"]
        assert [r.count for r in cleared] == [1]  # type: ignore[attr-defined]

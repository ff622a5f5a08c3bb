"""The log writer's commit: a batch on disk is acknowledged, whatever fails after the commit.

A commit has a write step (which may fail: then nothing is durable and the batch is rolled
back) and an acknowledge step (the state advances, callers and listeners are told); the
stale-reader sweep after a checkpoint is housekeeping and cannot turn a durable batch into
a failed one. Each test holds the writer at a hook with events or the writer's own
condition, never with sleeps.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

import lmdb
import pytest
from veritap.signing import Signer

from collector.log import Log, LogCorruptError, LogWriteError
from collector.log import writer as writer_module
from collector.log.audit import audit_log
from collector.log.writer import GroupCommitWriter
from tests.collector.log.log_fixtures import ORIGIN, make_record, open_log

# Seconds a hook waits for the state it expects before the test fails instead of hanging.
HANG_GUARD_S = 10


@pytest.fixture
def signer() -> Signer:
    return Signer.generate(ORIGIN)


def writer_of(log: Log) -> GroupCommitWriter:
    writer = log._writer
    assert writer is not None
    return writer


def wait_for(writer: GroupCommitWriter, predicate: Callable[[], bool]) -> None:
    """Block until `predicate` (read under the writer's lock) holds; it is re-read on each
    notify of the writer's condition."""
    with writer._cond:
        assert writer._cond.wait_for(predicate, HANG_GUARD_S)


def checkpoint_sizes(path: Path) -> list[int]:
    with Log.open_readonly(path) as log:
        return [cp.tree_size for cp in log.checkpoints_between(0, 100)]


def assert_audits_clean(path: Path, signer: Signer, head_seq: int) -> None:
    report = audit_log(path, signer.verifier())
    assert report.problem is None
    assert report.head_seq == head_seq


def test_a_failing_reader_sweep_never_fails_a_durable_checkpoint(
    tmp_path: Path,
    signer: Signer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The sweep after each checkpoint raises (the leader's, then the writer thread's at
    close): both batches are acknowledged and the failure is a warning naming the error."""

    def failing_sweep(env: lmdb.Environment) -> None:
        raise lmdb.Error("injected reader_check failure")

    monkeypatch.setattr(writer_module, "clear_stale_readers", failing_sweep)
    path = tmp_path / "log"
    heads: list[int] = []
    checkpoints: list[int] = []
    with (
        caplog.at_level(logging.WARNING, logger=writer_module.__name__),
        open_log(path, signer, checkpoint_every=2, checkpoint_interval_s=3600) as log,
    ):
        log.add_commit_listener(heads.append)
        log.add_checkpoint_listener(checkpoints.append)
        assert log.append_many([make_record(1), make_record(2)]) == [1, 2]
        assert checkpoints == [2]
        assert log.append(make_record(3)) == 3
        assert log.head().seq == 3
    assert heads == [2, 3]
    assert checkpoints == [2, 3]
    sweeps = [r for r in caplog.records if r.getMessage() == "stale LMDB reader sweep failed"]
    assert [r.levelno for r in sweeps] == [logging.WARNING, logging.WARNING]
    assert all("injected reader_check failure" in r.error for r in sweeps)  # type: ignore[attr-defined]
    assert_audits_clean(path, signer, head_seq=3)
    assert checkpoint_sizes(path) == [2, 3]
    with open_log(path, signer) as log:
        assert log.append(make_record(4)) == 4


@pytest.mark.parametrize("failure", [lmdb.DiskError("injected I/O error"), KeyboardInterrupt()])
def test_a_leaders_failed_write_leaves_a_queued_caller_to_land(
    tmp_path: Path, signer: Signer, monkeypatch: pytest.MonkeyPatch, failure: BaseException
) -> None:
    """The leader's write fails once the sequencer sealed a queued caller's batch (with a
    checkpoint) on the leader's speculative state: that batch is rebuilt on what is durable
    and lands; the leader's records are not stored. An error reaches the leader's caller as
    LogWriteError; a KeyboardInterrupt goes on as itself, the writer's state settled first."""
    poison = make_record(10).record_id.encode()
    entered = threading.Event()
    real_put = GroupCommitWriter._put

    def failing_put(self: GroupCommitWriter, txn: object, prepared: object, state: object) -> int:
        if any(record_id == poison for record_id, _ in prepared.id_rows):  # type: ignore[attr-defined]
            entered.set()
            wait_for(self, lambda: self._slot is not None)
            raise failure
        return real_put(self, txn, prepared, state)  # type: ignore[arg-type]

    monkeypatch.setattr(GroupCommitWriter, "_put", failing_put)
    path = tmp_path / "log"
    queued: list[list[int] | BaseException] = []
    with open_log(path, signer, checkpoint_every=4, checkpoint_interval_s=3600, max_batch=3) as log:
        assert log.append(make_record(1)) == 1

        def queued_caller() -> None:
            assert entered.wait(HANG_GUARD_S)
            try:
                queued.append(log.append_many([make_record(20 + k) for k in range(3)]))
            except LogWriteError as exc:
                queued.append(exc)

        thread = threading.Thread(target=queued_caller)
        thread.start()
        expected = KeyboardInterrupt if isinstance(failure, KeyboardInterrupt) else LogWriteError
        with pytest.raises(expected):
            log.append_many([make_record(10), make_record(11)])
        thread.join()
        assert queued == [[2, 3, 4]]
        assert log.find_record(make_record(10).record_id) is None
        assert log.find_record(make_record(11).record_id) is None
        assert log.head().seq == 4
        assert log.append(make_record(30)) == 5
    assert_audits_clean(path, signer, head_seq=5)
    assert checkpoint_sizes(path) == [4, 5]


@pytest.mark.parametrize("step", ["write", "sweep"])
def test_a_leader_failing_while_close_waits(
    tmp_path: Path, signer: Signer, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """close() starts while a leader commits a checkpointed batch, and the sequencer seals
    the last batch on the leader's state; then the leader's write fails (its records are
    not stored and the last checkpoint covers what is) or its sweep does (the batch is
    acknowledged). Either way close() returns and the log on disk audits clean."""
    poison = make_record(2).record_id.encode()
    entered = threading.Event()

    def wait_for_the_last_batch(writer: GroupCommitWriter) -> None:
        entered.set()
        wait_for(writer, lambda: writer._slot is not None and writer._slot.last)

    if step == "write":
        real_put = GroupCommitWriter._put

        def failing_put(
            self: GroupCommitWriter, txn: object, prepared: object, state: object
        ) -> int:
            if any(record_id == poison for record_id, _ in prepared.id_rows):  # type: ignore[attr-defined]
                wait_for_the_last_batch(self)
                raise lmdb.DiskError("injected I/O error")
            return real_put(self, txn, prepared, state)  # type: ignore[arg-type]

        monkeypatch.setattr(GroupCommitWriter, "_put", failing_put)
    else:
        real_sweep = GroupCommitWriter._clear_stale_readers

        def failing_sweep(self: GroupCommitWriter) -> None:
            if threading.current_thread().name == "leader":
                wait_for_the_last_batch(self)
                raise lmdb.Error("injected reader_check failure")
            real_sweep(self)

        monkeypatch.setattr(GroupCommitWriter, "_clear_stale_readers", failing_sweep)
    path = tmp_path / "log"
    outcome: list[list[int] | BaseException] = []
    checkpoints: list[int] = []
    log = open_log(path, signer, checkpoint_every=2, checkpoint_interval_s=3600)
    log.add_checkpoint_listener(checkpoints.append)
    assert log.append(make_record(1)) == 1

    def leader() -> None:
        try:
            outcome.append(log.append_many([make_record(2), make_record(3)]))
        except LogWriteError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=leader, name="leader")
    thread.start()
    assert entered.wait(HANG_GUARD_S)
    log.close()
    thread.join()
    if step == "write":
        assert isinstance(outcome[0], LogWriteError)
        assert checkpoints == [1]
        head = 1
    else:
        assert outcome == [[2, 3]]
        assert checkpoints == [3]
        head = 3
    assert_audits_clean(path, signer, head_seq=head)
    assert checkpoint_sizes(path) == [head]
    with open_log(path, signer) as log:
        assert log.append(make_record(4)) == head + 1


def test_an_interrupt_after_the_durable_commit_acknowledges_the_batch(
    tmp_path: Path, signer: Signer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A KeyboardInterrupt arriving in the leader's thread after LMDB committed but before
    the write returned: the disk has the batch, so the log's state, the listeners and later
    appends follow the disk, and the interrupt still reaches the caller."""
    real_with_growth = GroupCommitWriter._with_growth
    interrupted: list[int] = []

    def interrupted_with_growth(self: GroupCommitWriter, fn: writer_module.JobFunction) -> int:
        result = real_with_growth(self, fn)
        if not interrupted:
            interrupted.append(result)
            raise KeyboardInterrupt
        return result

    monkeypatch.setattr(GroupCommitWriter, "_with_growth", interrupted_with_growth)
    path = tmp_path / "log"
    heads: list[int] = []
    checkpoints: list[int] = []
    with open_log(path, signer, checkpoint_every=2, checkpoint_interval_s=3600) as log:
        log.add_commit_listener(heads.append)
        log.add_checkpoint_listener(checkpoints.append)
        with pytest.raises(KeyboardInterrupt):
            log.append_many([make_record(1), make_record(2)])
        assert interrupted == [2]
        assert heads == [2]
        assert checkpoints == [2]
        assert log.head().seq == 2
        assert log.append_many([make_record(2), make_record(3)]) == [2, 3]
    assert_audits_clean(path, signer, head_seq=3)
    assert checkpoint_sizes(path) == [2, 3]


def _interrupted_leader_beside_a_queued_caller(
    log: Log, entered: threading.Event
) -> list[list[int]]:
    """Lead with records 10 and 11 into the interrupt the patched steps raise, while a
    second caller appends three records once `entered` is set; what it was answered."""
    queued: list[list[int]] = []

    def queued_caller() -> None:
        assert entered.wait(HANG_GUARD_S)
        queued.append(log.append_many([make_record(20 + k) for k in range(3)]))

    thread = threading.Thread(target=queued_caller, daemon=True)
    thread.start()
    with pytest.raises(KeyboardInterrupt):
        log.append_many([make_record(10), make_record(11)])
    thread.join(HANG_GUARD_S)
    assert not thread.is_alive(), "the queued caller was never answered"
    return queued


# Where the interrupt hits the leader: right after it claimed both roles (before preparing),
# after it published its batch's state (before the write), after the write (before the
# batch is acknowledged). Each waits until a second caller's records are queued, or sealed
# on the leader's state where the sequencer may seal them.
INTERRUPTED_STEPS = {"claim": "_lead", "publish": "_commit", "acknowledge": "_acknowledge"}


@pytest.mark.parametrize("step", sorted(INTERRUPTED_STEPS))
def test_an_interrupt_between_a_leaders_steps_leaves_no_role_held(
    tmp_path: Path, signer: Signer, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """A KeyboardInterrupt at any step of a leader reaches its caller, and the leader's
    roles are given back: its batch stands where the disk has it and is rolled back
    (with the batch sealed on its state) where not; the queued caller lands, later appends
    lead again and the log audits clean."""
    name = INTERRUPTED_STEPS[step]
    real_step = getattr(GroupCommitWriter, name)
    entered = threading.Event()
    interrupted: list[str] = []

    def interrupting_step(self: GroupCommitWriter, *args: object) -> object:
        if threading.current_thread() is threading.main_thread() and not interrupted:
            interrupted.append(step)
            entered.set()
            if step == "claim":
                wait_for(self, lambda: self._queued == 3)
            else:
                wait_for(self, lambda: self._slot is not None)
            raise KeyboardInterrupt
        return real_step(self, *args)

    path = tmp_path / "log"
    with open_log(path, signer, checkpoint_interval_s=3600, max_batch=3) as log:
        assert log.append(make_record(1)) == 1
        monkeypatch.setattr(GroupCommitWriter, name, interrupting_step)
        queued = _interrupted_leader_beside_a_queued_caller(log, entered)
        assert interrupted == [step]
        writer = writer_of(log)
        wait_for(writer, writer._idle)
        stored = step == "acknowledge"
        assert queued == [[4, 5, 6] if stored else [2, 3, 4]]
        leaders = [2, 3] if stored else [5, 6]
        assert log.append_many([make_record(10), make_record(11)]) == leaders
        assert log.append(make_record(30)) == 7
    assert_audits_clean(path, signer, head_seq=7)


@pytest.mark.parametrize("second", ["_landed", "_roll_back", "_requeue"])
def test_a_second_interrupt_while_a_leader_settles_leaves_the_log_on_the_disks_state(
    tmp_path: Path, signer: Signer, monkeypatch: pytest.MonkeyPatch, second: str
) -> None:
    """The leader is interrupted after it published its batch's state (a second caller's
    batch sealed on it), then again while it settles that batch (checking the disk,
    rolling back, requeueing the sealed batch). The settling is finished before the roles
    are given back: the sealed batch is requeued and lands after what is stored, never
    chained on the unstored batch, and the log audits clean."""
    real_commit: Callable[..., object] = GroupCommitWriter._commit
    real_second = getattr(GroupCommitWriter, second)
    entered = threading.Event()
    interrupted: list[str] = []

    def interrupting_commit(self: GroupCommitWriter, *args: object) -> object:
        if threading.current_thread() is threading.main_thread() and not interrupted:
            interrupted.append("_commit")
            entered.set()
            wait_for(self, lambda: self._slot is not None)
            raise KeyboardInterrupt
        return real_commit(self, *args)

    def interrupting_second(self: GroupCommitWriter, *args: object) -> object:
        if threading.current_thread() is threading.main_thread() and interrupted == ["_commit"]:
            interrupted.append(second)
            raise KeyboardInterrupt
        return real_second(self, *args)

    path = tmp_path / "log"
    with open_log(path, signer, checkpoint_interval_s=3600, max_batch=3) as log:
        assert log.append(make_record(1)) == 1
        monkeypatch.setattr(GroupCommitWriter, "_commit", interrupting_commit)
        monkeypatch.setattr(GroupCommitWriter, second, interrupting_second)
        queued = _interrupted_leader_beside_a_queued_caller(log, entered)
        assert interrupted == ["_commit", second]
        writer = writer_of(log)
        wait_for(writer, writer._idle)
        assert queued == [[2, 3, 4]]
        assert log.append_many([make_record(10), make_record(11)]) == [5, 6]
        assert log.append(make_record(30)) == 7
    assert_audits_clean(path, signer, head_seq=7)


def test_an_interrupt_as_a_leader_gives_back_its_roles_still_wakes_the_sequencer(
    tmp_path: Path, signer: Signer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A KeyboardInterrupt in the leader's thread just after it freed its roles, while it
    checks whether the sequencer has work: a caller queued behind the leader's commit
    (too few records to be sealed before the roles are free) is still sealed and answered,
    and the interrupt reaches the leader's caller with its batch stored."""
    real_lead: Callable[..., object] = GroupCommitWriter._lead
    real_has_work = GroupCommitWriter._sequencer_has_work
    entered = threading.Event()
    interrupted: list[str] = []

    def lead_once_a_caller_queued(self: GroupCommitWriter, *args: object) -> object:
        if threading.current_thread() is threading.main_thread() and not entered.is_set():
            entered.set()
            wait_for(self, lambda: self._queued == 3)
        return real_lead(self, *args)

    def interrupted_has_work(self: GroupCommitWriter) -> bool:
        if threading.current_thread() is threading.main_thread() and not interrupted:
            interrupted.append("_sequencer_has_work")
            raise KeyboardInterrupt
        return real_has_work(self)

    path = tmp_path / "log"
    with open_log(path, signer, checkpoint_interval_s=3600) as log:
        assert log.append(make_record(1)) == 1
        monkeypatch.setattr(GroupCommitWriter, "_lead", lead_once_a_caller_queued)
        monkeypatch.setattr(GroupCommitWriter, "_sequencer_has_work", interrupted_has_work)
        queued = _interrupted_leader_beside_a_queued_caller(log, entered)
        assert interrupted == ["_sequencer_has_work"]
        assert queued == [[4, 5, 6]]
        assert log.append_many([make_record(10), make_record(11)]) == [2, 3]
        assert log.append(make_record(30)) == 7
    assert_audits_clean(path, signer, head_seq=7)


def test_a_lone_callers_time_checkpoint_follows_its_count_checkpoint(
    tmp_path: Path, signer: Signer
) -> None:
    """A leader gives back its roles without waking the threads when nothing changed for
    them; a leader whose batch moved the checkpoint deadline (its own count-driven
    checkpoint, then a record after it) wakes the sequencer, which signs the time-driven
    checkpoint over the last record with no further append."""
    sizes: list[int] = []
    covered = threading.Event()

    def on_checkpoint(size: int) -> None:
        sizes.append(size)
        if size == 3:
            covered.set()

    with open_log(tmp_path / "log", signer, checkpoint_every=2, checkpoint_interval_s=0.05) as log:
        log.add_checkpoint_listener(on_checkpoint)
        assert log.append_many([make_record(1), make_record(2)]) == [1, 2]
        assert sizes == [2]
        assert log.append(make_record(3)) == 3
        assert covered.wait(HANG_GUARD_S)
    assert sizes == [2, 3]


def test_a_batch_is_never_stored_past_a_gap_after_the_disks_head(
    tmp_path: Path, signer: Signer
) -> None:
    """Whatever left the writer's state ahead of the disk, the write refuses a batch that
    does not begin right after the stored head (append mode alone would store it, chained
    on entries never written); the batch is rolled back and the next append lands at the
    head."""
    path = tmp_path / "log"
    with open_log(path, signer, checkpoint_interval_s=3600) as log:
        assert log.append(make_record(1)) == 1
        writer = writer_of(log)
        with writer._cond:
            ahead = writer._next.copy()
            ahead.seq += 3
            writer._next = ahead
        with pytest.raises(LogCorruptError, match="from seq 5 on a stored head of 1"):
            log.append(make_record(2))
        assert log.append(make_record(2)) == 2
    assert_audits_clean(path, signer, head_seq=2)

"""Group commit for the log: a caller alone commits its own records, else a sequencer
thread builds batches and one writer thread commits them.

A caller that finds the log idle (nothing queued, nothing being prepared or
written) is the *leader*: it does the sequencer's and the writer's work for
its own records in its own thread, with no hand-off between threads (as
LevelDB's writer queue does). Callers that arrive meanwhile queue up for the
threads below, which may build their batch on the leader's state while the
leader commits; the writer thread commits it only once the leader is done.

Otherwise callers queue records (serialized in their own thread) and block. The
*sequencer* takes what is queued (up to `max_batch` records), gives each new
record its seq, builds its envelope, chains its hash, extends the Merkle
frontier and, when one is due, signs a checkpoint: everything but the disk.
The *writer* (the only thread that writes to LMDB) puts a prepared batch in
one durable transaction, commits it and only then tells each caller its seq.
A commit is a write step, which may fail (then nothing is durable and the batch
is rolled back), and an acknowledge step once the disk has the batch, which
never rolls back: the committed state advances, callers and listeners are told.

The two overlap: while the writer waits for the disk, records queue up, and
the sequencer seals the next batch as soon as it is full (`max_batch`
records) or the writer falls idle, building it from the state the current
one will leave. That state is speculative; if a commit fails, its callers get
the error, the batch prepared after it is put back in the queue and the
sequencer restarts from the last committed state (the generation counter
tells it that its work went stale).

Record ids already in the log, or in a batch not yet committed, are not stored
again: the caller gets the existing seq.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

import lmdb
from veritap import merkle
from veritap.envelope import EnvelopeEncoder, leaf_hasher
from veritap.lmdb_env import LmdbEnv, MapGrowthError
from veritap.note import CheckpointBody, sign_checkpoint
from veritap.read_gate import MapKeepsGrowingError
from veritap.signing import Signer
from veritap.v1 import log_pb2

from collector.log import layout
from collector.log.errors import LogClosedError, LogCorruptError, LogError, LogWriteError
from collector.log.layout import Db, MetaKey, u64

logger = logging.getLogger(__name__)

CommitListener = Callable[[int], None]
JobFunction: TypeAlias = "Callable[[lmdb.Transaction[bytes]], int]"


@dataclass
class ChainState:
    """Where the log stands after some batch: head, frontier and the last checkpoint.

    Mutable on purpose: the sequencer builds each batch's state in place on its
    own copy; once handed over, a state is never changed again.
    """

    seq: int
    hash: bytes
    frontier: merkle.Frontier
    checkpoint_size: int
    # time.monotonic() of the last checkpoint (or of opening the log).
    checkpoint_at: float

    def copy(self) -> ChainState:
        return ChainState(
            self.seq, self.hash, self.frontier.copy(), self.checkpoint_size, self.checkpoint_at
        )


class _Request:
    """Records waiting to be appended, and what the writer answers."""

    __slots__ = ("done", "error", "headers", "ids", "model_keys", "payloads", "seqs")

    def __init__(
        self,
        payloads: list[bytes],
        headers: list[bytes],
        ids: list[bytes],
        model_keys: list[bytes],
    ) -> None:
        self.payloads = payloads
        # envelope.record_header() of each payload.
        self.headers = headers
        self.ids = ids
        # by_model_time key of each record, less its trailing seq.
        self.model_keys = model_keys
        self.seqs: list[int] = []
        self.error: BaseException | None = None
        self.done = threading.Event()


class _Lease:
    """A caller's claim on the sequencer's and the writer's roles, while it leads.

    The roles are given back by identity (`_give_back`), from a `finally` that encloses
    the claim itself, so an interrupt at any of the leader's steps (a second one while it
    settles too, `_settle`) cannot leave a role held by a leader that is gone.
    """

    __slots__ = ("generation", "inflight", "prepared", "state")

    def __init__(self) -> None:
        self.generation = 0
        # The state it leads from; set once the caller leads (its request is never queued).
        self.state: ChainState | None = None
        self.inflight: dict[bytes, bytes] = {}
        # Its batch, once prepared; its state may then be published.
        self.prepared: _Prepared | None = None


# Who holds a role when it is not a leader.
_SEQUENCER = "sequencer"
_WRITER = "writer"
_Owner: TypeAlias = "_Lease | str"
_AWAKE = object()


class _Job:
    """A function the writer runs in a write transaction of its own, between batches."""

    __slots__ = ("done", "error", "fn", "result")

    def __init__(self, fn: JobFunction) -> None:
        self.fn = fn
        self.result = 0
        self.error: BaseException | None = None
        self.done = threading.Event()


class _Prepared:
    """One transaction's worth of work, built by the sequencer."""

    __slots__ = (
        "checkpoint",
        "generation",
        "id_rows",
        "ids",
        "job",
        "last",
        "model_rows",
        "nodes",
        "requests",
        "rows",
        "state",
    )

    def __init__(
        self,
        generation: int,
        state: ChainState,
        *,
        last: bool = False,
        job: _Job | None = None,
    ) -> None:
        self.generation = generation
        # The log's state once this batch is committed.
        self.state = state
        self.last = last
        self.job = job
        self.requests: list[_Request] = []
        # The new entries' items for the records, by_record_id and by_model_time databases.
        self.rows: list[tuple[bytes, bytes]] = []
        self.id_rows: list[tuple[bytes, bytes]] = []
        self.model_rows: list[tuple[bytes, bytes]] = []
        # record id -> seq key of the new entries, for dedup until they are committed.
        self.ids: dict[bytes, bytes] = {}
        self.nodes: list[merkle.Node] = []
        self.checkpoint: log_pb2.Checkpoint | None = None


def clear_stale_readers(env: lmdb.Environment) -> None:
    """Free reader slots of processes that died (a kill -9'd `collector serve`, say).

    A dead reader's slot pins an old snapshot, so LMDB cannot reuse the pages
    freed since and the file grows. Checked at open, at each checkpoint and
    before growing the map.
    """
    stale = env.reader_check()
    if stale:
        logger.warning("cleared stale LMDB readers", extra={"count": stale})


class GroupCommitWriter:
    """The sequencer and writer threads of one open log (see the module docstring)."""

    def __init__(
        self,
        lmdb_env: LmdbEnv,
        dbs: dict[Db, lmdb._Database],
        *,
        encoder: EnvelopeEncoder,
        signer: Signer | None,
        state: ChainState,
        checkpoint_every: int,
        checkpoint_interval_s: float,
        max_batch: int,
        on_commit: Callable[[ChainState], None],
    ) -> None:
        self._lmdb = lmdb_env
        self._env = lmdb_env.env
        self._dbs = dbs
        self._gate = lmdb_env.gate
        self._encoder = encoder
        self._signer = signer
        self._checkpoint_every = checkpoint_every
        self._checkpoint_interval_s = checkpoint_interval_s
        self._max_batch = max_batch
        self._on_commit = on_commit
        self.listeners: list[CommitListener] = []
        #: Called with the tree size of each checkpoint once it is committed.
        self.checkpoint_listeners: list[CommitListener] = []
        # Guards everything below.
        self._cond = threading.Condition()
        self._queue: deque[_Request | _Job] = deque()
        # Records in the queue.
        self._queued = 0
        self._closing = False
        # Who is committing a batch (the writer thread, which also runs jobs, or a leader).
        self._committer: _Owner | None = None
        # Who took work and has not yet published the state it leaves (sequencer or leader).
        self._preparer: _Owner | None = None
        self._slot: _Prepared | None = None
        # The checkpoint deadline the sequencer sleeps until (None: until notified); _AWAKE
        # while it is not waiting.
        self._sequencer_sleeps_until: float | object | None = _AWAKE
        self._generation = 0
        self._committed = state
        self._next = state.copy()
        self._inflight: dict[bytes, bytes] = {}
        # A batch marked last is with the writer (cleared if a failed commit requeues it).
        self._last_published = False
        # The writer committed the last batch: both threads are done.
        self._finished = False
        self._threads = [
            threading.Thread(target=self._sequence_loop, name="log-sequencer", daemon=True),
            threading.Thread(target=self._write_loop, name="log-writer", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    @property
    def committed(self) -> ChainState:
        return self._committed

    # ------------------------------------------------------------ callers

    def append(
        self,
        payloads: list[bytes],
        headers: list[bytes],
        ids: list[bytes],
        model_keys: list[bytes],
    ) -> list[int]:
        """Queue records and wait until they are durable; returns their seqs."""
        request = _Request(payloads, headers, ids, model_keys)
        self._submit(request)
        return request.seqs

    def run_job(self, fn: JobFunction) -> int:
        """Run `fn` in a write transaction of its own between batches; returns its result."""
        job = _Job(fn)
        self._submit(job)
        return job.result

    def _submit(self, item: _Request | _Job) -> None:
        if isinstance(item, _Request):
            lease = _Lease()
            try:
                self._enqueue(item, lease)
                if lease.state is not None:
                    self._lead(item, lease)
            finally:
                self._give_back(lease, item)
        else:
            self._enqueue(item, None)
        item.done.wait()
        if item.error is not None:
            if isinstance(item.error, LogError):
                raise item.error
            raise LogWriteError(f"log write failed: {item.error}") from item.error

    def _enqueue(self, item: _Request | _Job, lease: _Lease | None) -> None:
        """Queue `item`, or, for a request finding the log idle, claim both roles for `lease`
        (its state is then set) and leave the request to the caller's thread."""
        with self._cond:
            if self._closing:
                raise LogClosedError("log is closed")
            if lease is not None and self._idle():
                lease.generation = self._generation
                lease.inflight = dict(self._inflight)
                # From here on the request is the leader's to answer, never queued.
                lease.state = self._next.copy()
                self._preparer = lease
                self._committer = lease
                return
            self._queue.append(item)
            self._queued += len(item.ids) if isinstance(item, _Request) else 0
            self._cond.notify_all()

    def _idle(self) -> bool:
        """Nothing queued, prepared or written (caller holds the lock): a caller may lead."""
        return (
            not self._queue
            and self._slot is None
            and self._committer is None
            and self._preparer is None
        )

    def _lead(self, request: _Request, lease: _Lease) -> None:
        """Prepare and commit `request` in the caller's thread (`lease` holds both roles).

        What interrupts the caller's thread (KeyboardInterrupt) goes on to the caller once
        the log's state is the disk's and the roles are given back (`_give_back`).
        """
        assert lease.state is not None
        try:
            prepared = self._prepare(
                [request], lease.state, lease.inflight, lease.generation, last=False
            )
        except Exception as exc:
            logger.exception("log leader failed a batch", extra={"records": len(request.ids)})
            request.error = exc
            request.done.set()
            return
        lease.prepared = prepared
        with self._cond:
            # What queued meanwhile may now be sealed on this batch's state.
            self._next = prepared.state
            self._inflight.update(prepared.ids)
            self._preparer = None
            # Only the sequencer can act on this, and only on what is queued or on a close
            # (for the last batch); waking both threads for nothing costs a lone caller
            # two thread switches a batch.
            if self._queue or self._closing:
                self._cond.notify_all()
        interrupt = self._commit(prepared)
        if interrupt is not None:
            raise interrupt

    def _give_back(self, lease: _Lease, request: _Request) -> None:
        """Settle what a leader left unsettled, then free the roles it still holds.

        Runs in a `finally` around the claim, so it also runs when an interrupt hit the
        leader anywhere from its claim to its commit's end. A batch prepared and never
        settled (its request not answered) is checked against the disk: stored, it is
        acknowledged; not, it is rolled back, with the batches sealed on its state.
        While it settles, the writer's role is still held: nothing commits on a state
        that may be rolled back.
        """
        try:
            interrupt = self._settle(lease, request)
        finally:
            with self._cond:
                self._free_roles(lease)
        if interrupt is not None:
            raise interrupt

    def _free_roles(self, lease: _Lease) -> None:
        """Free the roles `lease` still holds and wake both threads when they may act on
        that (caller holds the lock); a lone caller's batches leave both asleep as they
        were. An interrupt (KeyboardInterrupt, SystemExit) arriving meanwhile frees the
        roles and wakes both threads anyway, then goes on: no thread may sleep on roles
        that are free."""
        try:
            self._drop_roles(lease)
            wanted = self._slot is not None or self._sequencer_has_work()
        except BaseException:
            self._drop_roles(lease)
            self._cond.notify_all()
            raise
        if wanted:
            self._cond.notify_all()

    def _drop_roles(self, lease: _Lease) -> None:
        """Free the roles `lease` still holds (caller holds the lock)."""
        if self._preparer is lease:
            self._preparer = None
        if self._committer is lease:
            self._committer = None

    def _settle(self, lease: _Lease, request: _Request) -> BaseException | None:
        """Answer a leader's unsettled request: acknowledged if its batch is stored,
        else rolled back. A second interrupt (KeyboardInterrupt, SystemExit) while it
        settles is kept and the settling done again (each step may be repeated), so the
        roles are never given back with the log's state ahead of the disk; the kept
        interrupt is returned, to be raised once the roles are free."""
        kept: BaseException | None = None
        while lease.state is not None and not request.done.is_set():
            try:
                interrupted = LogWriteError("the leader was interrupted before its batch settled")
                if lease.prepared is None:
                    request.error = interrupted
                    request.done.set()
                elif self._landed(lease.prepared):
                    self._acknowledge(lease.prepared)
                else:
                    self._roll_back(lease.prepared, interrupted)
            except Exception:
                raise
            except BaseException as exc:
                kept = kept or exc
        return kept

    def close(self) -> None:
        """Finish what is queued, sign a last checkpoint, and stop both threads."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join()

    # ---------------------------------------------------------- sequencer

    def _checkpoint_due(self, state: ChainState, *, last: bool) -> bool:
        if self._signer is None or state.seq <= state.checkpoint_size:
            return False
        if last or state.seq - state.checkpoint_size >= self._checkpoint_every:
            return True
        return time.monotonic() - state.checkpoint_at >= self._checkpoint_interval_s

    def _checkpoint_deadline(self) -> float | None:
        """time.monotonic() when a time-driven checkpoint is due; None when none is pending."""
        state = self._next
        if self._signer is None or state.seq <= state.checkpoint_size:
            return None
        return state.checkpoint_at + self._checkpoint_interval_s

    def _checkpoint_wait(self) -> float | None:
        """Seconds until a time-driven checkpoint is due; None when none is pending."""
        deadline = self._checkpoint_deadline()
        return None if deadline is None else deadline - time.monotonic()

    def _sequencer_has_work(self) -> bool:
        """Whether the sequencer, once the roles are free, could act on something it does
        not already wait for (caller holds the lock): queued work, a close, or a checkpoint
        deadline other than the one it sleeps until."""
        return bool(
            self._queue
            or self._closing
            or self._sequencer_sleeps_until != self._checkpoint_deadline()
        )

    def _take(self) -> list[_Request] | _Job:
        """Queued requests up to max_batch records (at least one request), or one job."""
        if isinstance(self._queue[0], _Job):
            job = self._queue.popleft()
            assert isinstance(job, _Job)
            return job
        batch: list[_Request] = []
        count = 0
        while self._queue:
            item = self._queue[0]
            if isinstance(item, _Job) or (batch and count + len(item.ids) > self._max_batch):
                break
            self._queue.popleft()
            batch.append(item)
            count += len(item.ids)
        self._queued -= count
        return batch

    def _sequence_loop(self) -> None:
        while True:
            with self._cond:
                # Seal the next batch when it is full, or when the writer would otherwise sit
                # idle; while the writer is busy what queues up joins the batch.
                while True:
                    if self._finished:
                        return
                    wait = None
                    if self._slot is None and self._preparer is None:
                        if self._queue and (
                            self._queued >= self._max_batch
                            or self._committer is None
                            or self._closing
                        ):
                            break
                        if self._closing and not self._queue and not self._last_published:
                            break
                        if not self._closing and self._committer is None:
                            wait = self._checkpoint_wait()
                            if wait is not None and wait <= 0:
                                break
                    self._sequencer_sleeps_until = (
                        None if wait is None else self._checkpoint_deadline()
                    )
                    self._cond.wait(wait)
                    self._sequencer_sleeps_until = _AWAKE
                taken = self._take() if self._queue else []
                last = self._closing and not self._queue
                generation = self._generation
                state = self._next.copy()
                inflight = dict(self._inflight)
                self._preparer = _SEQUENCER
            if isinstance(taken, _Job):
                self._publish(_Prepared(generation, state, job=taken), taken)
                continue
            if not taken and not last and not self._checkpoint_due(state, last=False):
                self._done_preparing()
                continue
            try:
                prepared = self._prepare(taken, state, inflight, generation, last=last)
            except Exception as exc:
                logger.exception("log sequencer failed a batch", extra={"requests": len(taken)})
                self._done_preparing()
                for request in taken:
                    request.error = exc
                    request.done.set()
                continue
            self._publish(prepared, None)

    def _done_preparing(self) -> None:
        with self._cond:
            self._preparer = None
            self._cond.notify_all()

    def _publish(self, prepared: _Prepared, job: _Job | None) -> None:
        """Hand a batch to the writer, or requeue its requests when it went stale meanwhile.

        A job is a barrier: the sequencer waits until the writer has run it.
        """
        with self._cond:
            while self._slot is not None and prepared.generation == self._generation:
                self._cond.wait()
            self._preparer = None
            if prepared.generation != self._generation:
                self._requeue(prepared)
                self._cond.notify_all()
                return
            self._slot = prepared
            if prepared.job is None:
                self._next = prepared.state
                self._inflight.update(prepared.ids)
                self._last_published = prepared.last
            self._cond.notify_all()
        if job is not None:
            job.done.wait()

    def _prepare(
        self,
        requests: list[_Request],
        state: ChainState,
        inflight: dict[bytes, bytes],
        generation: int,
        *,
        last: bool,
    ) -> _Prepared:
        """Seqs, envelopes, hashes, frontier and checkpoint for `requests` (no disk writes)."""
        prepared = _Prepared(generation, state, last=last)
        prepared.requests = requests
        seq = state.seq
        prev = state.hash
        tail = self._encoder.tail(time.time_ns())
        encode = self._encoder.encode_parts
        leaf_state = leaf_hasher
        rows = prepared.rows
        id_rows = prepared.id_rows
        model_rows = prepared.model_rows
        leaves: list[bytes] = []
        with (
            self._gate.reading(),
            self._env.begin() as txn,
            txn.cursor(db=self._dbs[Db.BY_RECORD_ID]) as cursor,
        ):
            wanted = [rid for request in requests for rid in request.ids if rid not in inflight]
            # Record id -> seq key of the entries stored, in flight or new before each record.
            seen = dict(cursor.getmulti(wanted)) if wanted else {}
        seen.update(inflight)
        for request in requests:
            seqs: list[int] = []
            for payload, header, record_id, model_key in zip(
                request.payloads, request.headers, request.ids, request.model_keys, strict=True
            ):
                known = seen.get(record_id)
                if known is not None:
                    seqs.append(layout.read_u64(known))
                    continue
                seq += 1
                key = u64(seq)
                envelope = encode(seq, prev, tail, header, payload)
                # entry_hash(envelope), without a call per record.
                hasher = leaf_state()
                hasher.update(envelope)
                prev = hasher.digest()
                leaves.append(prev)
                rows.append((key, envelope))
                id_rows.append((record_id, key))
                model_rows.append((model_key + key, b""))
                seen[record_id] = key
                seqs.append(seq)
            request.seqs = seqs
        prepared.ids = dict(id_rows)
        frontier = state.frontier
        frontier.completed.clear()
        frontier.extend(leaves)
        prepared.nodes = list(frontier.completed)
        frontier.completed.clear()
        state.seq = seq
        state.hash = prev
        if self._checkpoint_due(state, last=last):
            prepared.checkpoint = self._make_checkpoint(seq, frontier.root())
            state.checkpoint_size = seq
            state.checkpoint_at = time.monotonic()
        return prepared

    def _make_checkpoint(self, tree_size: int, root: bytes) -> log_pb2.Checkpoint:
        assert self._signer is not None
        origin = self._encoder.origin
        note = sign_checkpoint(CheckpointBody(origin, tree_size, root), self._signer)
        return log_pb2.Checkpoint(
            origin=origin,
            tree_size=tree_size,
            root_hash=root,
            note=note,
            signed_at_ns=time.time_ns(),
        )

    # ------------------------------------------------------------- writer

    def _requeue(self, prepared: _Prepared) -> None:
        """Put a stale batch's work back at the head of the queue (caller holds the lock)."""
        self._queue.extendleft(reversed(prepared.requests))
        self._queued += sum(len(request.ids) for request in prepared.requests)
        if prepared.job is not None:
            self._queue.appendleft(prepared.job)

    def _write_loop(self) -> None:
        while True:
            with self._cond:
                # A batch sealed while a leader commits waits for the leader's commit.
                while self._slot is None or self._committer is not None:
                    self._cond.wait()
                prepared = self._slot
                self._slot = None
                self._committer = _WRITER
                self._cond.notify_all()
            try:
                if prepared.job is not None:
                    self._run_job(prepared.job)
                    continue
                try:
                    self._commit(prepared)
                except BaseException:
                    # A listener's BaseException, say: the writer thread must live on.
                    logger.exception("log writer failed to finish a commit")
            finally:
                with self._cond:
                    self._committer = None
                    self._cond.notify_all()
            if prepared.last:
                with self._cond:
                    self._finished = True
                    self._cond.notify_all()
                return

    def _commit(self, prepared: _Prepared) -> BaseException | None:
        """Write `prepared`, then acknowledge it, or roll it back when the disk lacks it.

        Returns what interrupted the write when that is no Exception (KeyboardInterrupt
        in a leader's thread), for the leader to raise; an Exception is its callers'.
        """
        try:
            if prepared.rows or prepared.checkpoint is not None:
                self._with_growth(lambda txn: self._put(txn, prepared, prepared.state))
        except BaseException as exc:
            if self._landed(prepared):
                logger.warning(
                    "log write raised after its commit was durable; the batch stands",
                    extra={"entries": len(prepared.rows), "error": repr(exc)},
                )
                self._acknowledge(prepared)
            else:
                self._roll_back(prepared, exc)
            return None if isinstance(exc, Exception) else exc
        self._acknowledge(prepared)
        return None

    def _acknowledge(self, prepared: _Prepared) -> None:
        """The disk has `prepared`: advance the committed state and tell callers and listeners.

        Nothing here may turn the batch into a failed one: the stale-reader sweep that
        follows a checkpoint is housekeeping, and a failure of it is a warning.
        """
        state = prepared.state
        try:
            self._committed = state
            self._on_commit(state)
            with self._cond:
                for record_id, key in prepared.ids.items():
                    if self._inflight.get(record_id) == key:
                        del self._inflight[record_id]
        finally:
            # Their seqs are set and durable: no caller may be left waiting.
            for request in prepared.requests:
                request.done.set()
        if prepared.rows:
            self._tell(self.listeners, state.seq)
        if prepared.checkpoint is not None:
            self._tell(self.checkpoint_listeners, prepared.checkpoint.tree_size)
            try:
                self._clear_stale_readers()
            except Exception as exc:
                logger.warning("stale LMDB reader sweep failed", extra={"error": repr(exc)})

    def _landed(self, prepared: _Prepared) -> bool:
        """Whether a batch whose write raised is on disk all the same.

        An exception may arrive after LMDB committed and before the write returned (a
        KeyboardInterrupt in a leader's thread). The head on disk tells, or for a batch of
        a checkpoint alone, that checkpoint. When the disk cannot be read the batch counts
        as not stored: rolled back, a stored batch makes the next commit fail ("the head
        is stale") until a reopen reads the disk; acknowledged, a lost one would leave a
        gap in the chain.
        """
        checkpoint = prepared.checkpoint
        if not prepared.rows and checkpoint is None:
            return True
        try:
            with self._lmdb.read() as txn:
                if prepared.rows:
                    head = layout.pack_head(prepared.state.seq, prepared.state.hash)
                    return txn.get(MetaKey.HEAD.value, db=self._dbs[Db.META]) == head
                assert checkpoint is not None
                stored = txn.get(u64(checkpoint.tree_size), db=self._dbs[Db.CHECKPOINTS])
                return stored == checkpoint.SerializeToString()
        except Exception:
            logger.exception("log could not read whether a failed write was stored")
            return False

    @staticmethod
    def _tell(listeners: list[CommitListener], seq: int) -> None:
        for listener in listeners:
            try:
                listener(seq)
            except Exception:
                logger.exception("log commit listener failed", extra={"seq": seq})

    def _put(self, txn: lmdb.Transaction[bytes], prepared: _Prepared, state: ChainState) -> int:
        """Write a prepared batch (one putmulti per database keeps the GIL mostly free)."""
        put = txn.put
        meta = self._dbs[Db.META]
        if prepared.rows:
            # The writer's state is the disk's: append mode only asks for larger keys, so a
            # state ahead would be stored as a batch chained on entries never written.
            first = layout.read_u64(prepared.rows[0][0])
            stored = txn.get(MetaKey.HEAD.value, db=meta)
            head = layout.unpack_head(stored)[0] if stored is not None else 0
            if first != head + 1:
                side = "behind" if first <= head else "ahead of"
                raise LogCorruptError(
                    f"a batch from seq {first} on a stored head of {head}: "
                    f"the writer's state is {side} the disk"
                )
        with txn.cursor(db=self._dbs[Db.RECORDS]) as cursor:
            _, added = cursor.putmulti(prepared.rows, append=True)
        if added != len(prepared.rows):
            raise LogCorruptError("records are stored past the stored head")
        with txn.cursor(db=self._dbs[Db.BY_RECORD_ID]) as cursor:
            cursor.putmulti(prepared.id_rows)
        with txn.cursor(db=self._dbs[Db.BY_MODEL_TIME]) as cursor:
            cursor.putmulti(prepared.model_rows)
        tree_db = self._dbs[Db.TREE]
        for level, index, node in prepared.nodes:
            put(layout.tree_key(level, index), node, db=tree_db)
        if prepared.rows:
            put(MetaKey.HEAD.value, layout.pack_head(state.seq, state.hash), db=meta)
            put(MetaKey.FRONTIER.value, state.frontier.to_bytes(), db=meta)
        if prepared.checkpoint is not None:
            put(
                u64(prepared.checkpoint.tree_size),
                prepared.checkpoint.SerializeToString(),
                db=self._dbs[Db.CHECKPOINTS],
            )
        return len(prepared.rows)

    def _roll_back(self, prepared: _Prepared, exc: BaseException) -> None:
        """A commit failed: fail its callers, requeue later work, restart from what is durable."""
        logger.error(
            "log commit failed; its records were not stored",
            extra={"entries": len(prepared.rows), "error": repr(exc)},
        )
        with self._cond:
            self._generation += 1
            self._next = self._committed.copy()
            self._inflight.clear()
            self._last_published = False
            # Requeued before the slot is emptied: a rollback interrupted here and done
            # again requeues it then.
            if self._slot is not None:
                self._requeue(self._slot)
            self._slot = None
            if prepared.last:
                # Closing, and the last batch failed: nothing may stay queued unanswered.
                while self._queue:
                    item = self._queue.popleft()
                    item.error = LogClosedError("log closed after a failed commit")
                    item.done.set()
                self._queued = 0
            self._cond.notify_all()
        for request in prepared.requests:
            request.error = exc
            request.done.set()

    def _clear_stale_readers(self) -> None:
        clear_stale_readers(self._env)

    def _with_growth(self, fn: JobFunction) -> int:
        """Run `fn` in a write transaction; a full map is doubled and `fn` run again."""
        try:
            return self._lmdb.write(fn)
        except (MapGrowthError, MapKeepsGrowingError) as exc:
            raise LogWriteError(str(exc)) from exc

    def _run_job(self, job: _Job) -> None:
        try:
            job.result = self._with_growth(job.fn)
        except BaseException as exc:
            job.error = exc
        finally:
            job.done.set()

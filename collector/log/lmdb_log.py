"""The collector's append-only log: one LMDB environment, group commit, signed checkpoints.

`Log` opens the environment, answers reads and hands appends to a
`collector.log.writer.GroupCommitWriter`: callers block until their records
are in a durable transaction (LMDB sync on) and then learn their seqs. Each
entry is an envelope (`veritap.envelope`) whose hash chains to the previous
one and is the next leaf of an RFC 6962 Merkle tree; a C2SP-signed checkpoint
of that tree is written in the same transaction every `checkpoint_every`
records or `checkpoint_interval_s`, whichever comes first, and on close.
See `collector.log.layout` for what is stored where.

Reads run in short read transactions of their own and may come from any
thread. Growing the map (after MapFullError) waits until no read is in
progress, as LMDB requires.
"""

from __future__ import annotations

import fcntl
import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO

import lmdb
from veritap import merkle
from veritap.envelope import (
    ZERO_HASH,
    EnvelopeEncoder,
    EnvelopeError,
    decode_envelope,
    record_header,
)
from veritap.envelope import decode_record as decode_entry_record
from veritap.lmdb_env import LmdbEnv
from veritap.read_gate import MapKeepsGrowingError
from veritap.signing import Signer
from veritap.v1 import log_pb2, record_pb2

from collector.log import layout
from collector.log.errors import (
    InvalidRecordError,
    LogClosedError,
    LogCorruptError,
    LogError,
    LogOpenError,
    LogPrunedError,
    LogRangeError,
    LogReadOnlyError,
)
from collector.log.layout import Db, MetaKey, u64
from collector.log.writer import (
    ChainState,
    CommitListener,
    GroupCommitWriter,
    clear_stale_readers,
)

logger = logging.getLogger(__name__)

DEFAULT_MAP_SIZE = 1 << 30
# Most records one transaction takes (one append_many larger than this is still one).
DEFAULT_MAX_BATCH = 1024
# Entries read per read transaction by iter_entries.
READ_CHUNK = 256
# Entries deleted per transaction by prune.
PRUNE_CHUNK = 10_000
# Models whose by_model_time key prefix is kept ready.
_MODEL_PREFIX_CACHE = 1024


@dataclass(frozen=True)
class LogStats:
    head_seq: int
    retention_floor: int
    # Checkpoints stored, and the tree size of the newest.
    checkpoints: int
    last_checkpoint_size: int
    # Bytes LMDB may map (grows on MapFullError).
    map_size: int


@dataclass(frozen=True)
class Head:
    """The last entry: its seq (0 for an empty log) and hash (32 zero bytes when empty)."""

    seq: int
    hash: bytes


class Log:
    """A signed, hash-chained, append-only log of InferenceRecords (see the module docstring)."""

    def __init__(
        self,
        path: Path,
        env: lmdb.Environment,
        *,
        origin: str,
        readonly: bool,
        lock_file: IO[bytes] | None,
    ) -> None:
        self.path = path
        self.origin = origin
        self.readonly = readonly
        self.key_id = b""
        self._env = env
        self._dbs = {db: env.open_db(db.value, create=not readonly) for db in Db}
        self._records = self._dbs[Db.RECORDS]
        self._meta = self._dbs[Db.META]
        self._lock_file = lock_file
        self._lmdb = LmdbEnv(env, name="log", before_growth=partial(clear_stale_readers, env))
        self._model_prefixes: dict[str, bytes] = {}
        self._writer: GroupCommitWriter | None = None
        self._closed = False
        self._head = Head(0, ZERO_HASH)
        self._frontier = merkle.Frontier()
        self._floor = 1
        self._checkpoint_size = 0

    # ------------------------------------------------------------------ open

    @classmethod
    def open(
        cls,
        path: Path,
        *,
        origin: str,
        signer: Signer | None = None,
        map_size: int = DEFAULT_MAP_SIZE,
        checkpoint_interval_s: float = 1.0,
        checkpoint_every: int = 1000,
        max_batch: int = DEFAULT_MAX_BATCH,
        readonly: bool = False,
    ) -> Log:
        """Open (creating when writable and absent) the log in directory `path`.

        A writable log takes `writer.lock` (one writing process per log) and
        checks that `origin` and the signer's key id are the ones the log was
        created with. Without a signer no checkpoints are written. One
        transaction takes at most `max_batch` records (more when a single
        append_many brings more).
        """
        path = Path(path)
        if checkpoint_every < 1 or checkpoint_interval_s <= 0 or max_batch < 1:
            raise ValueError(
                "checkpoint_every and max_batch must be >= 1, checkpoint_interval_s > 0"
            )
        lock_file = None
        if readonly:
            if not (path / "data.mdb").exists():
                raise LogOpenError(f"no log at {path}")
        else:
            path.mkdir(parents=True, exist_ok=True)
            lock_file = cls._take_writer_lock(path)
        try:
            data_size = (path / "data.mdb").stat().st_size if (path / "data.mdb").exists() else 0
            try:
                env = lmdb.open(
                    str(path),
                    map_size=max(map_size, data_size),
                    max_dbs=layout.MAX_DBS,
                    readonly=readonly,
                    mode=0o640,
                    sync=True,
                    metasync=True,
                )
            except lmdb.Error as exc:
                raise LogOpenError(f"cannot open LMDB environment {path}: {exc}") from exc
            try:
                stale = env.reader_check()
                if stale:
                    logger.info("cleared stale LMDB readers", extra={"count": stale})
                if not readonly:
                    cls._init_meta(env, origin, signer)
                log = cls(path, env, origin=origin, readonly=readonly, lock_file=lock_file)
                log._load_state()
                if not readonly:
                    log._start_writer(
                        signer,
                        checkpoint_every=checkpoint_every,
                        checkpoint_interval_s=checkpoint_interval_s,
                        max_batch=max_batch,
                    )
            except BaseException:
                env.close()
                raise
        except BaseException:
            if lock_file is not None:
                lock_file.close()
            raise
        return log

    @classmethod
    def open_readonly(cls, path: Path) -> Log:
        """Open an existing log read-only under the origin it was created with."""
        path = Path(path)
        if not (path / "data.mdb").exists():
            raise LogOpenError(f"no log at {path}")
        try:
            env = lmdb.open(str(path), readonly=True, max_dbs=layout.MAX_DBS)
        except lmdb.Error as exc:
            raise LogOpenError(f"cannot open LMDB environment {path}: {exc}") from exc
        try:
            with env.begin() as txn:
                meta = env.open_db(Db.META.value, txn=txn, create=False)
                origin = txn.get(MetaKey.ORIGIN.value, db=meta)
        except lmdb.Error as exc:
            raise LogOpenError(f"{path} holds no log: {exc}") from exc
        finally:
            env.close()
        if origin is None:
            raise LogOpenError(f"{path} holds no log (no origin in meta)")
        return cls.open(path, origin=origin.decode(), readonly=True)

    @staticmethod
    def _take_writer_lock(path: Path) -> IO[bytes]:
        lock_file = open(path / layout.WRITER_LOCK, "ab")  # noqa: SIM115 (held while open)
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            lock_file.close()
            raise LogOpenError(f"log {path} is open for writing by another process") from exc
        return lock_file

    @staticmethod
    def _init_meta(env: lmdb.Environment, origin: str, signer: Signer | None) -> None:
        """Create the meta of a new log, or check an existing one (origin, key id, format)."""
        meta = env.open_db(Db.META.value)
        for db in Db:
            env.open_db(db.value)
        with env.begin(write=True) as txn:
            version = txn.get(MetaKey.FORMAT.value, db=meta)
            if version is None:
                key_id = signer.key_id if signer is not None else b""
                verifier_key = signer.verifier().key_string() if signer is not None else ""
                txn.put(MetaKey.FORMAT.value, layout.FORMAT_VERSION.to_bytes(4, "big"), db=meta)
                txn.put(MetaKey.ORIGIN.value, origin.encode(), db=meta)
                txn.put(MetaKey.KEY_ID.value, key_id, db=meta)
                txn.put(MetaKey.VERIFIER_KEY.value, verifier_key.encode(), db=meta)
                txn.put(MetaKey.HEAD.value, layout.pack_head(0, ZERO_HASH), db=meta)
                txn.put(MetaKey.FRONTIER.value, merkle.Frontier().to_bytes(), db=meta)
                txn.put(MetaKey.FLOOR.value, u64(1), db=meta)
                txn.put(MetaKey.FLOOR_PREV_HASH.value, ZERO_HASH, db=meta)
                txn.put(MetaKey.FLOOR_FRONTIER.value, merkle.Frontier().to_bytes(), db=meta)
                return
            if int.from_bytes(version, "big") != layout.FORMAT_VERSION:
                raise LogOpenError(
                    f"log format version {int.from_bytes(version, 'big')} is not "
                    f"{layout.FORMAT_VERSION}"
                )
            stored_origin = (txn.get(MetaKey.ORIGIN.value, db=meta) or b"").decode()
            if stored_origin != origin:
                raise LogOpenError(f"log origin is {stored_origin!r}, not {origin!r}")
            stored_key_id = txn.get(MetaKey.KEY_ID.value, db=meta) or b""
            if signer is not None and signer.key_id != stored_key_id:
                raise LogOpenError(
                    f"log is signed by key id {stored_key_id.hex() or '(none)'}, "
                    f"not by {signer.key_id.hex()}"
                )

    def _load_state(self) -> None:
        with self._env.begin() as txn:
            version = txn.get(MetaKey.FORMAT.value, db=self._meta)
            if version is None:
                raise LogOpenError(f"{self.path} holds no log")
            stored_origin = (txn.get(MetaKey.ORIGIN.value, db=self._meta) or b"").decode()
            if stored_origin != self.origin:
                raise LogOpenError(f"log origin is {stored_origin!r}, not {self.origin!r}")
            self.key_id = txn.get(MetaKey.KEY_ID.value, db=self._meta) or b""
            head = self._read_head(txn)
            frontier = merkle.Frontier.from_bytes(
                self._meta_value(txn, MetaKey.FRONTIER), keep_from_level=layout.TREE_LEVEL
            )
            if frontier.size != head.seq:
                raise LogCorruptError(
                    f"meta frontier covers {frontier.size} entries, the head is seq {head.seq}"
                )
            self._floor = layout.read_u64(self._meta_value(txn, MetaKey.FLOOR))
            with txn.cursor(db=self._records) as cursor:
                last = layout.read_u64(cursor.key()) if cursor.last() else 0
            if last != head.seq and not (last == 0 and self._floor == head.seq + 1):
                raise LogCorruptError(f"meta head is seq {head.seq}, the last entry is seq {last}")
            with txn.cursor(db=self._dbs[Db.CHECKPOINTS]) as cursor:
                self._checkpoint_size = layout.read_u64(cursor.key()) if cursor.last() else 0
        self._head = head
        self._frontier = frontier

    def _meta_value(self, txn: lmdb.Transaction[bytes], key: MetaKey) -> bytes:
        value = txn.get(key.value, db=self._meta)
        if value is None:
            raise LogCorruptError(f"meta key {key.value.decode()} is missing")
        return value

    def _read_head(self, txn: lmdb.Transaction[bytes]) -> Head:
        seq, head_hash = layout.unpack_head(self._meta_value(txn, MetaKey.HEAD))
        return Head(seq, head_hash)

    def _start_writer(
        self,
        signer: Signer | None,
        *,
        checkpoint_every: int,
        checkpoint_interval_s: float,
        max_batch: int,
    ) -> None:
        state = ChainState(
            self._head.seq,
            self._head.hash,
            self._frontier.copy(),
            self._checkpoint_size,
            time.monotonic(),
        )
        self._writer = GroupCommitWriter(
            self._lmdb,
            self._dbs,
            encoder=EnvelopeEncoder(self.origin, self.key_id),
            signer=signer,
            state=state,
            checkpoint_every=checkpoint_every,
            checkpoint_interval_s=checkpoint_interval_s,
            max_batch=max_batch,
            on_commit=self._committed,
        )

    def _committed(self, state: ChainState) -> None:
        """Called by the writer thread after each commit."""
        self._head = Head(state.seq, state.hash)
        self._checkpoint_size = state.checkpoint_size

    # --------------------------------------------------------------- appends

    def add_commit_listener(self, callback: CommitListener) -> None:
        """Call `callback(head_seq)` after each commit that adds entries, from the thread that
        committed it: the writer thread, or a caller that found the log idle."""
        self._writable().listeners.append(callback)

    def add_checkpoint_listener(self, callback: CommitListener) -> None:
        """Call `callback(tree_size)` after each committed checkpoint (from the committing
        thread, as commit listeners are)."""
        self._writable().checkpoint_listeners.append(callback)

    def _writable(self) -> GroupCommitWriter:
        if self._writer is None:
            raise LogReadOnlyError("log is open read-only")
        return self._writer

    def append(self, record: record_pb2.InferenceRecord) -> int:
        """Append one record; returns its seq once durable (the existing seq for a known id)."""
        return self.append_many([record])[0]

    def append_many(self, records: Sequence[record_pb2.InferenceRecord]) -> list[int]:
        """Append records in order; returns their seqs once all are durable (one transaction)."""
        writer = self._writable()
        if not records:
            return []
        payloads = []
        headers = []
        ids = []
        model_keys = []
        prefixes = self._model_prefixes
        for record in records:
            record_id = record.record_id.encode()
            if not record_id or len(record_id) > layout.RECORD_ID_MAX:
                raise InvalidRecordError(
                    f"record id {record.record_id!r} is empty or over {layout.RECORD_ID_MAX} bytes"
                )
            if record.origin and record.origin != self.origin:
                raise InvalidRecordError(
                    f"record {record.record_id} is from origin {record.origin!r}, "
                    f"this log is {self.origin!r}"
                )
            payload = record.SerializeToString()
            model = record.api.model
            prefix = prefixes.get(model)
            if prefix is None:
                if len(prefixes) >= _MODEL_PREFIX_CACHE:
                    prefixes.clear()
                prefix = prefixes[model] = layout.model_prefix(model)
            payloads.append(payload)
            headers.append(record_header(payload))
            ids.append(record_id)
            model_keys.append(prefix + u64(record.request_first_byte_ns))
        return writer.append(payloads, headers, ids, model_keys)

    # ----------------------------------------------------------------- reads

    @contextmanager
    def _read(self) -> Iterator[lmdb.Transaction[bytes]]:
        if self._closed:
            raise LogClosedError("log is closed")
        # A map another process (the writer) grew is adopted before the read begins.
        try:
            with self._lmdb.read() as txn:
                yield txn
        except MapKeepsGrowingError as exc:
            raise LogCorruptError(str(exc)) from exc

    def head(self) -> Head:
        """The last durable entry (read from disk for a read-only log)."""
        if not self.readonly:
            return self._head
        with self._read() as txn:
            return self._read_head(txn)

    @property
    def retention_floor(self) -> int:
        """The lowest seq still stored (1 until something is pruned)."""
        if not self.readonly:
            return self._floor
        with self._read() as txn:
            return layout.read_u64(self._meta_value(txn, MetaKey.FLOOR))

    def entry(self, seq: int) -> bytes:
        """The envelope bytes of entry `seq`, verbatim."""
        with self._read() as txn:
            data = txn.get(u64(seq), db=self._records)
            if data is None:
                raise self._missing(txn, seq)
            return data

    def _missing(self, txn: lmdb.Transaction[bytes], seq: int) -> LogError:
        head = self._read_head(txn) if self.readonly else self._head
        floor = layout.read_u64(self._meta_value(txn, MetaKey.FLOOR))
        if seq < 1 or seq > head.seq:
            return LogRangeError(f"seq {seq} is not in the log (head is {head.seq})")
        if seq < floor:
            return LogPrunedError(f"seq {seq} was pruned (retention floor is {floor})")
        return LogCorruptError(f"seq {seq} is missing from the records")

    def iter_entries(self, from_seq: int, to_seq: int | None = None) -> Iterator[tuple[int, bytes]]:
        """Yield (seq, envelope bytes) for from_seq..to_seq inclusive (to the head when None).

        The head is taken when iteration starts; entries are read in short
        transactions of `READ_CHUNK`, none held between yields.
        """
        last = self.head().seq if to_seq is None else to_seq
        floor = self.retention_floor
        if from_seq < floor:
            raise LogPrunedError(f"seq {from_seq} was pruned (retention floor is {floor})")
        if last > self.head().seq:
            raise LogRangeError(f"seq {last} is past the head ({self.head().seq})")
        seq = max(from_seq, 1)
        while seq <= last:
            chunk_end = min(seq + READ_CHUNK - 1, last)
            with self._read() as txn, txn.cursor(db=self._records) as cursor:
                chunk = []
                if cursor.set_key(u64(seq)):
                    for key, value in cursor:
                        got = layout.read_u64(key)
                        if got != seq or got > chunk_end:
                            break
                        chunk.append((got, value))
                        seq += 1
                if seq <= chunk_end:
                    raise self._missing(txn, seq)
            yield from chunk

    def find_record(self, record_id: str) -> int | None:
        """The seq of the record with this id, if the log holds it."""
        with self._read() as txn:
            stored = txn.get(record_id.encode(), db=self._dbs[Db.BY_RECORD_ID])
        return layout.read_u64(stored) if stored is not None else None

    def find_by_model(
        self, model: str, start_ns: int = 0, end_ns: int | None = None, limit: int = 1000
    ) -> list[int]:
        """Seqs of `model`'s records with start_ns <= request_first_byte_ns < end_ns, by time."""
        prefix = layout.model_prefix(model)
        out: list[int] = []
        with self._read() as txn, txn.cursor(db=self._dbs[Db.BY_MODEL_TIME]) as cursor:
            if not cursor.set_range(prefix + u64(start_ns)):
                return out
            for key in cursor.iternext(values=False):
                if not key.startswith(prefix) or len(key) != len(prefix) + 16:
                    break
                time_ns, seq = layout.seq_of_model_time_key(key)
                if (end_ns is not None and time_ns >= end_ns) or len(out) >= limit:
                    break
                out.append(seq)
        return out

    def record(self, seq: int) -> record_pb2.InferenceRecord:
        """The InferenceRecord stored at `seq`."""
        try:
            return decode_entry_record(decode_envelope(self.entry(seq)))
        except EnvelopeError as exc:
            raise LogCorruptError(f"seq {seq}: {exc}") from exc

    # ----------------------------------------------------------- checkpoints

    def latest_checkpoint(self) -> log_pb2.Checkpoint | None:
        with self._read() as txn, txn.cursor(db=self._dbs[Db.CHECKPOINTS]) as cursor:
            if not cursor.last():
                return None
            return log_pb2.Checkpoint.FromString(cursor.value())

    def checkpoint_at(self, tree_size: int) -> log_pb2.Checkpoint | None:
        with self._read() as txn:
            data = txn.get(u64(tree_size), db=self._dbs[Db.CHECKPOINTS])
        return log_pb2.Checkpoint.FromString(data) if data is not None else None

    def checkpoints_between(self, lo_seq: int, hi_seq: int) -> list[log_pb2.Checkpoint]:
        """Checkpoints with lo_seq <= tree_size <= hi_seq, in order."""
        out: list[log_pb2.Checkpoint] = []
        if hi_seq < lo_seq:
            return out
        with self._read() as txn, txn.cursor(db=self._dbs[Db.CHECKPOINTS]) as cursor:
            if not cursor.set_range(u64(max(lo_seq, 0))):
                return out
            for key, value in cursor:
                if layout.read_u64(key) > hi_seq:
                    break
                out.append(log_pb2.Checkpoint.FromString(value))
        return out

    # ---------------------------------------------------------------- proofs

    def _subtree_hash(self, txn: lmdb.Transaction[bytes], level: int, index: int) -> bytes:
        """Hash of the perfect subtree (level, index): stored, or rebuilt from its leaves."""
        if level == 0:
            envelope = txn.get(u64(index + 1), db=self._records)
            if envelope is not None:
                return merkle.leaf_hash(envelope)
        stored = txn.get(layout.tree_key(level, index), db=self._dbs[Db.TREE])
        if stored is not None:
            return stored
        if level == 0:
            raise self._missing(txn, index + 1)
        left = self._subtree_hash(txn, level - 1, 2 * index)
        return merkle.node_hash(left, self._subtree_hash(txn, level - 1, 2 * index + 1))

    def _range_hasher(self, txn: lmdb.Transaction[bytes]) -> merkle.RangeHasher:
        def range_hash(begin: int, end: int) -> bytes:
            parts = merkle.perfect_subtrees(begin, end)
            return merkle.fold_right([self._subtree_hash(txn, lv, ix) for lv, ix in parts])

        return range_hash

    def _check_size(self, tree_size: int) -> None:
        head = self.head().seq
        if not 0 <= tree_size <= head:
            raise LogRangeError(f"tree size {tree_size} is past the head ({head})")

    def inclusion_proof(self, seq: int, tree_size: int) -> list[bytes]:
        """RFC 6962 audit path (leaf to root) of entry `seq` in the tree of `tree_size` entries."""
        self._check_size(tree_size)
        if not 1 <= seq <= tree_size:
            raise LogRangeError(f"seq {seq} is not in a tree of size {tree_size}")
        with self._read() as txn:
            return merkle.inclusion_proof(seq - 1, tree_size, self._range_hasher(txn))

    def consistency_proof(self, old_size: int, new_size: int) -> list[bytes]:
        """RFC 6962 consistency proof from tree size old_size to new_size."""
        self._check_size(new_size)
        if not 0 <= old_size <= new_size:
            raise LogRangeError(f"no consistency proof from size {old_size} to {new_size}")
        with self._read() as txn:
            return merkle.consistency_proof(old_size, new_size, self._range_hasher(txn))

    def root_at(self, tree_size: int) -> bytes:
        """Merkle root of the first `tree_size` entries."""
        self._check_size(tree_size)
        with self._read() as txn:
            return self._range_hasher(txn)(0, tree_size) if tree_size else merkle.EMPTY_ROOT

    # ----------------------------------------------------------------- prune

    def prune(self, before_seq: int) -> int:
        """Delete the entries below `before_seq` and raise the retention floor to it.

        Returns how many entries were deleted. Checkpoints and the stored
        subtree hashes stay, so proofs for entries above the floor still work.
        Callers decide what may go (e.g. what every verifier acknowledged).
        """
        writer = self._writable()
        head = self._head.seq
        if before_seq > head + 1:
            raise LogRangeError(f"cannot prune up to seq {before_seq}: the head is {head}")
        deleted = 0
        while self._floor < before_seq:
            target = min(before_seq, self._floor + PRUNE_CHUNK)
            deleted += writer.run_job(partial(self._prune_txn, new_floor=target))
            self._floor = target
        return deleted

    def _prune_txn(self, txn: lmdb.Transaction[bytes], new_floor: int) -> int:
        floor = layout.read_u64(self._meta_value(txn, MetaKey.FLOOR))
        if new_floor <= floor:
            return 0
        keep = new_floor - 1
        parts = merkle.perfect_subtrees(0, keep)
        hashes = [self._subtree_hash(txn, level, index) for level, index in parts]
        tree_db = self._dbs[Db.TREE]
        for (level, index), node in zip(parts, hashes, strict=True):
            txn.put(layout.tree_key(level, index), node, db=tree_db)
        prev_hash = self._subtree_hash(txn, 0, keep - 1)
        ids_db = self._dbs[Db.BY_RECORD_ID]
        models_db = self._dbs[Db.BY_MODEL_TIME]
        deleted = 0
        for seq in range(floor, new_floor):
            key = u64(seq)
            envelope = txn.get(key, db=self._records)
            if envelope is None:
                continue
            try:
                record = decode_entry_record(decode_envelope(envelope))
            except EnvelopeError as exc:
                raise LogCorruptError(f"seq {seq}: {exc}") from exc
            record_id = record.record_id.encode()
            if txn.get(record_id, db=ids_db) == key:
                txn.delete(record_id, db=ids_db)
            prefix = layout.model_prefix(record.api.model)
            txn.delete(
                layout.model_time_key(prefix, record.request_first_byte_ns, seq), db=models_db
            )
            txn.delete(key, db=self._records)
            deleted += 1
        txn.put(MetaKey.FLOOR.value, u64(new_floor), db=self._meta)
        txn.put(MetaKey.FLOOR_PREV_HASH.value, prev_hash, db=self._meta)
        txn.put(
            MetaKey.FLOOR_FRONTIER.value, merkle.Frontier(keep, hashes).to_bytes(), db=self._meta
        )
        return deleted

    # ----------------------------------------------------------------- close

    def close(self) -> None:
        """Finish queued appends, write a last checkpoint, stop the writer, close the files."""
        if self._closed:
            return
        if self._writer is not None:
            self._writer.close()
        with self._lmdb.gate.exclusive():
            self._closed = True
            self._env.close()
        if self._lock_file is not None:
            self._lock_file.close()

    def __enter__(self) -> Log:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stats(self) -> LogStats:
        """Counters for status reports."""
        with self._read() as txn:
            checkpoints = txn.stat(self._dbs[Db.CHECKPOINTS])["entries"]
            latest = self._checkpoint_size
            if self.readonly:
                with txn.cursor(db=self._dbs[Db.CHECKPOINTS]) as cursor:
                    latest = layout.read_u64(cursor.key()) if cursor.last() else 0
        return LogStats(
            head_seq=self.head().seq,
            retention_floor=self.retention_floor,
            checkpoints=checkpoints,
            last_checkpoint_size=latest,
            map_size=self._env.info()["map_size"],
        )

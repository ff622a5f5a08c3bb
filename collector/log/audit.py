"""Walk a log on disk and name the first thing that is wrong with it (`collector log verify`).

The audit reads the LMDB environment directly, read-only, so that it can
describe damage the `Log` class would refuse to open. It checks, in seq order:
every entry is present from the retention floor to the head, decodes, carries
its own seq, the log's origin and the pinned key id, and links to the entry
before it; every checkpoint is signed by the pinned key and names the Merkle
root of exactly the entries up to its tree size; the stored subtree hashes,
the indexes and the meta (head, frontier) agree with the entries.

When a link breaks between entries k-1 and k, the entry after k decides which
one was altered: if k still links to k+1, k is intact and k-1 changed;
otherwise k itself was replaced or its prev_hash edited.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import lmdb
from google.protobuf.message import DecodeError
from veritap import merkle
from veritap.chain import BrokenLinkError, ChainError, ChainVerifier, CheckpointError
from veritap.envelope import EnvelopeError, decode_envelope, decode_record, entry_hash
from veritap.note import NoteError, open_checkpoint
from veritap.signing import Verifier
from veritap.v1 import log_pb2

from collector.log import layout
from collector.log.layout import Db, MetaKey, u64


@dataclass(frozen=True)
class Problem:
    """The first thing found wrong. `seq` is the entry (or checkpoint tree size) it concerns."""

    seq: int | None
    what: str

    def __str__(self) -> str:
        return self.what if self.seq is None else f"seq {self.seq}: {self.what}"


@dataclass(frozen=True)
class AuditReport:
    origin: str
    floor: int
    head_seq: int
    entries: int
    checkpoints: int
    problem: Problem | None

    @property
    def ok(self) -> bool:
        return self.problem is None


class _FoundError(Exception):
    def __init__(self, problem: Problem) -> None:
        super().__init__(str(problem))
        self.problem = problem


@dataclass(frozen=True)
class _Meta:
    origin: str
    key_id: bytes
    head_seq: int
    head_hash: bytes
    frontier: bytes
    floor: int
    floor_prev_hash: bytes
    floor_frontier: bytes


def _fail(seq: int | None, what: str) -> _FoundError:
    return _FoundError(Problem(seq, what))


def _read_meta(txn: lmdb.Transaction[bytes], db: lmdb._Database) -> _Meta:
    def get(key: MetaKey) -> bytes:
        value = txn.get(key.value, db=db)
        if value is None:
            raise _fail(None, f"meta: key {key.value.decode()!r} is missing")
        return value

    version = int.from_bytes(get(MetaKey.FORMAT), "big")
    if version != layout.FORMAT_VERSION:
        raise _fail(None, f"meta: format version {version} is not {layout.FORMAT_VERSION}")
    try:
        head_seq, head_hash = layout.unpack_head(get(MetaKey.HEAD))
        floor = layout.read_u64(get(MetaKey.FLOOR))
        origin = get(MetaKey.ORIGIN).decode()
    except (ValueError, UnicodeDecodeError) as exc:
        raise _fail(None, f"meta: malformed head, floor or origin: {exc}") from exc
    return _Meta(
        origin=origin,
        key_id=get(MetaKey.KEY_ID),
        head_seq=head_seq,
        head_hash=head_hash,
        frontier=get(MetaKey.FRONTIER),
        floor=floor,
        floor_prev_hash=get(MetaKey.FLOOR_PREV_HASH),
        floor_frontier=get(MetaKey.FLOOR_FRONTIER),
    )


class _Walk:
    def __init__(self, env: lmdb.Environment, txn: lmdb.Transaction[bytes], key: Verifier) -> None:
        self.txn = txn
        self.key = key
        self.dbs = {db: env.open_db(db.value, txn=txn, create=False) for db in Db}
        self.meta = _read_meta(txn, self.dbs[Db.META])
        self.entries = 0
        self.checkpoints = 0
        self._unlinked: tuple[int, log_pb2.Entry] | None = None

    def run(self) -> None:
        meta = self.meta
        if meta.key_id != self.key.key_id:
            raise _fail(
                None,
                f"the log's checkpoint key id is {meta.key_id.hex() or '(none)'}, "
                f"the given public key's is {self.key.key_id.hex()}",
            )
        try:
            start = merkle.Frontier.from_bytes(
                meta.floor_frontier, keep_from_level=layout.TREE_LEVEL
            )
        except merkle.MerkleError as exc:
            raise _fail(None, f"meta: floor frontier: {exc}") from exc
        if start.size != meta.floor - 1 or len(meta.floor_prev_hash) != merkle.HASH_SIZE:
            raise _fail(None, f"meta: floor frontier or hash does not fit floor {meta.floor}")
        chain = ChainVerifier(
            origin=meta.origin,
            verifier=self.key,
            next_seq=meta.floor,
            prev_hash=meta.floor_prev_hash,
            frontier=start,
        )
        checkpoints = self._checkpoints()
        pending = next(checkpoints, None)
        while pending is not None and pending[0] < meta.floor - 1:
            self._check_pruned_checkpoint(*pending)
            pending = next(checkpoints, None)
        if pending is not None and pending[0] == chain.tree_size and pending[0] > 0:
            self._check_checkpoint(chain, *pending)
            pending = next(checkpoints, None)
        for seq, envelope in self._records():
            if seq > meta.head_seq:
                raise _fail(seq, f"entry is stored past the head in meta (seq {meta.head_seq})")
            if seq != chain.next_seq:
                raise _fail(
                    chain.next_seq,
                    f"entry is missing (the next stored entry is seq {seq})",
                )
            self._add(chain, seq, envelope)
            self.entries += 1
            while pending is not None and pending[0] == seq:
                self._check_checkpoint(chain, *pending)
                pending = next(checkpoints, None)
        if chain.tree_size < meta.head_seq:
            raise _fail(
                chain.tree_size + 1,
                f"entry is missing (meta head is seq {meta.head_seq}, the last stored entry "
                f"is seq {chain.tree_size})",
            )
        if chain.head_hash != meta.head_hash:
            raise self._altered(meta.head_seq)
        self._check_linked()
        if chain.frontier.to_bytes() != meta.frontier:
            raise _fail(None, "meta: the stored Merkle frontier is not the entries' frontier")
        if pending is not None:
            raise _fail(pending[0], f"checkpoint is stored past the head (seq {meta.head_seq})")
        self._check_index_counts()

    def _records(self) -> Iterator[tuple[int, bytes]]:
        with self.txn.cursor(db=self.dbs[Db.RECORDS]) as cursor:
            for key, value in cursor:
                if len(key) != 8:
                    raise _fail(None, f"records: key {key.hex()} is not a u64 seq")
                seq = layout.read_u64(key)
                if seq < self.meta.floor:
                    raise _fail(seq, f"entry is below the retention floor {self.meta.floor}")
                yield seq, value

    def _checkpoints(self) -> Iterator[tuple[int, bytes]]:
        with self.txn.cursor(db=self.dbs[Db.CHECKPOINTS]) as cursor:
            for key, value in cursor:
                if len(key) != 8:
                    raise _fail(None, f"checkpoints: key {key.hex()} is not a u64 tree size")
                yield layout.read_u64(key), value

    def _add(self, chain: ChainVerifier, seq: int, envelope: bytes) -> None:
        try:
            entry = chain.add(seq, envelope)
        except BrokenLinkError as exc:
            raise self._blame_link(seq, envelope) from exc
        except ChainError as exc:
            raise _fail(seq, exc.reason) from exc
        # The previous entry's hash is now confirmed by this one's link: its content may be
        # judged (before that, damage to it is reported as the altered entry it is).
        self._check_linked()
        self._unlinked = (seq, entry)
        for level, index, node in chain.frontier.completed:
            if self.txn.get(layout.tree_key(level, index), db=self.dbs[Db.TREE]) != node:
                first = (index << level) + 1
                raise _fail(
                    seq,
                    f"stored subtree hash ({level}, {index}) over seqs {first}.."
                    f"{first + (1 << level) - 1} is missing or wrong",
                )
        chain.frontier.completed.clear()

    def _check_linked(self) -> None:
        """The record and index checks of the entry whose outgoing link was verified."""
        if self._unlinked is None:
            return
        seq, entry = self._unlinked
        self._unlinked = None
        try:
            record = decode_record(entry)
        except EnvelopeError as exc:
            raise _fail(seq, str(exc)) from exc
        stored = self.txn.get(record.record_id.encode(), db=self.dbs[Db.BY_RECORD_ID])
        if stored != u64(seq):
            where = "nothing" if stored is None else f"seq {layout.read_u64(stored)}"
            raise _fail(seq, f"index by_record_id maps {record.record_id!r} to {where}")
        model_key = layout.model_time_key(
            layout.model_prefix(record.api.model), record.request_first_byte_ns, seq
        )
        if self.txn.get(model_key, db=self.dbs[Db.BY_MODEL_TIME]) is None:
            raise _fail(seq, "index by_model_time has no key for this entry")

    def _links_forward(self, seq: int, own_hash: bytes) -> bool:
        """Whether the entry after `seq` (or the head hash in meta) records `own_hash`."""
        if seq == self.meta.head_seq:
            return own_hash == self.meta.head_hash
        following = self.txn.get(u64(seq + 1), db=self.dbs[Db.RECORDS])
        try:
            return following is not None and decode_envelope(following).prev_hash == own_hash
        except EnvelopeError:
            return False

    def _altered(self, seq: int) -> _FoundError:
        if seq == self.meta.head_seq:
            return _fail(seq, "entry was altered: its hash is not the head hash kept in meta")
        return _fail(
            seq, f"entry was altered: its hash is not the prev_hash seq {seq + 1} recorded"
        )

    def _blame_link(self, seq: int, envelope: bytes) -> _FoundError:
        """Entry seq does not link to seq-1: decide which of the two was altered."""
        if not self._links_forward(seq, entry_hash(envelope)):
            return _fail(
                seq,
                "entry was replaced or its prev_hash altered: it links neither to "
                f"seq {seq - 1} nor from seq {seq + 1}",
            )
        if seq == self.meta.floor:
            return _fail(seq, f"prev_hash is not the hash of pruned seq {seq - 1} kept in meta")
        return self._altered(seq - 1)

    def _parse_checkpoint(self, size: int, data: bytes) -> log_pb2.Checkpoint:
        try:
            return log_pb2.Checkpoint.FromString(data)
        except DecodeError as exc:
            raise _fail(size, f"checkpoint does not parse: {exc}") from exc

    def _check_checkpoint(self, chain: ChainVerifier, size: int, data: bytes) -> None:
        checkpoint = self._parse_checkpoint(size, data)
        try:
            chain.check_checkpoint(checkpoint)
        except CheckpointError as exc:
            if size >= self.meta.floor and not self._links_forward(size, chain.head_hash):
                # The last entry under the checkpoint changed, not the checkpoint.
                raise self._altered(size) from exc
            raise _fail(size, f"checkpoint stored for tree size {size}: {exc.reason}") from exc
        self.checkpoints += 1

    def _check_pruned_checkpoint(self, size: int, data: bytes) -> None:
        """Below the floor only the signature, origin and size can be checked."""
        checkpoint = self._parse_checkpoint(size, data)
        try:
            body = open_checkpoint(checkpoint.note, self.key, origin=self.meta.origin)
        except NoteError as exc:
            raise _fail(size, f"checkpoint stored for tree size {size}: {exc}") from exc
        if body.tree_size != size or checkpoint.tree_size != size:
            raise _fail(size, f"checkpoint stored for tree size {size} is for {body.tree_size}")
        self.checkpoints += 1

    def _check_index_counts(self) -> None:
        for db in (Db.BY_RECORD_ID, Db.BY_MODEL_TIME):
            count = self.txn.stat(self.dbs[db])["entries"]
            if count != self.entries:
                raise _fail(
                    None,
                    f"index {db.value.decode()} has {count} keys for {self.entries} entries",
                )


def audit_log(path: Path, key: Verifier) -> AuditReport:
    """Check the whole log at `path` against the pinned public `key`."""
    if not (path / "data.mdb").exists():
        return AuditReport("", 0, 0, 0, 0, Problem(None, f"no log at {path}"))
    # Map more than the file holds: a writer may grow it while the audit runs.
    size = max(2 * (path / "data.mdb").stat().st_size, 1 << 30)
    env = lmdb.open(str(path), readonly=True, max_dbs=layout.MAX_DBS, map_size=size)
    try:
        with env.begin() as txn:
            try:
                walk = _Walk(env, txn, key)
            except lmdb.Error as exc:
                return AuditReport("", 0, 0, 0, 0, Problem(None, f"cannot read the log: {exc}"))
            except _FoundError as found:
                return AuditReport("", 0, 0, 0, 0, found.problem)
            problem = None
            try:
                walk.run()
            except _FoundError as found:
                problem = found.problem
            meta = walk.meta
            return AuditReport(
                meta.origin, meta.floor, meta.head_seq, walk.entries, walk.checkpoints, problem
            )
    finally:
        env.close()

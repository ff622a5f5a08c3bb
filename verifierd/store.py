"""verifierd's LMDB store: intake entries, the work queue, verdicts, settings, audit log.

One LMDB environment with named databases (``ekey`` = origin UTF-8, NUL, seq as
8 bytes big-endian; ``cid`` = commitment id as 32 raw bytes):

=============  ===========================================  ==========================
database       key                                          value
=============  ===========================================  ==========================
entries        ekey                                         entry hash (32) ‖ envelope
cursors        origin                                       seq (8) ‖ hash (32) ‖ checkpoint
inbox          ekey                                         (empty): not yet classified
pending        cid ‖ order (8)                              a packed :class:`PendingItem`
verdicts       ekey                                         SignedVerdict bytes (current)
history        ekey ‖ decided_at_ns (8)                     a superseded SignedVerdict
amendments     origin ‖ NUL ‖ amended record id             AmendmentNote JSON
by_record      record id ‖ NUL ‖ ekey                       (empty)
by_time        decided_at_ns (8) ‖ ekey                     (empty)
counters       name                                         u64
settings       commitment id (hex)                          DifrSettings bytes
audit          at_ns (8) ‖ number (8)                       AuditEvent JSON
alerts         origin                                       at_ns (8) ‖ reason ‖ NUL ‖ evidence
alerts         origin ‖ NUL ‖ cleared_at_ns (8)             a cleared alert (see below)
=============  ===========================================  ==========================

Exactly-once rules, each one transaction: :meth:`Store.ingest` writes entries,
their inbox items and the origin's cursor together, so after a crash intake
resumes from the cursor and nothing is stored twice or lost. :meth:`classify`
moves inbox items to ``pending``, to a terminal verdict, or out as tampered (an
alert, never a verdict); :meth:`finish` writes verdicts and deletes their pending
items.

Amendments: a collector's amendment record (its bytes of earlier records arrived later
in another version) leaves the inbox as an :class:`AmendmentWrite`, in one transaction
with what it changes: its own verdict, an :class:`AmendmentNote` per record it names
(so that a record judged later, even after a restart, is judged amended:
:meth:`Store.amendments_of`), and a :class:`Supersede` for each named record that had a
verdict. Superseding replaces the record's current verdict and keeps the old one, signed
bytes verbatim, in ``history`` (:meth:`Store.verdict_history`); the verdict hooks see
the new verdict with the one it superseded (:attr:`StoredVerdict.previous`).

Authenticated before judged: :meth:`Store.inbox` offers only entries that the
origin's stored checkpoint covers, and none from an origin with an alert in force;
the others wait (:attr:`Counts.awaiting_checkpoint`). The caller re-verifies that
checkpoint and the stored hashes and envelopes before judging
(verifierd.intake.stored_entries), since the disk is not trusted.

An alert stops intake from its origin until an operator clears it. Clearing never
deletes the evidence: :meth:`Store.clear_alert` moves the alert to a key of its own
(origin, NUL, when it was cleared; the value is a u32 length, a JSON header with who
cleared it, why and what the collector showed, then the alert's value verbatim) and
writes the audit event, in one transaction. A verdict is put with
``overwrite=False`` and only while its queue item still exists, so a record
never gets two; only a :class:`Supersede` replaces one, keeping it in the history.

A store of format 1 is upgraded when opened (:meth:`Store._upgrade_from_format_1`):
its queue items name no checkpoint, so they go back to the inbox to be authenticated
again; any other format but this one is refused.

Every transaction goes through :class:`Store`, which grows the map when LMDB
reports it full (waiting for this process's readers to finish first, as LMDB
requires).
"""

from __future__ import annotations

import json
import logging
import struct
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import lmdb
from veritap.lmdb_env import LmdbEnv, MapGrowthError
from veritap.read_gate import MapKeepsGrowingError
from veritap.v1 import log_pb2, verifier_pb2

from verifierd.errors import VerifierdError

log = logging.getLogger(__name__)

T = TypeVar("T")

# 2: a pending item carries the checkpoint that authenticated its entry, and its tag.
_FORMAT_VERSION = b"2"
# Format 1's queue item: attempts, not_before_ns, enqueued_ns, key length; key, error.
_FORMAT_1 = b"1"
_FORMAT_1_PENDING = struct.Struct(">IQQH")
_ZERO_HASH = bytes(32)
_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
_PENDING = struct.Struct(">IQQHQ32s32s")
_DBS = (
    "meta",
    "entries",
    "cursors",
    "inbox",
    "pending",
    "verdicts",
    "by_record",
    "by_time",
    "counters",
    "settings",
    "audit",
    "alerts",
    "history",
    "amendments",
)


#: Named databases the store's environment keeps room for beyond its own (Store.open_db).
SUBSYSTEM_DBS = 16


class StoreError(VerifierdError):
    """The store refused an operation (bad sequence, unknown key, wrong format)."""


class SequenceGapError(StoreError):
    """An ingest batch does not continue the origin's cursor contiguously."""


def ekey(origin: str, seq: int) -> bytes:
    """Key of one log entry: origin, NUL, seq big-endian (sorts by origin, then seq)."""
    return origin.encode() + b"\x00" + _U64.pack(seq)


def split_ekey(key: bytes) -> tuple[str, int]:
    return key[:-9].decode(), _U64.unpack(key[-8:])[0]


@dataclass(frozen=True)
class Cursor:
    """How far intake from one origin got: the last stored seq and its entry hash."""

    seq: int
    hash: bytes
    #: The latest verified checkpoint from that origin, when one was stored.
    checkpoint: log_pb2.Checkpoint | None = None


@dataclass(frozen=True)
class StoredEntry:
    origin: str
    seq: int
    entry_hash: bytes
    #: The log Entry bytes verbatim (empty for an entry received as a hash only).
    envelope: bytes


@dataclass(frozen=True)
class PendingItem:
    """A record selected for recomputation, waiting for its commitment's engine."""

    #: Opaque queue position; pass it back to :meth:`Store.finish`.
    key: bytes
    commitment_id: str
    origin: str
    seq: int
    attempts: int
    not_before_ns: int
    enqueued_ns: int
    last_error: str
    #: The signed checkpoint that authenticated the entry when it was classified.
    checkpoint_tree_size: int = 0
    checkpoint_root_hash: bytes = _ZERO_HASH
    #: The classifier's MAC over the entry hash and that checkpoint (see Enqueue).
    tag: bytes = _ZERO_HASH


@dataclass(frozen=True)
class Enqueue:
    """Classification result: recompute this record with ``commitment_id``'s engine."""

    origin: str
    seq: int
    record_id: str
    commitment_id: str
    #: The signed checkpoint that authenticated the entry (the verdict names it).
    checkpoint_tree_size: int = 0
    checkpoint_root_hash: bytes = _ZERO_HASH
    #: A MAC the classifier keeps over the authenticated entry hash and that checkpoint,
    #: so that scoring can tell an entry edited while it waited (the disk is not trusted).
    tag: bytes = _ZERO_HASH


@dataclass(frozen=True)
class Tampered:
    """Classification result: the stored entry is not the one its collector signed.

    It leaves the inbox without a verdict, and an alert with ``evidence`` (IntakeEvidence
    bytes) stops intake and judging from ``origin``."""

    origin: str
    seq: int
    reason: str
    evidence: bytes


@dataclass(frozen=True)
class VerdictWrite:
    """A terminal verdict to store for (origin, seq)."""

    origin: str
    seq: int
    record_id: str
    signed: verifier_pb2.SignedVerdict
    verdict: verifier_pb2.Verdict


@dataclass(frozen=True)
class Retry:
    """An engine failure: try again at ``not_before_ns``."""

    key: bytes
    not_before_ns: int
    error: str


@dataclass(frozen=True)
class StoredVerdict:
    origin: str
    seq: int
    signed: verifier_pb2.SignedVerdict
    verdict: verifier_pb2.Verdict
    #: The verdict this one superseded (given to verdict hooks and listeners only).
    previous: verifier_pb2.Verdict | None = None


@dataclass(frozen=True)
class AmendmentNote:
    """A collector's amendment of one record: the amendment record, where it is in the
    origin's log, and its reason (which bytes arrived in which versions)."""

    record_id: str
    seq: int
    reason: str

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> AmendmentNote:
        return cls(**json.loads(raw))


@dataclass(frozen=True)
class Supersede:
    """A new verdict for a record that has one: ``previous`` (the current verdict when it
    was built) goes to the history. Refused when the record's verdict is no longer it."""

    previous: StoredVerdict
    write: VerdictWrite


@dataclass(frozen=True)
class AmendmentWrite:
    """Classification result for an amendment record: its own terminal verdict, the
    records it amends, and the new verdicts of those already judged."""

    verdict: VerdictWrite
    amends_record_ids: tuple[str, ...]
    #: The amendment record's quality_reason (which bytes, which versions).
    reason: str
    superseding: tuple[Supersede, ...] = ()

    @property
    def origin(self) -> str:
        return self.verdict.origin

    @property
    def seq(self) -> int:
        return self.verdict.seq


#: Called in the writing transaction with each verdict it puts (Store.add_verdict_hook).
VerdictHook = Callable[[lmdb.Transaction, StoredVerdict], None]


@dataclass(frozen=True)
class Backlog:
    commitment_id: str
    pending: int
    oldest_enqueued_ns: int


@dataclass(frozen=True)
class Alert:
    origin: str
    reason: str
    evidence: bytes
    at_ns: int


@dataclass(frozen=True)
class ClearedAlert:
    """An alert an operator cleared, kept with its evidence."""

    alert: Alert
    cleared_at_ns: int
    #: Who cleared it (the client certificate subject).
    actor: str
    #: The operator's reason.
    why: str
    #: What the collector showed when intake was allowed to resume (one line).
    check: str


class NoAlertError(StoreError):
    """There is no alert to clear for that origin."""


@dataclass(frozen=True)
class AuditEvent:
    at_ns: int
    actor: str
    action: str
    #: What changed (or what was refused), as canonical JSON.
    detail: str


@dataclass(frozen=True)
class Counts:
    entries: int
    inbox: int
    pending: int
    verdicts: int
    #: Of ``inbox``: entries no stored checkpoint covers yet, or from an origin under an alert.
    awaiting_checkpoint: int = 0
    #: Verdicts a later verdict of their record superseded (in the history, not in
    #: ``verdicts`` nor :meth:`Store.verdict_counts`).
    superseded: int = 0


class Store:
    """verifierd's store. Thread-safe; open one per process (LMDB's rule). Other processes
    (`verifierd calibrate --apply`) may open it too: a map they grow is adopted."""

    def __init__(self, env: lmdb.Environment) -> None:
        self._env = env
        self._dbs = {name: env.open_db(name.encode()) for name in _DBS}
        self._lmdb = LmdbEnv(env, name="store")
        self._listeners: list[Callable[[Sequence[StoredVerdict]], None]] = []
        self._verdict_hooks: list[VerdictHook] = []
        self._audit_number = 0

    @classmethod
    def open(cls, path: Path, *, map_size: int = 1 << 30, readonly: bool = False) -> Store:
        if not readonly:
            path.mkdir(parents=True, exist_ok=True)
        env = lmdb.open(
            str(path),
            map_size=map_size,
            max_dbs=len(_DBS) + SUBSYSTEM_DBS,
            readonly=readonly,
            sync=True,
            metasync=True,
        )
        if not readonly:
            env.reader_check()
        store = cls(env)
        if not readonly:
            store._check_format()
        return store

    def close(self) -> None:
        self._lmdb.close()

    def _check_format(self) -> None:
        def check(txn: lmdb.Transaction) -> None:
            meta = self._dbs["meta"]
            found = txn.get(b"format", db=meta)
            last = txn.cursor(db=self._dbs["audit"])
            if last.last():
                self._audit_number = _U64.unpack(last.key()[8:])[0]
            if found == _FORMAT_1:
                self._upgrade_from_format_1(txn)
            elif found not in (None, _FORMAT_VERSION):
                raise StoreError(
                    f"store format {found!r}, this verifierd reads {_FORMAT_VERSION!r}"
                )
            txn.put(b"format", _FORMAT_VERSION, db=meta)

        self._write(check)

    def _upgrade_from_format_1(self, txn: lmdb.Transaction) -> None:
        """Format 1 to 2, in the opening transaction: a format-1 queue item names no
        checkpoint and carries no tag, so each goes back to the inbox, to be authenticated
        against a signed checkpoint and classified again before it is judged; entries,
        verdicts, settings, alerts and the audit log are kept as they are."""
        pending = self._dbs["pending"]
        items = [(bytes(k), bytes(v)) for k, v in txn.cursor(db=pending).iternext()]
        for pkey, value in items:
            klen = _FORMAT_1_PENDING.unpack_from(value)[3]
            key = value[_FORMAT_1_PENDING.size : _FORMAT_1_PENDING.size + klen]
            txn.delete(pkey, db=pending)
            txn.put(key, b"", db=self._dbs["inbox"])
            self._incr(txn, "inbox", 1)
            self._incr(txn, "pending", -1)
            self._incr(txn, f"pending:{pkey[:32].hex()}", -1)
        detail = {"from": "1", "to": _FORMAT_VERSION.decode(), "requeued": len(items)}
        self._audit(txn, "verifierd", "store_upgrade", detail)
        log.warning(
            "store upgraded from format 1: queued entries go back to the inbox, to be "
            "authenticated against a signed checkpoint before they are judged",
            extra=detail,
        )

    # -- transactions -------------------------------------------------------------------

    # Both under the gate; a map grown by another process (`verifierd calibrate --apply`,
    # say) is adopted first, and a full map is grown (veritap.lmdb_env).

    def _write(self, body: Callable[[lmdb.Transaction], T]) -> T:
        try:
            return self._lmdb.write(body)
        except (MapKeepsGrowingError, MapGrowthError) as exc:
            raise StoreError(str(exc)) from exc

    @contextmanager
    def _read(self) -> Iterator[lmdb.Transaction]:
        try:
            with self._lmdb.read() as txn:
                yield txn
        except MapKeepsGrowingError as exc:
            raise StoreError(str(exc)) from exc

    def _incr(self, txn: lmdb.Transaction, name: str, delta: int) -> None:
        db = self._dbs["counters"]
        raw = txn.get(name.encode(), db=db)
        value = (_U64.unpack(raw)[0] if raw else 0) + delta
        if value < 0:
            raise StoreError(f"counter {name} would go negative")
        txn.put(name.encode(), _U64.pack(value), db=db)

    def _counter(self, txn: lmdb.Transaction, name: str) -> int:
        raw = txn.get(name.encode(), db=self._dbs["counters"])
        return _U64.unpack(raw)[0] if raw else 0

    # -- intake -------------------------------------------------------------------------

    def ingest(
        self,
        origin: str,
        entries: Sequence[tuple[int, bytes, bytes]],
        *,
        checkpoint: log_pb2.Checkpoint | None = None,
    ) -> None:
        """Store (seq, envelope, entry hash) entries continuing ``origin``'s cursor, queue
        them for classification and advance the cursor, all in one transaction.

        An empty envelope is an entry received as its hash only (filtered out by model):
        it advances the cursor but is not queued. ``checkpoint`` (already verified by the
        caller) replaces the stored one; its tree size may not exceed the new cursor.
        """
        if not origin or "\x00" in origin:
            raise StoreError(f"bad origin {origin!r}")

        def body(txn: lmdb.Transaction) -> None:
            cursor = self._cursor(txn, origin)
            seq = cursor.seq
            seqs = [entry[0] for entry in entries]
            if seqs != list(range(seq + 1, seq + 1 + len(seqs))) or any(
                len(entry[2]) != 32 for entry in entries
            ):
                _refuse_batch(origin, seq, entries)
            prefix = origin.encode() + b"\x00"
            pack = _U64.pack
            keys = [prefix + pack(entry_seq) for entry_seq in seqs]
            entries_db, inbox_db = self._dbs["entries"], self._dbs["inbox"]
            if keys:
                # Nothing past the cursor may exist yet: one seek proves it for the batch.
                cur = txn.cursor(db=entries_db)
                if cur.set_range(keys[0]) and bytes(cur.key()) <= keys[-1]:
                    raise StoreError(f"{origin}/{split_ekey(bytes(cur.key()))[1]} already stored")
                stored = cur.putmulti(
                    [
                        (key, h + envelope)
                        for key, (_, envelope, h) in zip(keys, entries, strict=True)
                    ],
                    overwrite=False,
                )
                if stored != (len(keys), len(keys)):
                    raise StoreError(f"{origin}: entries past seq {seq} already stored")
            queued = [key for key, entry in zip(keys, entries, strict=True) if entry[1]]
            if queued:
                txn.cursor(db=inbox_db).putmulti([(key, b"") for key in queued])
            if entries:
                seq, last_hash = seqs[-1], entries[-1][2]
            else:
                last_hash = cursor.hash
            self._incr(txn, "inbox", len(queued))
            self._incr(txn, "entries", len(entries))
            kept = cursor.checkpoint
            if checkpoint is not None:
                if checkpoint.tree_size > seq:
                    raise StoreError(
                        f"{origin}: checkpoint of size {checkpoint.tree_size} past seq {seq}"
                    )
                kept = checkpoint
            value = _U64.pack(seq) + last_hash + (kept.SerializeToString() if kept else b"")
            txn.put(origin.encode(), value, db=self._dbs["cursors"])

        self._write(body)

    def _cursor(self, txn: lmdb.Transaction, origin: str) -> Cursor:
        raw = txn.get(origin.encode(), db=self._dbs["cursors"])
        if raw is None:
            return Cursor(0, _ZERO_HASH)
        checkpoint = None
        if len(raw) > 40:
            checkpoint = log_pb2.Checkpoint.FromString(bytes(raw[40:]))
        return Cursor(_U64.unpack(raw[:8])[0], bytes(raw[8:40]), checkpoint)

    def cursor(self, origin: str) -> Cursor:
        """The origin's cursor; seq 0 and 32 zero bytes when nothing came from it yet."""
        with self._read() as txn:
            return self._cursor(txn, origin)

    def origins(self) -> list[str]:
        with self._read() as txn:
            return [
                bytes(k).decode()
                for k in txn.cursor(db=self._dbs["cursors"]).iternext(values=False)
            ]

    def entry(self, origin: str, seq: int) -> StoredEntry | None:
        with self._read() as txn:
            raw = txn.get(ekey(origin, seq), db=self._dbs["entries"])
        if raw is None:
            return None
        return StoredEntry(origin, seq, bytes(raw[:32]), bytes(raw[32:]))

    def set_alert(self, origin: str, reason: str, evidence: bytes) -> None:
        """Record why intake from ``origin`` stopped (fork, gap, bad signature) with the
        evidence; replaces an earlier alert for that origin."""
        value = _alert_value(reason, evidence)
        self._write(lambda txn: txn.put(origin.encode(), value, db=self._dbs["alerts"]))

    def alerts(self) -> list[Alert]:
        """The alerts in force (not cleared), by origin."""
        with self._read() as txn:
            items = list(txn.cursor(db=self._dbs["alerts"]).iternext())
        return [_alert(bytes(k).decode(), bytes(v)) for k, v in items if b"\x00" not in k]

    def clear_alert(self, origin: str, *, actor: str, why: str, check: str) -> ClearedAlert:
        """Lift ``origin``'s alert: keep it (evidence and all) as a cleared alert saying
        who cleared it, why, and what the collector showed, and write the audit event, in
        one transaction. Raises NoAlertError when the origin has no alert in force."""
        alerts = self._dbs["alerts"]

        def body(txn: lmdb.Transaction) -> ClearedAlert:
            raw = txn.get(origin.encode(), db=alerts)
            if raw is None:
                raise NoAlertError(f"no alert in force for {origin!r}")
            cleared = ClearedAlert(_alert(origin, bytes(raw)), time.time_ns(), actor, why, check)
            header = json.dumps({"actor": actor, "why": why, "check": check}).encode()
            key = origin.encode() + b"\x00" + _U64.pack(cleared.cleared_at_ns)
            value = _U32.pack(len(header)) + header + bytes(raw)
            txn.put(key, value, overwrite=False, db=alerts)
            txn.delete(origin.encode(), db=alerts)
            self._audit(
                txn,
                actor,
                "clear_intake_alert",
                {
                    "origin": origin,
                    "alert_reason": cleared.alert.reason,
                    "alert_at_ns": cleared.alert.at_ns,
                    "why": why,
                    "check": check,
                },
            )
            return cleared

        return self._write(body)

    def cleared_alerts(self) -> list[ClearedAlert]:
        """Every cleared alert, by origin, oldest first."""
        with self._read() as txn:
            items = list(txn.cursor(db=self._dbs["alerts"]).iternext())
        out = []
        for key, value in items:
            origin, nul, at = bytes(key).partition(b"\x00")
            if not nul:
                continue
            (size,) = _U32.unpack_from(value)
            header = json.loads(bytes(value[4 : 4 + size]))
            out.append(
                ClearedAlert(
                    _alert(origin.decode(), bytes(value[4 + size :])),
                    _U64.unpack(at)[0],
                    header["actor"],
                    header["why"],
                    header["check"],
                )
            )
        return out

    # -- classification -----------------------------------------------------------------

    def inbox(self, limit: int, *, origins: Collection[str] | None = None) -> list[StoredEntry]:
        """Up to ``limit`` entries waiting for classification that their origin's stored
        checkpoint covers, by origin then seq; none from an origin with an alert in force,
        nor (when given) from one not in ``origins``."""
        out: list[StoredEntry] = []
        with self._read() as txn:
            entries = self._dbs["entries"]
            judgeable: dict[str, int] = {}
            cur = txn.cursor(db=self._dbs["inbox"])
            found = cur.first()
            while found and len(out) < limit:
                key = bytes(cur.key())
                origin, seq = split_ekey(key)
                if origin not in judgeable:
                    wanted = origins is None or origin in origins
                    judgeable[origin] = self._judgeable_size(txn, origin) if wanted else 0
                if seq > judgeable[origin]:
                    found = cur.set_range(origin.encode() + b"\x01")  # the next origin
                    continue
                raw = _must(txn, key, entries)
                out.append(StoredEntry(origin, seq, bytes(raw[:32]), bytes(raw[32:])))
                found = cur.next()
        return out

    def _judgeable_size(self, txn: lmdb.Transaction, origin: str) -> int:
        """How far ``origin``'s entries may be judged: the size of its stored checkpoint,
        0 while an alert is in force for it."""
        if txn.get(origin.encode(), db=self._dbs["alerts"]) is not None:
            return 0
        checkpoint = self._cursor(txn, origin).checkpoint
        return 0 if checkpoint is None else checkpoint.tree_size

    def _awaiting_checkpoint(self, txn: lmdb.Transaction) -> int:
        """Inbox entries past what :meth:`inbox` offers, over every origin."""
        waiting = 0
        cur = txn.cursor(db=self._dbs["inbox"])
        for raw in txn.cursor(db=self._dbs["cursors"]).iternext(values=False):
            origin = bytes(raw).decode()
            prefix = origin.encode() + b"\x00"
            found = cur.set_range(ekey(origin, self._judgeable_size(txn, origin) + 1))
            while found and bytes(cur.key()).startswith(prefix):
                waiting += 1
                found = cur.next()
        return waiting

    def leaf_hashes(self, origin: str, first: int, last: int) -> list[tuple[bytes, bool]]:
        """(entry hash, whether its envelope is stored) of ``origin``'s seqs first..last,
        read in one transaction. Raises StoreError when one is missing."""
        out: list[tuple[bytes, bool]] = []
        if last < first:
            return out
        with self._read() as txn:
            cur = txn.cursor(db=self._dbs["entries"])
            found = cur.set_range(ekey(origin, first))
            for seq in range(first, last + 1):
                if not found or bytes(cur.key()) != ekey(origin, seq):
                    raise StoreError(f"{origin}/{seq}: stored entry missing")
                value = cur.value()
                out.append((bytes(value[:32]), len(value) > 32))
                found = cur.next()
        return out

    def classify(self, items: Sequence[Enqueue | VerdictWrite | AmendmentWrite | Tampered]) -> None:
        """Take classified entries out of the inbox: queue them for an engine, store
        their terminal verdict (an amendment's with what it amends), or set a tampered
        one aside with its alert. Items no longer in the inbox are ignored."""
        now = time.time_ns()
        written: list[StoredVerdict] = []

        def body(txn: lmdb.Transaction) -> None:
            written.clear()
            order = self._counter(txn, "order")
            for item in items:
                key = ekey(item.origin, item.seq)
                if not txn.delete(key, db=self._dbs["inbox"]):
                    continue
                self._incr(txn, "inbox", -1)
                if isinstance(item, Tampered):
                    self._put_tampered(txn, item)
                    continue
                if isinstance(item, AmendmentWrite):
                    written.extend(self._amend(txn, key, item))
                    continue
                self._index_record(txn, item.record_id, key)
                if isinstance(item, Enqueue):
                    order += 1
                    pkey = bytes.fromhex(item.commitment_id) + _U64.pack(order)
                    value = _pack_pending(
                        key,
                        attempts=0,
                        not_before_ns=0,
                        enqueued_ns=now,
                        error="",
                        checkpoint=(item.checkpoint_tree_size, item.checkpoint_root_hash, item.tag),
                    )
                    txn.put(pkey, value, db=self._dbs["pending"])
                    self._incr(txn, "pending", 1)
                    self._incr(txn, f"pending:{item.commitment_id}", 1)
                elif self._put_verdict(txn, key, item):
                    written.append(StoredVerdict(item.origin, item.seq, item.signed, item.verdict))
            txn.put(b"order", _U64.pack(order), db=self._dbs["counters"])

        self._write(body)
        self._notify(written)

    def _put_tampered(self, txn: lmdb.Transaction, item: Tampered) -> None:
        txn.put(
            item.origin.encode(), _alert_value(item.reason, item.evidence), db=self._dbs["alerts"]
        )
        log.error(
            "stored entry is not the one its collector signed: set aside, no verdict",
            extra={"origin": item.origin, "seq": item.seq, "reason": item.reason},
        )

    def set_aside_pending(self, key: bytes, item: Tampered) -> bool:
        """Take a pending item out of the queue without a verdict, because its stored entry
        is not the one its collector signed, and set the alert; False when already gone."""

        def body(txn: lmdb.Transaction) -> bool:
            if not txn.delete(key, db=self._dbs["pending"]):
                return False
            self._incr(txn, "pending", -1)
            self._incr(txn, f"pending:{bytes(key[:32]).hex()}", -1)
            self._put_tampered(txn, item)
            return True

        return self._write(body)

    def _index_record(self, txn: lmdb.Transaction, record_id: str, key: bytes) -> None:
        if record_id:
            txn.put(record_id.encode() + b"\x00" + key, b"", db=self._dbs["by_record"])

    def _put_verdict(self, txn: lmdb.Transaction, key: bytes, item: VerdictWrite) -> bool:
        data = item.signed.SerializeToString()
        if not txn.put(key, data, overwrite=False, db=self._dbs["verdicts"]):
            log.error("second verdict refused", extra={"origin": item.origin, "seq": item.seq})
            return False
        self._incr(txn, "verdicts", 1)
        self._index_verdict(
            txn, key, StoredVerdict(item.origin, item.seq, item.signed, item.verdict)
        )
        return True

    def _index_verdict(self, txn: lmdb.Transaction, key: bytes, stored: StoredVerdict) -> None:
        """A verdict just put at ``key``: its time index, its status count, the hooks."""
        txn.put(_U64.pack(stored.verdict.decided_at_ns) + key, b"", db=self._dbs["by_time"])
        self._incr(txn, f"status:{verifier_pb2.VerdictStatus.Name(stored.verdict.status)}", 1)
        for hook in self._verdict_hooks:
            hook(txn, stored)

    def _amend(
        self, txn: lmdb.Transaction, key: bytes, item: AmendmentWrite
    ) -> list[StoredVerdict]:
        """An amendment record's verdict, its notes and the verdicts it supersedes."""
        own = item.verdict
        self._index_record(txn, own.record_id, key)
        written = []
        if self._put_verdict(txn, key, own):
            written.append(StoredVerdict(own.origin, own.seq, own.signed, own.verdict))
        note = AmendmentNote(own.record_id, own.seq, item.reason).to_json()
        for amended in item.amends_record_ids:
            txn.put(
                _amendment_key(own.origin, amended),
                note,
                overwrite=False,
                db=self._dbs["amendments"],
            )
        for superseding in item.superseding:
            stored = self._supersede(txn, superseding)
            if stored is not None:
                written.append(stored)
        return written

    def _supersede(self, txn: lmdb.Transaction, item: Supersede) -> StoredVerdict | None:
        write, previous = item.write, item.previous.verdict
        key = ekey(write.origin, write.seq)
        raw = txn.get(key, db=self._dbs["verdicts"])
        if raw is None or verifier_pb2.SignedVerdict.FromString(bytes(raw)) != item.previous.signed:
            log.error(
                "verdict to supersede is not the record's current one: left as it is",
                extra={"origin": write.origin, "seq": write.seq, "record_id": write.record_id},
            )
            return None
        history_key = key + _U64.pack(previous.decided_at_ns)
        txn.put(history_key, bytes(raw), overwrite=False, db=self._dbs["history"])
        txn.delete(_U64.pack(previous.decided_at_ns) + key, db=self._dbs["by_time"])
        self._incr(txn, f"status:{verifier_pb2.VerdictStatus.Name(previous.status)}", -1)
        txn.put(key, write.signed.SerializeToString(), db=self._dbs["verdicts"])
        stored = StoredVerdict(write.origin, write.seq, write.signed, write.verdict, previous)
        self._index_verdict(txn, key, stored)
        return stored

    def amendments_of(
        self, records: Iterable[tuple[str, str]]
    ) -> dict[tuple[str, str], AmendmentNote]:
        """The collector's amendments of the (origin, record id) ``records`` that have one
        classified (the first, when there were several), read in one transaction."""
        db = self._dbs["amendments"]
        out = {}
        with self._read() as txn:
            for origin, record_id in records:
                raw = txn.get(_amendment_key(origin, record_id), db=db)
                if raw is not None:
                    out[(origin, record_id)] = AmendmentNote.from_json(bytes(raw))
        return out

    def verdict_history(self, origin: str, seq: int) -> list[StoredVerdict]:
        """The verdicts of (origin, seq) that later ones superseded, oldest first."""
        prefix = ekey(origin, seq)
        out = []
        with self._read() as txn:
            cur = txn.cursor(db=self._dbs["history"])
            if cur.set_range(prefix):
                for key, value in cur.iternext():
                    if not bytes(key).startswith(prefix) or len(key) != len(prefix) + 8:
                        break
                    out.append(_stored_verdict(origin, seq, bytes(value)))
        return out

    # -- the engine queue ---------------------------------------------------------------

    def backlog(self) -> list[Backlog]:
        """Pending work per commitment (the queue is FIFO, so its first item is the oldest)."""
        out = []
        with self._read() as txn:
            cur = txn.cursor(db=self._dbs["pending"])
            found = cur.first()
            while found:
                item = _unpack_pending(bytes(cur.key()), bytes(cur.value()))
                pending = self._counter(txn, f"pending:{item.commitment_id}")
                out.append(Backlog(item.commitment_id, pending, item.enqueued_ns))
                found = cur.set_range(bytes(cur.key()[:32]) + b"\xff" * 9)
        return out

    def take_pending(self, commitment_id: str, limit: int, now_ns: int) -> list[PendingItem]:
        """Up to ``limit`` items of a commitment that may run at ``now_ns``, oldest first.
        Reading does not remove them: :meth:`finish` does, with their verdicts."""
        prefix = bytes.fromhex(commitment_id)
        out: list[PendingItem] = []
        with self._read() as txn:
            cur = txn.cursor(db=self._dbs["pending"])
            if not cur.set_range(prefix):
                return []
            for key, value in cur.iternext():
                if bytes(key[:32]) != prefix or len(out) >= limit:
                    break
                item = _unpack_pending(bytes(key), bytes(value))
                if item.not_before_ns <= now_ns:
                    out.append(item)
        return out

    def pending_item(self, key: bytes) -> PendingItem | None:
        with self._read() as txn:
            value = txn.get(key, db=self._dbs["pending"])
        return None if value is None else _unpack_pending(key, bytes(value))

    def finish(
        self, verdicts: Sequence[tuple[bytes, VerdictWrite]], retries: Sequence[Retry] = ()
    ) -> int:
        """In one transaction: store each (pending key, verdict) and delete the pending
        item, and reschedule ``retries``. Items already gone are skipped (their verdict
        exists). Returns how many verdicts were written."""
        written: list[StoredVerdict] = []

        def body(txn: lmdb.Transaction) -> None:
            written.clear()
            pending = self._dbs["pending"]
            for pkey, item in verdicts:
                if not txn.delete(pkey, db=pending):
                    continue
                self._incr(txn, "pending", -1)
                self._incr(txn, f"pending:{bytes(pkey[:32]).hex()}", -1)
                if self._put_verdict(txn, ekey(item.origin, item.seq), item):
                    written.append(StoredVerdict(item.origin, item.seq, item.signed, item.verdict))
            for retry in retries:
                value = txn.get(retry.key, db=pending)
                if value is None:
                    continue
                old = _unpack_pending(retry.key, bytes(value))
                packed = _pack_pending(
                    ekey(old.origin, old.seq),
                    attempts=old.attempts + 1,
                    not_before_ns=retry.not_before_ns,
                    enqueued_ns=old.enqueued_ns,
                    error=retry.error,
                    checkpoint=(old.checkpoint_tree_size, old.checkpoint_root_hash, old.tag),
                )
                txn.put(retry.key, packed, db=pending)

        self._write(body)
        self._notify(written)
        return len(written)

    # -- verdict queries ----------------------------------------------------------------

    def add_verdict_listener(self, listener: Callable[[Sequence[StoredVerdict]], None]) -> None:
        """Call ``listener`` (in the writing thread) with each batch of new verdicts,
        after its transaction committed."""
        self._listeners.append(listener)

    def add_verdict_hook(self, hook: VerdictHook) -> None:
        """Call ``hook`` inside the transaction that writes each verdict, right after it is
        put, so a subsystem's own tables change with it or not at all (verifierd.provers).
        Add hooks before anything writes verdicts."""
        self._verdict_hooks.append(hook)

    # -- a subsystem's own tables in this environment (verifierd.provers) ---------------

    def open_db(self, name: str) -> Any:
        """A named database of a subsystem's own (at most SUBSYSTEM_DBS in all)."""
        if name in _DBS:
            raise StoreError(f"database {name!r} is the store's own")
        return self._env.open_db(name.encode())

    def write_transaction(self, body: Callable[[lmdb.Transaction], T]) -> T:
        """Run ``body`` in one write transaction (rerun when the map had to grow)."""
        return self._write(body)

    @contextmanager
    def read_transaction(self) -> Iterator[lmdb.Transaction]:
        with self._read() as txn:
            yield txn

    def entry_in(self, txn: lmdb.Transaction, origin: str, seq: int) -> StoredEntry | None:
        """:meth:`entry` inside the caller's transaction."""
        raw = txn.get(ekey(origin, seq), db=self._dbs["entries"])
        return None if raw is None else StoredEntry(origin, seq, bytes(raw[:32]), bytes(raw[32:]))

    def audit_in(
        self, txn: lmdb.Transaction, actor: str, action: str, detail: Mapping[str, Any]
    ) -> None:
        """Write an audit event in the caller's transaction, with the change it audits."""
        self._audit(txn, actor, action, detail)

    def _notify(self, written: Sequence[StoredVerdict]) -> None:
        if written:
            for listener in self._listeners:
                listener(written)

    def verdict(self, origin: str, seq: int) -> StoredVerdict | None:
        with self._read() as txn:
            raw = txn.get(ekey(origin, seq), db=self._dbs["verdicts"])
        return None if raw is None else _stored_verdict(origin, seq, bytes(raw))

    def verdicts_for_record(self, record_id: str) -> list[StoredVerdict]:
        """Verdicts of the record(s) with this id (one per origin that sent it)."""
        prefix = record_id.encode() + b"\x00"
        out = []
        with self._read() as txn:
            cur = txn.cursor(db=self._dbs["by_record"])
            if cur.set_range(prefix):
                for key in cur.iternext(values=False):
                    if not bytes(key).startswith(prefix):
                        break
                    origin, seq = split_ekey(bytes(key[len(prefix) :]))
                    raw = txn.get(bytes(key[len(prefix) :]), db=self._dbs["verdicts"])
                    if raw is not None:
                        out.append(_stored_verdict(origin, seq, bytes(raw)))
        return out

    def record_location(self, record_id: str) -> tuple[str, int] | None:
        """(origin, seq) of a classified record with this id."""
        prefix = record_id.encode() + b"\x00"
        with self._read() as txn:
            cur = txn.cursor(db=self._dbs["by_record"])
            if cur.set_range(prefix) and bytes(cur.key()).startswith(prefix):
                return split_ekey(bytes(cur.key()[len(prefix) :]))
        return None

    def list_verdicts(
        self,
        *,
        from_ns: int = 0,
        to_ns: int = (1 << 64) - 1,
        after: bytes = b"",
        limit: int = 100,
        accept: Callable[[verifier_pb2.Verdict], bool] = lambda _: True,
    ) -> tuple[list[StoredVerdict], bytes]:
        """Verdicts decided in [from_ns, to_ns] in decision order that ``accept`` keeps,
        at most ``limit``, resuming after the page token ``after``; returns them and the
        next page token (b"" at the end)."""
        start = max(_U64.pack(from_ns), after + b"\x00" if after else b"")
        out: list[StoredVerdict] = []
        with self._read() as txn:
            cur = txn.cursor(db=self._dbs["by_time"])
            if not cur.set_range(start):
                return [], b""
            for key in cur.iternext(values=False):
                tkey = bytes(key)
                if _U64.unpack(tkey[:8])[0] > to_ns:
                    return out, b""
                if len(out) >= limit:
                    return out, after
                origin, seq = split_ekey(tkey[8:])
                raw = _must(txn, tkey[8:], self._dbs["verdicts"])
                stored = _stored_verdict(origin, seq, raw)
                after = tkey
                if accept(stored.verdict):
                    out.append(stored)
        return out, b""

    def verdict_counts(self) -> dict[str, int]:
        """Each record's current verdict by status name (VERDICT_STATUS_PASS, ...): a
        superseding verdict moves its record from the status it supersedes."""
        with self._read() as txn:
            out = {}
            for name in verifier_pb2.VerdictStatus.keys():  # noqa: SIM118 (an enum wrapper)
                n = self._counter(txn, f"status:{name}")
                if n:
                    out[name] = n
            return out

    def counts(self) -> Counts:
        with self._read() as txn:
            return Counts(
                entries=self._counter(txn, "entries"),
                inbox=self._counter(txn, "inbox"),
                pending=self._counter(txn, "pending"),
                verdicts=self._counter(txn, "verdicts"),
                awaiting_checkpoint=self._awaiting_checkpoint(txn),
                superseded=txn.stat(self._dbs["history"])["entries"],
            )

    # -- settings and audit -------------------------------------------------------------

    def difr_override(self, commitment_id: str) -> verifier_pb2.DifrSettings | None:
        with self._read() as txn:
            raw = txn.get(commitment_id.encode(), db=self._dbs["settings"])
        return None if raw is None else verifier_pb2.DifrSettings.FromString(bytes(raw))

    def set_difr_override(
        self, commitment_id: str, settings: verifier_pb2.DifrSettings, *, actor: str
    ) -> verifier_pb2.DifrSettings | None:
        """Replace a commitment's DiFR settings (threshold, Δmax, sample rate, logprobs
        tolerance) and write the change to the audit log in the same transaction;
        returns the previous override."""

        def body(txn: lmdb.Transaction) -> verifier_pb2.DifrSettings | None:
            raw = txn.get(commitment_id.encode(), db=self._dbs["settings"])
            previous = None if raw is None else verifier_pb2.DifrSettings.FromString(bytes(raw))
            txn.put(commitment_id.encode(), settings.SerializeToString(), db=self._dbs["settings"])
            self._audit(
                txn,
                actor,
                "set_difr_settings",
                {
                    "commitment_id": commitment_id,
                    "previous": _settings_json(previous),
                    "current": _settings_json(settings),
                },
            )
            return previous

        return self._write(body)

    def _audit(
        self, txn: lmdb.Transaction, actor: str, action: str, detail: Mapping[str, Any]
    ) -> None:
        self._audit_number += 1
        event = AuditEvent(time.time_ns(), actor, action, json.dumps(detail, sort_keys=True))
        key = _U64.pack(event.at_ns) + _U64.pack(self._audit_number)
        txn.put(key, json.dumps(asdict(event), sort_keys=True).encode(), db=self._dbs["audit"])

    def audit(self, actor: str, action: str, detail: Mapping[str, Any]) -> None:
        """Write one audit event that comes with no change (e.g. a refused request)."""
        self._write(lambda txn: self._audit(txn, actor, action, detail))

    def audit_log(self) -> list[AuditEvent]:
        with self._read() as txn:
            values = [bytes(v) for v in txn.cursor(db=self._dbs["audit"]).iternext(keys=False)]
        return [AuditEvent(**json.loads(v)) for v in values]


def _alert_value(reason: str, evidence: bytes) -> bytes:
    if "\x00" in reason:
        raise StoreError("alert reason may not contain NUL")
    return _U64.pack(time.time_ns()) + reason.encode() + b"\x00" + evidence


def _alert(origin: str, value: bytes) -> Alert:
    reason, _, evidence = value[8:].partition(b"\x00")
    return Alert(origin, reason.decode(), evidence, _U64.unpack(value[:8])[0])


def _settings_json(settings: verifier_pb2.DifrSettings | None) -> dict[str, float] | None:
    """The settings as the audit log states them (a logprobs tolerance when they name one)."""
    if settings is None:
        return None
    stated = {
        "threshold": settings.threshold,
        "delta_max": settings.delta_max,
        "sample_rate": settings.sample_rate,
    }
    if settings.HasField("logprobs_tolerance"):
        stated["logprobs_tolerance"] = settings.logprobs_tolerance
    return stated


def _refuse_batch(origin: str, seq: int, entries: Sequence[tuple[int, bytes, bytes]]) -> None:
    """Raise the error for the first entry of a batch that does not continue ``seq``."""
    for entry_seq, _, entry_hash in entries:
        if entry_seq != seq + 1:
            raise SequenceGapError(f"{origin}: got seq {entry_seq} after {seq}")
        if len(entry_hash) != 32:
            raise StoreError(f"{origin}/{entry_seq}: entry hash must be 32 bytes")
        seq = entry_seq


def _amendment_key(origin: str, record_id: str) -> bytes:
    return origin.encode() + b"\x00" + record_id.encode()


def _must(txn: lmdb.Transaction, key: bytes, db: Any) -> bytes:
    """A value an index promises exists; its absence means the store is corrupt."""
    raw = txn.get(key, db=db)
    if raw is None:
        raise StoreError(f"store inconsistent: {key!r} indexed but missing")
    return bytes(raw)


def _pack_pending(
    key: bytes,
    *,
    attempts: int,
    not_before_ns: int,
    enqueued_ns: int,
    error: str,
    checkpoint: tuple[int, bytes, bytes],
) -> bytes:
    """``checkpoint``: the authenticating checkpoint's tree size and root, and the tag."""
    fixed = _PENDING.pack(attempts, not_before_ns, enqueued_ns, len(key), *checkpoint)
    return fixed + key + error.encode()


def _unpack_pending(pkey: bytes, value: bytes) -> PendingItem:
    attempts, not_before, enqueued, klen, checkpoint_size, checkpoint_root, tag = (
        _PENDING.unpack_from(value)
    )
    start = _PENDING.size
    origin, seq = split_ekey(value[start : start + klen])
    return PendingItem(
        key=pkey,
        commitment_id=pkey[:32].hex(),
        origin=origin,
        seq=seq,
        attempts=attempts,
        not_before_ns=not_before,
        enqueued_ns=enqueued,
        last_error=value[start + klen :].decode(),
        checkpoint_tree_size=checkpoint_size,
        checkpoint_root_hash=checkpoint_root,
        tag=tag,
    )


def _stored_verdict(origin: str, seq: int, raw: bytes) -> StoredVerdict:
    signed = verifier_pb2.SignedVerdict.FromString(raw)
    return StoredVerdict(origin, seq, signed, verifier_pb2.Verdict.FromString(signed.verdict))

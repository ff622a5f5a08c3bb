"""The provers' tables in verifierd's LMDB store, and the hook that keeps them.

Named databases of their own in the store's environment (``pkey`` = a
:class:`ProverKey`'s bytes):

==================  ====================================  ==================================
database            key                                   value
==================  ====================================  ==================================
provers             pkey                                  summary JSON (first and last seen,
                                                          commitments, test states and
                                                          their numbers j, the record ids
                                                          that drove them)
prover_tallies      pkey ‖ window_s (4) ‖ bucket (8)      Tally JSON; window 0 bucket 0:
                                                          since first seen
prover_evidence     pkey ‖ slot (4)                       at_ns (8) ‖ ln E (8) ‖ tokens (8)
                                                          ‖ commitment id
prover_alarms       alarm id (16)                         AlarmState bytes
prover_alarm_slots  AlarmSlot bytes                       alarm id (16): the one in force
honest_tails        commitment id (hex)                   HonestTails JSON
==================  ====================================  ==================================

The store calls :meth:`ProverTables._on_verdict` inside the transaction that puts each
verdict, so a verdict, its prover's statistics, test state and any alarm it raises are
committed together or not at all: a crash can neither lose nor double-count one. Alarms
raised are published to listeners only after that transaction commits.

A verdict that supersedes another (the collector amended the record) first withdraws the
one it supersedes: out of the tallies of its buckets (those not yet pruned) and of the
since-first-seen tally, and its response's exceedances out of the sequential test, the
response staying pooled as one that did not exceed (:func:`sequential.withdraw` says why
that, and not dropping it, is sound); then it counts like any verdict. An amendment
record's own verdict (reason ``amendment``) is not a response and counts for nothing.

The false-alarm probability is per prover, not per commitment: each test a prover starts
(first sight of a commitment, a clear, a restart) takes the next number j in its summary
and runs at ``alpha_share(j)`` of ``[provers] false_alarm_per_day``
(:mod:`verifierd.provers.sequential` has the bound). A summary stored before shares gives
its tests the next numbers in order of their start as it is read.
"""

from __future__ import annotations

import json
import logging
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace

import lmdb
from veritap.signing import Signer
from veritap.v1 import verifier_pb2

from appliance.journal import MessageId
from verifierd.config import HIDING_REASONS, ProversConfig
from verifierd.errors import VerifierdError
from verifierd.provers import sequential
from verifierd.provers.alarms import (
    AlarmKind,
    AlarmSlot,
    hiding_breaches,
    new_alarm,
    sign_alarm,
)
from verifierd.provers.honest_tails import DB_NAME as HONEST_TAILS_DB
from verifierd.provers.honest_tails import decode_tails, store_honest_tails
from verifierd.provers.identity import ProverKey, prover_of_envelope
from verifierd.provers.sequential import HonestTails, SequentialState, SequentialTest
from verifierd.provers.tally import Tally, verdict_margins
from verifierd.provers.windows import Window
from verifierd.store import Store, StoredVerdict
from verifierd.verdicts import Reason

log = logging.getLogger(__name__)

_DBS = (
    "provers",
    "prover_tallies",
    "prover_evidence",
    "prover_alarms",
    "prover_alarm_slots",
    HONEST_TAILS_DB,
)
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_POINT = struct.Struct(">QdQ")
_UNVERIFIABLE = verifier_pb2.VERDICT_STATUS_UNVERIFIABLE

AlarmListener = Callable[[Sequence[verifier_pb2.AlarmState]], None]


class NoSuchAlarmError(VerifierdError):
    """No alarm with that id is in force."""


@dataclass
class _Summary:
    """A prover's own record, read and written within one transaction."""

    first_ns: int
    last_ns: int
    commitments: list[str] = field(default_factory=list)
    #: Commitment id -> its sequential test's state (JSON).
    tests: dict[str, str] = field(default_factory=dict)
    #: Commitment id -> the number j of its current test among the prover's tests, in
    #: order of start; the test runs at the share `sequential.alpha_share(j)` of alpha.
    shares: dict[str, int] = field(default_factory=dict)
    #: Tests started so far (the next one is number ``tests_started + 1``).
    tests_started: int = 0
    #: Commitment id -> the latest records whose tokens moved its test.
    drivers: dict[str, list[str]] = field(default_factory=dict)
    #: UNVERIFIABLE reason -> the latest records with it.
    hidden: dict[str, list[str]] = field(default_factory=dict)
    #: Evidence points written so far (the ring's next slot is this modulo its size).
    points: int = 0

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> _Summary:
        summary = cls(**json.loads(raw))
        summary.share_unshared()
        return summary

    def next_share(self, cid: str) -> int:
        """Number the test of ``cid`` that starts now: the next j, never reused."""
        self.tests_started += 1
        self.shares[cid] = self.tests_started
        return self.tests_started

    def share_unshared(self) -> None:
        """Give the tests stored before shares existed (each ran at the whole alpha) the
        next shares, in order of start, and their tests the stricter threshold from now
        on; their evidence carries over, an alarm raised stays."""
        unshared = [
            (state.started_at, cid, state)
            for cid, raw in self.tests.items()
            if cid not in self.shares and (state := _current_state(raw)) is not None
        ]
        for _, cid, state in sorted(unshared, key=lambda t: (t[0], t[1])):
            share = sequential.alpha_share(self.next_share(cid))
            alpha = state.test.false_alarm_per_day * share
            self.tests[cid] = replace(
                state, test=replace(state.test, false_alarm_per_day=alpha)
            ).to_json()


def _current_state(raw: str) -> SequentialState | None:
    """A stored test state; None for one of an earlier format (restarted at the
    prover's next scored verdict)."""
    try:
        return SequentialState.from_json(raw)
    except sequential.StateFormatError:
        return None


def _remember(ring: dict[str, list[str]], name: str, record_id: str, keep: int) -> None:
    if record_id:
        ids = ring.setdefault(name, [])
        ids.append(record_id)
        del ids[:-keep]


class ProverTables:
    """Per-prover statistics, tests and alarms over the verifier's store. Attach one per
    store before anything writes verdicts (it adds the store's verdict hook)."""

    def __init__(
        self,
        store: Store,
        config: ProversConfig,
        signer: Signer,
        *,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self._store = store
        self._config = config
        self._signer = signer
        self._clock = clock
        self._dbs = {name: store.open_db(name) for name in _DBS}
        self._windows = tuple(Window(s) for s in config.windows_s)
        self._hiding_window = Window(config.hiding.window_s)
        self._tests: dict[bytes, SequentialTest | None] = {}
        self._listeners: list[AlarmListener] = []
        self._raised: list[verifier_pb2.AlarmState] = []
        self._raised_in: lmdb.Transaction | None = None
        store.add_verdict_hook(self._on_verdict)
        store.add_verdict_listener(lambda _: self._publish_raised())

    @property
    def config(self) -> ProversConfig:
        return self._config

    def add_alarm_listener(self, listener: AlarmListener) -> None:
        """Call ``listener`` (in the writing thread) with alarms raised or cleared, once
        their transaction committed."""
        self._listeners.append(listener)

    def _publish(self, states: Sequence[verifier_pb2.AlarmState]) -> None:
        if states:
            for listener in self._listeners:
                listener(states)

    def _publish_raised(self) -> None:
        raised, self._raised, self._raised_in = self._raised, [], None
        self._publish(raised)

    # -- honest tails -------------------------------------------------------------------

    def set_honest_tails(self, commitment_id: str, tails: HonestTails, *, actor: str) -> None:
        """:func:`verifierd.provers.honest_tails.store_honest_tails` (audited)."""
        store_honest_tails(
            self._store, commitment_id, tails, actor=actor, db=self._dbs[HONEST_TAILS_DB]
        )

    def _test_for(self, txn: lmdb.Transaction, commitment_id: str) -> SequentialTest | None:
        raw = txn.get(commitment_id.encode(), db=self._dbs[HONEST_TAILS_DB])
        if raw is None:
            return None
        raw = bytes(raw)
        if raw not in self._tests:
            try:
                self._tests[raw] = SequentialTest.from_honest(
                    decode_tails(raw), false_alarm_per_day=self._config.false_alarm_per_day
                )
            except sequential.SequentialTestError as exc:
                log.error(
                    "no sequential test for a commitment",
                    extra={"commitment_id": commitment_id, "error": str(exc)},
                )
                self._tests[raw] = None
        return self._tests[raw]

    # -- the verdict hook ---------------------------------------------------------------

    def _on_verdict(self, txn: lmdb.Transaction, stored: StoredVerdict) -> None:
        if self._raised_in is not txn:  # a new transaction (or a rerun of a failed one)
            self._raised, self._raised_in = [], txn
        if stored.verdict.reason == Reason.AMENDMENT:
            return
        entry = self._store.entry_in(txn, stored.origin, stored.seq)
        envelope = entry.envelope if entry is not None else b""
        prover = prover_of_envelope(stored.origin, envelope)
        if stored.previous is not None:
            self._withdraw(txn, prover, stored.previous, stored.verdict.decided_at_ns)
        self._raised += self._count(txn, prover, stored.verdict)

    def _withdraw(
        self, txn: lmdb.Transaction, prover: ProverKey, previous: verifier_pb2.Verdict, at_ns: int
    ) -> None:
        """Take a superseded verdict out of its prover's tallies and test (at ``at_ns``)."""
        pkey = prover.to_bytes()
        summary = self._summary(txn, pkey)
        if summary is None:
            return
        tally = Tally.of_verdict(previous)
        self._subtract(txn, pkey, 0, 0, tally)
        for window in self._windows:
            self._subtract(txn, pkey, window.seconds, window.bucket(previous.decided_at_ns), tally)
        cid = previous.commitment_id
        stored = summary.tests.get(cid) if tally.tokens and cid else None
        state = None if stored is None else _current_state(stored)
        if state is not None and previous.decided_at_ns / 1e9 >= state.started_at:
            try:
                state = sequential.withdraw(state, verdict_margins(previous))
            except sequential.SequentialTestError as exc:
                log.error(
                    "superseded verdict not withdrawn from the prover's test",
                    extra={
                        "prover": prover.label,
                        "record_id": previous.record_id,
                        "error": str(exc),
                    },
                )
            else:
                summary.tests[cid] = state.to_json()
                self._put_point(
                    txn, prover=prover, summary=summary, at_ns=at_ns, state=state, cid=cid
                )
        for ring in (summary.drivers.get(cid), summary.hidden.get(previous.reason)):
            if ring is not None and previous.record_id in ring:
                ring.remove(previous.record_id)
        txn.put(pkey, summary.to_json(), db=self._dbs["provers"])

    def _subtract(
        self, txn: lmdb.Transaction, pkey: bytes, window_s: int, bucket: int, tally: Tally
    ) -> None:
        """Withdraw ``tally`` from a bucket; nothing when the bucket was pruned."""
        key = pkey + _U32.pack(window_s) + _U64.pack(bucket)
        db = self._dbs["prover_tallies"]
        raw = txn.get(key, db=db)
        if raw is None:
            return
        less = Tally.from_json(bytes(raw)).without(tally)
        if less is None:
            log.error("superseded verdict not in its bucket's tally", extra={"window_s": window_s})
            return
        txn.put(key, less.to_json(), db=db)

    def _count(
        self, txn: lmdb.Transaction, prover: ProverKey, verdict: verifier_pb2.Verdict
    ) -> list[verifier_pb2.AlarmState]:
        pkey = prover.to_bytes()
        at = verdict.decided_at_ns
        summary = self._summary(txn, pkey) or _Summary(at, at)
        summary.first_ns, summary.last_ns = min(summary.first_ns, at), max(summary.last_ns, at)
        cid = verdict.commitment_id
        if cid and cid not in summary.commitments:
            summary.commitments = sorted([*summary.commitments, cid])
        tally = Tally.of_verdict(verdict)
        self._add(txn, pkey, 0, 0, tally)
        for window in self._windows:
            self._add(txn, pkey, window.seconds, window.bucket(at), tally)
            self._prune(txn, pkey, window, at)
        raised: list[verifier_pb2.AlarmState] = []
        try:
            if tally.tokens and cid:
                raised += self._test(txn, prover, summary, verdict)
            if verdict.status == _UNVERIFIABLE and verdict.reason in HIDING_REASONS:
                keep = self._config.alarm_record_ids
                _remember(summary.hidden, verdict.reason, verdict.record_id, keep)
                raised += self._hiding(txn, prover, summary, at)
        except lmdb.Error:
            raise  # the store's (a full map grows and the transaction reruns)
        except Exception:
            # A bug here must not stop the verdicts: the verdict and its counts are kept,
            # and the log says which prover's judgement missed it.
            log.exception(
                "prover judgement failed",
                extra={"prover": prover.label, "origin": verdict.origin, "seq": verdict.seq},
            )
        txn.put(pkey, summary.to_json(), db=self._dbs["provers"])
        return raised

    def _summary(self, txn: lmdb.Transaction, pkey: bytes) -> _Summary | None:
        raw = txn.get(pkey, db=self._dbs["provers"])
        return None if raw is None else _Summary.from_json(bytes(raw))

    def _add(
        self, txn: lmdb.Transaction, pkey: bytes, window_s: int, bucket: int, tally: Tally
    ) -> None:
        key = pkey + _U32.pack(window_s) + _U64.pack(bucket)
        db = self._dbs["prover_tallies"]
        raw = txn.get(key, db=db)
        total = tally if raw is None else Tally.from_json(bytes(raw)) + tally
        txn.put(key, total.to_json(), db=db)

    def _prune(self, txn: lmdb.Transaction, pkey: bytes, window: Window, now_ns: int) -> None:
        """Drop the window's buckets that fell out of it."""
        prefix = pkey + _U32.pack(window.seconds)
        oldest = prefix + _U64.pack(window.oldest(now_ns))
        cur = txn.cursor(db=self._dbs["prover_tallies"])
        found = cur.set_range(prefix)
        while found and bytes(cur.key()) < oldest:
            found = cur.delete()

    def _window(self, txn: lmdb.Transaction, pkey: bytes, window: Window, now_ns: int) -> Tally:
        prefix = pkey + _U32.pack(window.seconds)
        newest = prefix + _U64.pack(window.bucket(now_ns))
        cur = txn.cursor(db=self._dbs["prover_tallies"])
        tallies = []
        if cur.set_range(prefix + _U64.pack(window.oldest(now_ns))):
            for key, value in cur.iternext():
                if bytes(key) > newest:
                    break
                tallies.append(Tally.from_json(bytes(value)))
        return Tally.total(tallies)

    def _since_first_seen(self, txn: lmdb.Transaction, pkey: bytes) -> Tally:
        raw = txn.get(pkey + _U32.pack(0) + _U64.pack(0), db=self._dbs["prover_tallies"])
        return Tally() if raw is None else Tally.from_json(bytes(raw))

    # -- the sequential test ------------------------------------------------------------

    def _test(
        self,
        txn: lmdb.Transaction,
        prover: ProverKey,
        summary: _Summary,
        verdict: verifier_pb2.Verdict,
    ) -> list[verifier_pb2.AlarmState]:
        cid = verdict.commitment_id
        at_s = verdict.decided_at_ns / 1e9
        state = self._state(txn, summary, cid, at_s)
        if state is None:
            return []
        before = state.exceedances[0]
        was_crossed = sequential.crossed(state)
        state = sequential.update(state, verdict_margins(verdict), at_s)
        summary.tests[cid] = state.to_json()
        if state.exceedances[0] > before:
            _remember(summary.drivers, cid, verdict.record_id, self._config.alarm_record_ids)
        self._put_point(
            txn, prover=prover, summary=summary, at_ns=verdict.decided_at_ns, state=state, cid=cid
        )
        if was_crossed or state.alarm is None:
            return []
        alarm = state.alarm
        j = summary.shares[cid]
        share = sequential.alpha_share(j)
        slot = AlarmSlot(prover, AlarmKind.DISHONEST, cid)
        return [
            self._raise(
                txn,
                slot,
                new_alarm(
                    slot,
                    serial=self._serial(txn),
                    raised_at_ns=verdict.decided_at_ns,
                    statistic=alarm.log_e_value,
                    bound=alarm.log_threshold,
                    pooled_tokens=alarm.token,
                    record_ids=summary.drivers.get(cid, []),
                    commitment_ids=[cid],
                    detail=(
                        f"ln E = {alarm.log_e_value:.2f} reached ln(1/(alpha*day)) = "
                        f"{alarm.log_threshold:.2f} after {alarm.token} pooled tokens "
                        f"(day {alarm.day}, alpha {state.test.false_alarm_per_day:.3g} per day: "
                        f"the prover's test {j}, share {share:.3g} of its "
                        f"{state.test.false_alarm_per_day / share:.3g} per day)"
                    ),
                ),
            )
        ]

    def _state(
        self, txn: lmdb.Transaction, summary: _Summary, cid: str, at_s: float
    ) -> SequentialState | None:
        """The prover's test state for ``cid``: the stored one, or a fresh one (first
        sight, or a state of an earlier test whose evidence does not carry over), the
        fresh one numbered as the prover's next test and run at that test's share of
        alpha."""
        stored = summary.tests.get(cid)
        if stored is not None:
            try:
                return SequentialState.from_json(stored)
            except sequential.StateFormatError as exc:
                log.warning(
                    "prover test restarted: state of an earlier format",
                    extra={"commitment_id": cid, "error": str(exc)},
                )
        test = self._test_for(txn, cid)
        if test is None:
            return None
        alpha = test.false_alarm_per_day * sequential.alpha_share(summary.next_share(cid))
        return sequential.start(replace(test, false_alarm_per_day=alpha), at_s)

    def _put_point(
        self,
        txn: lmdb.Transaction,
        *,
        prover: ProverKey,
        summary: _Summary,
        at_ns: int,
        state: SequentialState,
        cid: str,
    ) -> None:
        slot = summary.points % self._config.evidence_history
        summary.points += 1
        value = _POINT.pack(at_ns, sequential.log_e_value(state), state.tokens) + cid.encode()
        txn.put(prover.to_bytes() + _U32.pack(slot), value, db=self._dbs["prover_evidence"])

    # -- hiding -------------------------------------------------------------------------

    def _hiding(
        self, txn: lmdb.Transaction, prover: ProverKey, summary: _Summary, now_ns: int
    ) -> list[verifier_pb2.AlarmState]:
        window = self._hiding_window
        tally = self._window(txn, prover.to_bytes(), window, now_ns)
        raised = []
        for breach in hiding_breaches(tally, self._config.hiding):
            slot = AlarmSlot(prover, AlarmKind.HIDING, breach.reason)
            if txn.get(slot.to_bytes(), db=self._dbs["prover_alarm_slots"]) is not None:
                continue
            n = round(breach.share * breach.verdicts)
            alarm = new_alarm(
                slot,
                serial=self._serial(txn),
                raised_at_ns=now_ns,
                statistic=breach.share,
                bound=breach.rate,
                window_s=window.seconds,
                record_ids=summary.hidden.get(breach.reason, []),
                commitment_ids=summary.commitments,
                detail=(
                    f"{n} of {breach.verdicts} verdicts in the last {window.seconds} s are "
                    f"UNVERIFIABLE ({breach.reason}): share {breach.share:.3f} > rate "
                    f"{breach.rate:g}"
                ),
            )
            raised.append(self._raise(txn, slot, alarm))
        return raised

    # -- alarms -------------------------------------------------------------------------

    def _serial(self, txn: lmdb.Transaction) -> int:
        """How many alarms were raised before (none is ever deleted)."""
        return int(txn.stat(self._dbs["prover_alarms"])["entries"])

    def _raise(
        self, txn: lmdb.Transaction, slot: AlarmSlot, alarm: verifier_pb2.ProverAlarm
    ) -> verifier_pb2.AlarmState:
        state = sign_alarm(alarm, self._signer)
        alarm_key = bytes.fromhex(alarm.alarm_id)
        txn.put(alarm_key, state.SerializeToString(), db=self._dbs["prover_alarms"])
        txn.put(slot.to_bytes(), alarm_key, db=self._dbs["prover_alarm_slots"])
        log.warning(
            "prover alarm raised",
            extra={
                "message_id": MessageId.PROVER_ALARM,
                "alarm_id": alarm.alarm_id,
                "prover": slot.prover.label,
                "kind": AlarmKind(slot.kind).label,
                "detail": alarm.detail,
            },
        )
        return state

    def clear_alarm(self, alarm_id: str, *, actor: str, why: str) -> verifier_pb2.AlarmState:
        """Clear an alarm in force: keep it, marked with who cleared it, when and why, and
        write the audit event, in one transaction. Clearing a DISHONEST alarm restarts
        that commitment's test for the prover (its false-alarm bound counts from now; it
        is the prover's next test, at the next share of alpha).
        Raises NoSuchAlarmError."""

        def body(txn: lmdb.Transaction) -> verifier_pb2.AlarmState:
            try:
                alarm_key = bytes.fromhex(alarm_id)
            except ValueError:
                raise NoSuchAlarmError(f"no alarm {alarm_id!r}") from None
            raw = txn.get(alarm_key, db=self._dbs["prover_alarms"])
            if raw is None:
                raise NoSuchAlarmError(f"no alarm {alarm_id!r}")
            state = verifier_pb2.AlarmState.FromString(bytes(raw))
            if state.cleared_at_ns:
                raise NoSuchAlarmError(f"alarm {alarm_id} was cleared already")
            alarm = state.alarm
            prover = ProverKey.of_proto(alarm.prover)
            kind = AlarmKind(alarm.kind)
            reason = alarm.commitment_ids[0] if kind is AlarmKind.DISHONEST else alarm.reason
            txn.delete(
                AlarmSlot(prover, kind, reason).to_bytes(), db=self._dbs["prover_alarm_slots"]
            )
            state.cleared_at_ns, state.cleared_by, state.clear_reason = self._clock(), actor, why
            txn.put(alarm_key, state.SerializeToString(), db=self._dbs["prover_alarms"])
            if kind is AlarmKind.DISHONEST:
                summary = self._summary(txn, prover.to_bytes())
                if summary is not None:
                    summary.tests.pop(reason, None)
                    summary.shares.pop(reason, None)
                    summary.drivers.pop(reason, None)
                    txn.put(prover.to_bytes(), summary.to_json(), db=self._dbs["provers"])
            self._store.audit_in(
                txn,
                actor,
                "clear_prover_alarm",
                {
                    "alarm_id": alarm_id,
                    "prover": prover.label,
                    "kind": kind.label,
                    "reason": alarm.reason,
                    "raised_at_ns": alarm.raised_at_ns,
                    "why": why,
                },
            )
            return state

        state = self._store.write_transaction(body)
        log.info("prover alarm cleared", extra={"alarm_id": alarm_id, "actor": actor, "why": why})
        self._publish([state])
        return state

    def alarms(self, *, include_cleared: bool = False) -> list[verifier_pb2.AlarmState]:
        """Alarms in force (and cleared ones when asked), oldest first."""
        with self._store.read_transaction() as txn:
            values = [
                bytes(v) for v in txn.cursor(db=self._dbs["prover_alarms"]).iternext(keys=False)
            ]
        states = [verifier_pb2.AlarmState.FromString(v) for v in values]
        kept = [s for s in states if include_cleared or not s.cleared_at_ns]
        return sorted(kept, key=lambda s: (s.alarm.raised_at_ns, s.alarm.alarm_id))

    # -- reads --------------------------------------------------------------------------

    def provers(self, *, alarmed_only: bool = False) -> list[verifier_pb2.Prover]:
        now = self._clock()
        in_force = self.alarms()
        out = []
        with self._store.read_transaction() as txn:
            for key, value in txn.cursor(db=self._dbs["provers"]).iternext():
                prover = ProverKey.from_bytes(bytes(key))
                mine = [a for a in in_force if ProverKey.of_proto(a.alarm.prover) == prover]
                if alarmed_only and not mine:
                    continue
                summary = _Summary.from_json(bytes(value))
                out.append(self._message(txn, prover, summary, mine, now))
        return out

    def prover(self, prover: ProverKey) -> verifier_pb2.GetProverResponse | None:
        """One prover, its evidence history and every alarm it had; None when unknown."""
        now = self._clock()
        every = [
            a
            for a in self.alarms(include_cleared=True)
            if ProverKey.of_proto(a.alarm.prover) == prover
        ]
        pkey = prover.to_bytes()
        with self._store.read_transaction() as txn:
            summary = self._summary(txn, pkey)
            if summary is None:
                return None
            in_force = [a for a in every if not a.cleared_at_ns]
            response = verifier_pb2.GetProverResponse(
                prover=self._message(txn, prover, summary, in_force, now), alarms=every
            )
            points = []
            cur = txn.cursor(db=self._dbs["prover_evidence"])
            if cur.set_range(pkey):
                for key, value in cur.iternext():
                    if not bytes(key).startswith(pkey) or len(key) != len(pkey) + _U32.size:
                        break
                    at_ns, statistic, tokens = _POINT.unpack_from(value)
                    cid = bytes(value[_POINT.size :]).decode()
                    points.append(
                        verifier_pb2.EvidencePoint(
                            at_ns=at_ns,
                            statistic=statistic,
                            pooled_tokens=tokens,
                            commitment_id=cid,
                        )
                    )
        response.evidence_history.extend(sorted(points, key=lambda p: p.at_ns))
        return response

    def _message(
        self,
        txn: lmdb.Transaction,
        prover: ProverKey,
        summary: _Summary,
        in_force: Sequence[verifier_pb2.AlarmState],
        now_ns: int,
    ) -> verifier_pb2.Prover:
        pkey = prover.to_bytes()
        message = verifier_pb2.Prover(
            id=prover.to_proto(),
            first_seen_ns=summary.first_ns,
            last_seen_ns=summary.last_ns,
            commitment_ids=summary.commitments,
            alarms=in_force,
        )
        for window in self._windows:
            message.windows.append(
                self._window(txn, pkey, window, now_ns).to_window(window.seconds)
            )
        message.windows.append(self._since_first_seen(txn, pkey).to_window(0))
        now_s = now_ns / 1e9
        current = {cid: _current_state(raw) for cid, raw in summary.tests.items()}
        for cid, j in sorted(summary.shares.items(), key=lambda item: item[1]):
            test_state = current.get(cid)
            if test_state is not None:
                message.tests.append(
                    verifier_pb2.CommitmentTest(
                        commitment_id=cid,
                        number=j,
                        alpha_share=sequential.alpha_share(j),
                        false_alarm_per_day=test_state.test.false_alarm_per_day,
                        evidence=sequential.log_e_value(test_state),
                        evidence_bound=sequential.log_bound(test_state, now_s),
                        pooled_tokens=test_state.tokens,
                    )
                )
        states = [s for s in current.values() if s is not None]
        if states:
            best = max(states, key=sequential.log_e_value)
            message.evidence = sequential.log_e_value(best)
            day = sequential.day_of(best, now_ns / 1e9)
            message.evidence_bound = best.test.log_threshold(day)
            message.pooled_tokens = best.tokens
        return message

"""Records from given provers, and verdicts about them, written through the real store; a
verifier's store with its prover tables (:class:`Verifier`, the ``verifier`` fixture)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from veritap.envelope import ZERO_HASH, encode_envelope, entry_hash
from veritap.merkle import root_of
from veritap.note import CheckpointBody, sign_checkpoint
from veritap.signing import Signer
from veritap.v1 import log_pb2, verifier_pb2

from tests.verifierd.record_fixtures import Exchange, make_record
from verifierd import verdicts
from verifierd.config import ProversConfig
from verifierd.provers.identity import ProverKey
from verifierd.provers.sequential import HonestTails
from verifierd.provers.store import ProverTables
from verifierd.store import AmendmentWrite, Store, Supersede, VerdictWrite
from verifierd.verdicts import sign_verdict, superseding

CID = "ab" * 32
HONEST = ProverKey("edge", "10.0.0.1", 8000)
CHEAT = ProverKey("edge", "fd00::2", 8000)
#: float32 reproduction: every honest margin 0 (what calibration measures there).
FLOAT32_TAILS = HonestTails.from_margins([np.zeros(1000)] * 300, 10.0)


class Clock:
    """A clock the test sets (ns since the epoch)."""

    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


@dataclass(frozen=True)
class Outcome:
    """What a verdict about one record says."""

    status: int
    reason: str = ""
    margins: tuple[float, ...] = ()
    decided_at_ns: int = 1_000_000_000
    #: The request sampled (temperature above 0), so it needed a seed.
    needs_seed: bool = False
    #: The commitment that scored it (a verdict without margins names none).
    commitment_id: str = CID


def honest(tokens: int = 50, at_ns: int = 1_000_000_000, *, sampled: bool = False) -> Outcome:
    return Outcome(verifier_pb2.VERDICT_STATUS_PASS, "", (0.0,) * tokens, at_ns, sampled)


def dishonest(tokens: int = 50, at_ns: int = 1_000_000_000) -> Outcome:
    """A response with every fifth token not the sampler's choice."""
    margins = tuple(0.5 if i % 5 == 0 else 0.0 for i in range(tokens))
    return Outcome(verifier_pb2.VERDICT_STATUS_FAIL, "score_over_threshold", margins, at_ns)


def unverifiable(reason: str, at_ns: int = 1_000_000_000) -> Outcome:
    """A verdict of ``reason``; a no_seed one is about a request that sampled."""
    return Outcome(verifier_pb2.VERDICT_STATUS_UNVERIFIABLE, reason, (), at_ns, reason == "no_seed")


#: The collector key the fixtures sign checkpoints with.
COLLECTOR = Signer.generate("test-collector")


def ingest_from(
    store: Store, prover: ProverKey, exchanges: Sequence[Exchange], *, checkpointed: bool = True
) -> list[int]:
    """Append records of ``exchanges`` sent to ``prover`` to its origin's log in ``store``,
    as intake would, then (``checkpointed``) COLLECTOR's signed checkpoint of the whole
    log; returns their seqs."""
    cursor = store.cursor(prover.origin)
    prev, seq = cursor.hash if cursor.seq else ZERO_HASH, cursor.seq
    batch = []
    for x in exchanges:
        seq += 1
        record = make_record(x)
        record.flow.server_address = prover.server_address
        record.flow.server_port = prover.server_port
        envelope = encode_envelope(
            seq=seq,
            prev_hash=prev,
            captured_at_ns=1_000 + seq,
            origin=prover.origin,
            key_id=COLLECTOR.key_id,
            record=record.SerializeToString(),
        )
        prev = entry_hash(envelope)
        batch.append((seq, envelope, prev))
    store.ingest(prover.origin, batch)
    if checkpointed:
        leaves = _leaves(store, prover.origin)
        root = root_of(leaves)
        note = sign_checkpoint(CheckpointBody(prover.origin, len(leaves), root), COLLECTOR)
        checkpoint = log_pb2.Checkpoint(
            origin=prover.origin, tree_size=len(leaves), root_hash=root, note=note
        )
        store.ingest(prover.origin, [], checkpoint=checkpoint)
    return [entry[0] for entry in batch]


def _leaves(store: Store, origin: str) -> list[bytes]:
    leaves = []
    for seq in range(1, store.cursor(origin).seq + 1):
        entry = store.entry(origin, seq)
        assert entry is not None
        leaves.append(entry.entry_hash)
    return leaves


class ProverTraffic:
    """Appends records from a prover to its origin's log in ``store`` and writes their
    verdicts with the store's classify, as the pipeline does."""

    def __init__(self, store: Store, signer: Signer) -> None:
        self._store = store
        self._signer = signer
        self._n = 0

    def send(self, prover: ProverKey, outcomes: Sequence[Outcome]) -> list[str]:
        """Returns the record ids."""
        ids = []
        for _ in outcomes:
            self._n += 1
            ids.append(f"R{self._n:06d}")
        seqs = ingest_from(self._store, prover, [Exchange(i) for i in ids], checkpointed=False)
        self._store.classify(
            [
                self._verdict(prover.origin, seq, record_id, outcome)
                for seq, record_id, outcome in zip(seqs, ids, outcomes, strict=True)
            ]
        )
        return ids

    def _verdict(self, origin: str, seq: int, record_id: str, outcome: Outcome) -> VerdictWrite:
        margins = np.asarray(outcome.margins, dtype="<f2")
        v = verifier_pb2.Verdict(
            record_id=record_id,
            origin=origin,
            seq=seq,
            commitment_id=outcome.commitment_id if outcome.margins else "",
            status=outcome.status,  # type: ignore[arg-type]
            reason=outcome.reason,
            token_count=len(margins),
            exact_matches=int(np.count_nonzero(margins == 0)),
            margins_f16=margins.tobytes(),
            decided_at_ns=outcome.decided_at_ns,
            needs_seed=outcome.needs_seed,
        )
        return VerdictWrite(origin, seq, record_id, sign_verdict(v, self._signer), v)


class Verifier:
    """A store with its prover tables under ``config``, reopened as a restarted verifierd
    would; its clock stands still until the test moves it."""

    def __init__(self, path: Path, config: ProversConfig) -> None:
        self.path = path
        self.config = config
        self.signer = Signer.generate("verifier-test")
        self.clock = Clock(1_000_000_000)
        self.raised: list[verifier_pb2.AlarmState] = []
        self._open()

    def _open(self) -> None:
        self.store = Store.open(self.path)
        self.tables = ProverTables(self.store, self.config, self.signer, clock=self.clock)
        self.tables.add_alarm_listener(self.raised.extend)
        self.traffic = ProverTraffic(self.store, self.signer)

    def restart(self) -> None:
        self.store.close()
        self._open()

    def close(self) -> None:
        self.store.close()

    def prover(self, prover: ProverKey) -> verifier_pb2.GetProverResponse:
        found = self.tables.prover(prover)
        assert found is not None
        return found

    def window(self, prover: ProverKey, window_s: int) -> verifier_pb2.ProverWindow:
        return next(w for w in self.prover(prover).prover.windows if w.window_s == window_s)

    def amend(self, prover: ProverKey, record_id: str) -> None:
        """:func:`amend` ``record_id`` now."""
        amend(self.store, self.signer, prover, record_id, self.clock.now)


def amend(store: Store, signer: Signer, prover: ProverKey, record_id: str, at_ns: int) -> None:
    """Classify a collector amendment of ``record_id`` superseding its verdict, decided at
    ``at_ns``, as the pipeline does."""
    (previous,) = store.verdicts_for_record(record_id)
    (seq,) = ingest_from(store, prover, [Exchange(f"amend-{record_id}")])
    own = verdicts.unverifiable(
        verifier_pb2.Verdict(record_id=f"amend-{record_id}", origin=prover.origin, seq=seq),
        verdicts.Reason.AMENDMENT,
        "late ambiguity",
    )
    new = superseding(
        previous.signed,
        previous.verdict,
        amendment_record_id=f"amend-{record_id}",
        amendment_reason="late ambiguity",
    )

    def write(v: verifier_pb2.Verdict) -> VerdictWrite:
        v.decided_at_ns = at_ns
        return VerdictWrite(v.origin, v.seq, v.record_id, sign_verdict(v, signer), v)

    store.classify(
        [
            AmendmentWrite(
                write(own), (record_id,), "late ambiguity", (Supersede(previous, write(new)),)
            )
        ]
    )


def counts(window: verifier_pb2.ProverWindow) -> dict[tuple[int, str], int]:
    """A window's verdict counts by (status, reason)."""
    return {(c.status, c.reason): c.count for c in window.counts}

"""Records from given provers, and verdicts about them, written through the real store."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from veritap.envelope import ZERO_HASH, encode_envelope, entry_hash
from veritap.signing import Signer
from veritap.v1 import verifier_pb2

from tests.verifierd.record_fixtures import Exchange, make_record
from verifierd.provers.identity import ProverKey
from verifierd.provers.sequential import HonestTails
from verifierd.store import Store, VerdictWrite
from verifierd.verdicts import sign_verdict

CID = "ab" * 32
#: float32 reproduction: every honest margin 0 (what calibration measures there).
FLOAT32_TAILS = HonestTails.from_margins([np.zeros(1000)] * 300, 10.0)


@dataclass(frozen=True)
class Outcome:
    """What a verdict about one record says."""

    status: int
    reason: str = ""
    margins: tuple[float, ...] = ()
    decided_at_ns: int = 1_000_000_000


def honest(tokens: int = 50, at_ns: int = 1_000_000_000) -> Outcome:
    return Outcome(verifier_pb2.VERDICT_STATUS_PASS, "", (0.0,) * tokens, at_ns)


def dishonest(tokens: int = 50, at_ns: int = 1_000_000_000) -> Outcome:
    """A response with every fifth token not the sampler's choice."""
    margins = tuple(0.5 if i % 5 == 0 else 0.0 for i in range(tokens))
    return Outcome(verifier_pb2.VERDICT_STATUS_FAIL, "score_over_threshold", margins, at_ns)


def unverifiable(reason: str, at_ns: int = 1_000_000_000) -> Outcome:
    return Outcome(verifier_pb2.VERDICT_STATUS_UNVERIFIABLE, reason, (), at_ns)


class ProverTraffic:
    """Appends records from ``prover`` to its origin's log in ``store`` and writes their
    verdicts with the store's classify, as the pipeline does."""

    def __init__(self, store: Store, signer: Signer) -> None:
        self._store = store
        self._signer = signer
        self._n = 0

    def send(self, prover: ProverKey, outcomes: Sequence[Outcome]) -> list[str]:
        """Returns the record ids."""
        store = self._store
        cursor = store.cursor(prover.origin)
        prev, seq = cursor.hash if cursor.seq else ZERO_HASH, cursor.seq
        batch, writes, ids = [], [], []
        for outcome in outcomes:
            seq += 1
            self._n += 1
            record_id = f"R{self._n:06d}"
            record = make_record(Exchange(record_id))
            record.flow.server_address = prover.server_address
            record.flow.server_port = prover.server_port
            envelope = encode_envelope(
                seq=seq,
                prev_hash=prev,
                captured_at_ns=1_000 + seq,
                origin=prover.origin,
                key_id=b"kid0",
                record=record.SerializeToString(),
            )
            prev = entry_hash(envelope)
            batch.append((seq, envelope, prev))
            writes.append(self._verdict(prover.origin, seq, record_id, outcome))
            ids.append(record_id)
        store.ingest(prover.origin, batch)
        store.classify(writes)
        return ids

    def _verdict(self, origin: str, seq: int, record_id: str, outcome: Outcome) -> VerdictWrite:
        margins = np.asarray(outcome.margins, dtype="<f2")
        v = verifier_pb2.Verdict(
            record_id=record_id,
            origin=origin,
            seq=seq,
            commitment_id=CID if outcome.margins else "",
            status=outcome.status,  # type: ignore[arg-type]
            reason=outcome.reason,
            token_count=len(margins),
            exact_matches=int(np.count_nonzero(margins == 0)),
            margins_f16=margins.tobytes(),
            decided_at_ns=outcome.decided_at_ns,
        )
        return VerdictWrite(origin, seq, record_id, sign_verdict(v, self._signer), v)

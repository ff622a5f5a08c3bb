"""Prover alarms: what raises one, and the signed statement the verifier keeps of it.

Two kinds (``AlarmKind``):

- **DISHONEST**: the prover's sequential test (:mod:`verifierd.provers.sequential`) over one
  commitment's pooled margins crossed its bound.
- **HIDING**: over the configured window, the share of the prover's verdicts that are
  UNVERIFIABLE for one reason exceeds that reason's rate (:func:`hiding_breaches`).

An alarm is sticky: while one of a (prover, kind, reason) is in force no second one is
raised, and only an admin clears it. The verifier signs the serialized ``ProverAlarm`` with
its Ed25519 key exactly as it signs verdicts, so anyone holding its public key can check
an alarm without trusting the store (:func:`check_signed_alarm`).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

from veritap.signing import Signer, Verifier
from veritap.v1 import verifier_pb2

from verifierd.config import HIDING_REASONS, HidingConfig
from verifierd.errors import VerifierdError
from verifierd.provers.identity import ProverKey
from verifierd.provers.tally import Tally


class AlarmKind(IntEnum):
    DISHONEST = verifier_pb2.ALARM_KIND_DISHONEST
    HIDING = verifier_pb2.ALARM_KIND_HIDING

    @property
    def label(self) -> str:
        """The Prometheus ``kind`` label: "dishonest", "hiding"."""
        return self.name.lower()


class AlarmSignatureError(VerifierdError):
    """A signed alarm's key id or signature does not check out."""


@dataclass(frozen=True)
class AlarmSlot:
    """What makes an alarm unique while in force: (prover, kind, reason)."""

    prover: ProverKey
    kind: AlarmKind
    #: HIDING: the UNVERIFIABLE reason; DISHONEST: the commitment id.
    reason: str

    def to_bytes(self) -> bytes:
        return self.prover.to_bytes() + bytes([self.kind]) + self.reason.encode()


@dataclass(frozen=True)
class HidingBreach:
    reason: str
    share: float
    rate: float
    verdicts: int


def hiding_breaches(window: Tally, config: HidingConfig) -> list[HidingBreach]:
    """The reasons whose UNVERIFIABLE share of ``window`` exceeds their rate, once the
    window holds ``min_verdicts``. Only HIDING_REASONS count: the verifier's own failures
    never accuse a prover."""
    total = window.verdicts
    if total < config.min_verdicts:
        return []
    out = []
    for reason, n in sorted(window.unverifiable().items()):
        rate = config.rate(reason)
        if reason in HIDING_REASONS and n / total > rate:
            out.append(HidingBreach(reason, n / total, rate, total))
    return out


def alarm_id(slot: AlarmSlot, raised_at_ns: int, serial: int) -> str:
    """32 hex digits naming one alarm; ``serial`` (how many alarms the verifier raised
    before it) keeps two alarms of one slot raised at the same time apart."""
    digest = hashlib.sha256(slot.to_bytes() + struct.pack(">QQ", raised_at_ns, serial)).digest()
    return digest[:16].hex()


def new_alarm(
    slot: AlarmSlot,
    *,
    serial: int,
    raised_at_ns: int,
    statistic: float,
    bound: float,
    record_ids: Sequence[str],
    commitment_ids: Sequence[str],
    detail: str,
    window_s: int = 0,
    pooled_tokens: int = 0,
) -> verifier_pb2.ProverAlarm:
    return verifier_pb2.ProverAlarm(
        alarm_id=alarm_id(slot, raised_at_ns, serial),
        prover=slot.prover.to_proto(),
        kind=verifier_pb2.AlarmKind.ValueType(slot.kind),
        reason="" if slot.kind is AlarmKind.DISHONEST else slot.reason,
        raised_at_ns=raised_at_ns,
        statistic=statistic,
        bound=bound,
        window_s=window_s,
        pooled_tokens=pooled_tokens,
        record_ids=record_ids,
        commitment_ids=commitment_ids,
        detail=detail,
    )


def sign_alarm(alarm: verifier_pb2.ProverAlarm, signer: Signer) -> verifier_pb2.AlarmState:
    """The alarm as kept: its bytes signed by the verifier's key, not cleared."""
    data = alarm.SerializeToString(deterministic=True)
    signed = verifier_pb2.SignedProverAlarm(
        alarm=data, signature=signer.sign(data), key_id=signer.key_id
    )
    return verifier_pb2.AlarmState(alarm=alarm, signed=signed)


def check_signed_alarm(
    signed: verifier_pb2.SignedProverAlarm, verifier: Verifier
) -> verifier_pb2.ProverAlarm:
    """The alarm inside ``signed`` when ``verifier``'s key signed exactly its bytes."""
    if signed.key_id != verifier.key_id:
        raise AlarmSignatureError(
            f"alarm signed by key {signed.key_id.hex()}, expected {verifier.key_id.hex()}"
        )
    if not verifier.verify(signed.alarm, signed.signature):
        raise AlarmSignatureError("alarm signature does not verify")
    return verifier_pb2.ProverAlarm.FromString(signed.alarm)

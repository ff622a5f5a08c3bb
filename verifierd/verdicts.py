"""Verdicts: building them, signing them with the verifier's Ed25519 key, checking them.

A :class:`~veritap.v1.verifier_pb2.SignedVerdict` carries the serialized
``Verdict`` bytes verbatim, the Ed25519 signature over exactly those bytes and
the C2SP key id of the verifier key, so anyone holding the verifier's public
key can check a verdict later without trusting the store it came from.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from enum import StrEnum
from pathlib import Path
from typing import Literal, get_args

from veritap.signing import Signer, Verifier
from veritap.v1 import verifier_pb2

from verifierd.errors import VerifierdError

log = logging.getLogger(__name__)

PASS = verifier_pb2.VERDICT_STATUS_PASS
FAIL = verifier_pb2.VERDICT_STATUS_FAIL
UNVERIFIABLE = verifier_pb2.VERDICT_STATUS_UNVERIFIABLE
SKIPPED = verifier_pb2.VERDICT_STATUS_SKIPPED


class Reason(StrEnum):
    """Why a record got FAIL, UNVERIFIABLE or SKIPPED (``Verdict.reason``)."""

    #: Sampled at temperature > 0 without a seed: the noise cannot be rebuilt.
    NO_SEED = "no_seed"
    #: The capture is not complete (gap, truncation, mid-stream, parse error).
    CAPTURE_GAP = "capture_gap"
    #: No commitment serves the record's model name.
    UNKNOWN_COMMITMENT = "unknown_commitment"
    #: Neither token ids nor a faithful re-tokenization are available.
    TOKENS_UNAVAILABLE = "tokens_unavailable"
    #: The request used a feature the verifier cannot replay (structured output, beam
    #: search, custom logits processors, ...).
    SAMPLER_NOT_REPRODUCIBLE = "sampler_not_reproducible"
    #: The cached weights do not match the commitment's digests.
    WEIGHTS_MISMATCH = "weights_mismatch"
    #: The commitment's weights are not in the cache.
    WEIGHTS_MISSING = "weights_missing"
    #: The engine failed on every attempt.
    ENGINE_ERROR = "engine_error"
    #: The exchange produced nothing to verify (HTTP error, no choices).
    NO_OUTPUT = "no_output"
    #: The record's envelope or record bytes do not parse.
    BAD_RECORD = "bad_record"
    #: Not selected by the commitment's sampling policy (SKIPPED).
    NOT_SAMPLED = "not_sampled"
    #: verifierd itself failed on this record (a bug; the detail and the log say
    #: what). The record is closed rather than stopping the daemon on it.
    INTERNAL_ERROR = "internal_error"

    # FAIL reasons: a prover claim contradicts the captured request or text.
    #: The claimed prompt ids are not what the captured request renders to.
    PROMPT_MISMATCH = "prompt_mismatch"
    #: The claimed output ids do not detokenize to the text the client received.
    TOKEN_TEXT_MISMATCH = "token_text_mismatch"
    #: ``finish_reason`` / ``stop_reason`` disagree with the request and the output.
    FINISH_MISMATCH = "finish_mismatch"
    #: ``usage`` counts disagree with what was scored.
    USAGE_MISMATCH = "usage_mismatch"
    #: The Token-DiFR score is over the threshold.
    SCORE_OVER_THRESHOLD = "score_over_threshold"
    #: The output leaves the request's grammar (structured output): a sampler under
    #: that grammar could not have produced it.
    GRAMMAR_VIOLATION = "grammar_violation"
    #: The response's logprobs do not name the tokens the client saw, or their
    #: values differ from the verifier's beyond the calibrated tolerance.
    LOGPROBS_MISMATCH = "logprobs_mismatch"

    # UNVERIFIABLE reasons of the evidence path.
    #: No token sequence was found within the search's restart bound.
    TOKENIZATION_SEARCH_EXHAUSTED = "tokenization_search_exhausted"
    #: The committed engine refuses to render the captured request.
    REQUEST_NOT_RENDERED = "request_not_rendered"

    # The collector's amendments (a late copy of bytes already recorded differed).
    #: The collector later saw the record's bytes in another version (its amendment
    #: record names it): the client may not have received what the record holds. A
    #: verdict the record had is superseded by this one and kept in the history.
    RECORD_AMENDED = "record_amended"
    #: The record is the collector's amendment of other records, not an exchange.
    AMENDMENT = "amendment"


class VerdictSignatureError(VerifierdError):
    """A signed verdict's key id or signature does not check out."""


def sign_verdict(verdict: verifier_pb2.Verdict, signer: Signer) -> verifier_pb2.SignedVerdict:
    data = verdict.SerializeToString(deterministic=True)
    return verifier_pb2.SignedVerdict(
        verdict=data, signature=signer.sign(data), key_id=signer.key_id
    )


def check_signed_verdict(
    signed: verifier_pb2.SignedVerdict, verifier: Verifier
) -> verifier_pb2.Verdict:
    """The verdict inside ``signed`` when ``verifier``'s key signed exactly its bytes."""
    if signed.key_id != verifier.key_id:
        raise VerdictSignatureError(
            f"verdict signed by key {signed.key_id.hex()}, expected {verifier.key_id.hex()}"
        )
    if not verifier.verify(signed.verdict, signed.signature):
        raise VerdictSignatureError("verdict signature does not verify")
    return verifier_pb2.Verdict.FromString(signed.verdict)


def load_or_create_signer(path: Path, name: str) -> Signer:
    """The verifier's key from ``path``; on first start a new key is written there
    (mode 0600) with its public verifier key beside it in ``<path>.pub``."""
    if path.exists():
        return Signer.load(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    signer = Signer.generate(name)
    signer.save(path)
    pub = path.with_name(path.name + ".pub")
    pub.write_text(signer.verifier().key_string() + "\n", encoding="utf-8")
    log.info("generated verifier key", extra={"path": str(path), "key_id": signer.key_id.hex()})
    return signer


def load_or_create_secret(path: Path) -> bytes:
    """The sampling policy's HMAC key (32 random bytes, mode 0600, made on first start).
    Kept apart from the signing key: knowing it lets a prover predict which records
    are checked."""
    if path.exists():
        secret = path.read_bytes()
        if len(secret) < 16:
            raise VerifierdError(f"{path}: sampling secret shorter than 16 bytes")
        return secret
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    secret = os.urandom(32)
    with os.fdopen(fd, "wb") as out:
        out.write(secret)
    return secret


def base_verdict(
    *,
    origin: str,
    seq: int,
    entry_hash: bytes,
    record_id: str,
    model: str,
    commitment_id: str = "",
) -> verifier_pb2.Verdict:
    """The fields every verdict has: which record, which entry, which commitment."""
    return verifier_pb2.Verdict(
        record_id=record_id,
        origin=origin,
        seq=seq,
        entry_hash=entry_hash,
        commitment_id=commitment_id,
        model=model,
        decided_at_ns=time.time_ns(),
    )


def unverifiable(
    verdict: verifier_pb2.Verdict, reason: Reason, detail: str
) -> verifier_pb2.Verdict:
    verdict.status = SKIPPED if reason is Reason.NOT_SAMPLED else UNVERIFIABLE
    verdict.reason = reason.value
    verdict.detail = detail
    return verdict


#: What a verdict says about scored tokens.
ScoredField = Literal[
    "score",
    "token_count",
    "exact_matches",
    "out_of_mask",
    "margins_f16",
    "found_token_ids",
    "logprobs_deviation",
]
_SCORED_FIELDS: tuple[ScoredField, ...] = get_args(ScoredField)


def amended(
    verdict: verifier_pb2.Verdict, *, amendment_record_id: str, amendment_reason: str
) -> verifier_pb2.Verdict:
    """``verdict`` made UNVERIFIABLE(record_amended): the collector's amendment record
    ``amendment_record_id`` says the record's bytes arrived in another version too.
    Nothing scored stays on it (a margin of bytes the client may not have received is no
    evidence either way)."""
    for field in _SCORED_FIELDS:
        verdict.ClearField(field)
    verdict.amended_by_record_id = amendment_record_id
    detail = f"amendment {amendment_record_id}: {amendment_reason}"
    if verdict.HasField("supersedes"):
        was = verdict.supersedes
        said = status_label(was.status) + (f" ({was.reason})" if was.reason else "")
        detail += f"; supersedes {said} decided at {was.decided_at_ns}"
    return unverifiable(verdict, Reason.RECORD_AMENDED, detail)


def superseding(
    previous: verifier_pb2.SignedVerdict,
    verdict: verifier_pb2.Verdict,
    *,
    amendment_record_id: str,
    amendment_reason: str,
) -> verifier_pb2.Verdict:
    """The verdict that supersedes ``verdict`` (signed as ``previous``) once the collector
    amended its record: the same record, entry, commitment and checkpoint,
    UNVERIFIABLE(record_amended), naming what the superseded verdict said and the SHA-256
    of its signed bytes (the store keeps those in its history)."""
    v = base_verdict(
        origin=verdict.origin,
        seq=verdict.seq,
        entry_hash=verdict.entry_hash,
        record_id=verdict.record_id,
        model=verdict.model,
        commitment_id=verdict.commitment_id,
    )
    v.sampler_profile, v.engine = verdict.sampler_profile, verdict.engine
    v.checkpoint_tree_size = verdict.checkpoint_tree_size
    v.checkpoint_root_hash = verdict.checkpoint_root_hash
    if verdict.HasField("settings"):
        v.settings.CopyFrom(verdict.settings)
    v.supersedes.CopyFrom(
        verifier_pb2.SupersededVerdict(
            status=verdict.status,
            reason=verdict.reason,
            detail=verdict.detail,
            score=verdict.score,
            decided_at_ns=verdict.decided_at_ns,
            signed_sha256=hashlib.sha256(previous.SerializeToString(deterministic=True)).digest(),
        )
    )
    return amended(v, amendment_record_id=amendment_record_id, amendment_reason=amendment_reason)


def status_label(status: verifier_pb2.VerdictStatus.ValueType) -> str:
    """``PASS`` for VERDICT_STATUS_PASS, and so on."""
    return verifier_pb2.VerdictStatus.Name(status).removeprefix("VERDICT_STATUS_")

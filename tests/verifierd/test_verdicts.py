"""Signed verdicts: Ed25519 over the verdict bytes verbatim, keys made on first start."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from veritap.signing import Signer, Verifier
from veritap.v1 import verifier_pb2

from verifierd.verdicts import (
    Reason,
    VerdictSignatureError,
    base_verdict,
    check_signed_verdict,
    load_or_create_secret,
    load_or_create_signer,
    sign_verdict,
    unverifiable,
)


def sample_verdict() -> verifier_pb2.Verdict:
    v = base_verdict(
        origin="edge", seq=9, entry_hash=b"h" * 32, record_id="01J", model="tiny", commitment_id="c"
    )
    v.status = verifier_pb2.VERDICT_STATUS_FAIL
    v.score = 1.25
    v.margins_f16 = b"\x00\x3c" * 4
    return v


def test_sign_and_check() -> None:
    signer = Signer.generate("verifierd")
    signed = sign_verdict(sample_verdict(), signer)
    assert signed.key_id == signer.key_id
    got = check_signed_verdict(signed, signer.verifier())
    assert (got.seq, got.score, got.status) == (9, 1.25, verifier_pb2.VERDICT_STATUS_FAIL)


def test_tampering_and_wrong_keys_are_refused() -> None:
    signer = Signer.generate("verifierd")
    signed = sign_verdict(sample_verdict(), signer)
    forged = verifier_pb2.Verdict.FromString(signed.verdict)
    forged.status = verifier_pb2.VERDICT_STATUS_PASS
    tampered = verifier_pb2.SignedVerdict()
    tampered.CopyFrom(signed)
    tampered.verdict = forged.SerializeToString()
    with pytest.raises(VerdictSignatureError, match="does not verify"):
        check_signed_verdict(tampered, signer.verifier())
    other = Signer.generate("verifierd")
    with pytest.raises(VerdictSignatureError, match="signed by key"):
        check_signed_verdict(signed, other.verifier())
    same_id = verifier_pb2.SignedVerdict()
    same_id.CopyFrom(signed)
    same_id.key_id = other.key_id
    with pytest.raises(VerdictSignatureError, match="does not verify"):
        check_signed_verdict(same_id, other.verifier())


def test_key_is_created_once_and_published(tmp_path: Path) -> None:
    path = tmp_path / "state" / "verifier.key"
    first = load_or_create_signer(path, "verifierd")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = load_or_create_signer(path, "verifierd")
    assert again.key_id == first.key_id
    published = Verifier.load(path.with_name("verifier.key.pub"))
    assert published.key_id == first.key_id


def test_secret_is_created_once(tmp_path: Path) -> None:
    path = tmp_path / "sampling.secret"
    secret = load_or_create_secret(path)
    assert len(secret) == 32 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_or_create_secret(path) == secret


def test_skipped_and_unverifiable() -> None:
    v = unverifiable(sample_verdict(), Reason.NOT_SAMPLED, "rate 0.1")
    assert (v.status, v.reason) == (verifier_pb2.VERDICT_STATUS_SKIPPED, "not_sampled")
    v = unverifiable(sample_verdict(), Reason.NO_SEED, "T=1")
    assert (v.status, v.reason, v.detail) == (
        verifier_pb2.VERDICT_STATUS_UNVERIFIABLE,
        "no_seed",
        "T=1",
    )

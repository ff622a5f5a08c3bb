"""veritap.chain.ChainVerifier: links, origin and key, checkpoints against its own frontier."""

from __future__ import annotations

import pytest
from veritap import merkle
from veritap.chain import (
    BrokenLinkError,
    ChainVerifier,
    CheckpointError,
    EntryFormatError,
)
from veritap.envelope import ZERO_HASH, EnvelopeEncoder, entry_hash
from veritap.note import CheckpointBody, sign_checkpoint
from veritap.signing import Signer
from veritap.v1 import log_pb2

ORIGIN = "collector.test/edge"
SIGNER = Signer.generate(ORIGIN)


def build(count: int, signer: Signer = SIGNER) -> list[bytes]:
    encoder = EnvelopeEncoder(ORIGIN, signer.key_id)
    out, prev = [], ZERO_HASH
    for seq in range(1, count + 1):
        envelope = encoder.encode(seq, prev, 1000 + seq, f"record {seq}".encode())
        out.append(envelope)
        prev = entry_hash(envelope)
    return out


def checkpoint(envelopes: list[bytes], signer: Signer = SIGNER) -> log_pb2.Checkpoint:
    root = merkle.root_of([entry_hash(e) for e in envelopes])
    body = CheckpointBody(ORIGIN, len(envelopes), root)
    return log_pb2.Checkpoint(
        origin=ORIGIN,
        tree_size=len(envelopes),
        root_hash=root,
        note=sign_checkpoint(body, signer),
    )


def fresh() -> ChainVerifier:
    return ChainVerifier(origin=ORIGIN, verifier=SIGNER.verifier())


def test_a_good_log_passes() -> None:
    envelopes = build(20)
    chain = fresh()
    for seq, envelope in enumerate(envelopes, 1):
        chain.add(seq, envelope)
        if seq % 7 == 0:
            chain.check_checkpoint(checkpoint(envelopes[:seq]))
    assert chain.tree_size == 20
    assert chain.head_hash == entry_hash(envelopes[-1])


def test_resuming_mid_log() -> None:
    envelopes = build(10)
    frontier = merkle.Frontier()
    frontier.extend([entry_hash(e) for e in envelopes[:6]])
    chain = ChainVerifier(
        origin=ORIGIN,
        verifier=SIGNER.verifier(),
        next_seq=7,
        prev_hash=entry_hash(envelopes[5]),
        frontier=frontier,
    )
    for seq in range(7, 11):
        chain.add(seq, envelopes[seq - 1])
    chain.check_checkpoint(checkpoint(envelopes))


def test_each_fault_is_named() -> None:
    envelopes = build(5)
    chain = fresh()
    chain.add(1, envelopes[0])
    with pytest.raises(EntryFormatError, match="expected seq 2"):
        chain.add(3, envelopes[2])
    with pytest.raises(EntryFormatError, match="says seq 3"):
        chain.add(2, envelopes[2])
    with pytest.raises(BrokenLinkError) as broken:
        chain.add(2, EnvelopeEncoder(ORIGIN, SIGNER.key_id).encode(2, ZERO_HASH, 1, b"forged"))
    assert broken.value.seq == 2
    other_key = Signer.generate(ORIGIN)
    with pytest.raises(EntryFormatError, match="key id"):
        chain.add(2, build(2, other_key)[1])
    with pytest.raises(EntryFormatError, match="parse"):
        chain.add(2, b"\xff\xff")


def test_checkpoint_faults() -> None:
    envelopes = build(4)
    chain = fresh()
    for seq in range(1, 4):
        chain.add(seq, envelopes[seq - 1])
    with pytest.raises(CheckpointError, match="tree size 4, the chain is at 3"):
        chain.check_checkpoint(checkpoint(envelopes))
    with pytest.raises(CheckpointError, match="none of them trusted"):
        chain.check_checkpoint(checkpoint(envelopes[:3], Signer.generate(ORIGIN)))
    wrong_root = checkpoint([*envelopes[:2], envelopes[0]])
    with pytest.raises(CheckpointError, match="not the Merkle root"):
        chain.check_checkpoint(wrong_root)
    fields_differ = checkpoint(envelopes[:3])
    fields_differ.root_hash = bytes(32)
    with pytest.raises(CheckpointError, match="differ from its signed note"):
        chain.check_checkpoint(fields_differ)
    chain.check_checkpoint(checkpoint(envelopes[:3]))

"""The judgement before intake resumes after an alert (verifierd.intake.resume_check), on
collector answers built by the test: signed checkpoints, real RFC 6962 proofs."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from veritap.merkle import inclusion_proof, root_of
from veritap.note import CheckpointBody, sign_checkpoint
from veritap.signing import Signer
from veritap.v1 import ledger_pb2, log_pb2

from verifierd.intake.resume_check import CollectorView, check_resume
from verifierd.store import Cursor

ORIGIN = "collector.test/edge-1"
SIGNER = Signer.generate(ORIGIN)
KEY = SIGNER.verifier()


def leaves(count: int, *, tag: str = "honest") -> list[bytes]:
    return [hashlib.sha256(f"{tag} {i}".encode()).digest() for i in range(count)]


def checkpoint(log: list[bytes], size: int, signer: Signer = SIGNER) -> log_pb2.Checkpoint:
    root = root_of(log[:size])
    note = sign_checkpoint(CheckpointBody(ORIGIN, size, root), signer)
    return log_pb2.Checkpoint(origin=ORIGIN, tree_size=size, root_hash=root, note=note)


def proof(log: list[bytes], seq: int, size: int) -> ledger_pb2.GetInclusionProofResponse:
    path = inclusion_proof(seq - 1, size, lambda lo, hi: root_of(log[lo:hi]))
    return ledger_pb2.GetInclusionProofResponse(
        seq=seq, tree_size=size, leaf_hash=log[seq - 1], path=path
    )


def stored(log: list[bytes], seq: int, checkpoint_size: int) -> Cursor:
    """What the verifier kept: entries up to ``seq``, its last checkpoint."""
    return Cursor(seq, log[seq - 1], checkpoint(log, checkpoint_size))


def view(
    log: list[bytes], cursor: Cursor, *, head: int, signed: int, floor: int = 1
) -> CollectorView:
    """A collector serving ``log`` up to ``head``, its latest checkpoint of size ``signed``."""
    assert cursor.checkpoint is not None
    return CollectorView(
        head=ledger_pb2.GetHeadResponse(
            origin=ORIGIN, head_seq=head, head_hash=log[head - 1], retention_floor=floor
        ),
        latest=checkpoint(log, signed),
        at_ours=checkpoint(log, cursor.checkpoint.tree_size),
        proof=proof(log, cursor.seq, signed) if floor <= cursor.seq <= signed else None,
        proof_error="" if floor <= cursor.seq <= signed else "not asked",
    )


HONEST = leaves(200)
CURSOR = stored(HONEST, 120, 100)


def test_a_collector_that_holds_every_stored_entry_may_resume() -> None:
    check = check_resume(ORIGIN, CURSOR, KEY, view(HONEST, CURSOR, head=160, signed=150))
    assert check.ok, check.summary
    assert check.summary.startswith("its log agrees up to seq 120; head 160, floor 1")


def test_a_fork_after_our_checkpoint_is_refused() -> None:
    forked = HONEST[:110] + leaves(90, tag="rewritten")
    check = check_resume(ORIGIN, CURSOR, KEY, view(forked, CURSOR, head=160, signed=150))
    assert not check.ok
    assert check.summary.startswith("fork: the collector's entry 120 hashes to")


def test_a_fork_before_our_checkpoint_is_refused() -> None:
    forked = HONEST[:40] + leaves(160, tag="rewritten")
    check = check_resume(ORIGIN, CURSOR, KEY, view(forked, CURSOR, head=160, signed=150))
    assert not check.ok
    assert check.summary.startswith("fork: the collector's checkpoint of size 100 has root")


def test_a_proof_that_does_not_lead_to_the_signed_root_is_refused() -> None:
    answers = view(HONEST, CURSOR, head=160, signed=150)
    assert answers.proof is not None
    bad = ledger_pb2.GetInclusionProofResponse()
    bad.CopyFrom(answers.proof)
    bad.path[0] = bytes(32)
    check = check_resume(ORIGIN, CURSOR, KEY, replace(answers, proof=bad))
    assert not check.ok and "does not lead to its signed root of size 150" in check.summary


def test_a_collector_still_rolled_back_is_refused() -> None:
    check = check_resume(ORIGIN, CURSOR, KEY, view(HONEST, CURSOR, head=110, signed=100))
    assert not check.ok
    assert check.summary.startswith("rollback: the collector's head is seq 110")


def test_a_gap_is_refused_for_good() -> None:
    answers = view(HONEST, CURSOR, head=160, signed=150, floor=130)
    check = check_resume(ORIGIN, CURSOR, KEY, answers)
    assert not check.ok
    assert check.summary.startswith("gap: the collector's log starts at seq 130, so seqs 121..129")


def test_a_pruned_cursor_entry_rests_on_our_checkpoint_and_the_start_check() -> None:
    answers = view(HONEST, CURSOR, head=160, signed=150, floor=121)
    check = check_resume(ORIGIN, CURSOR, KEY, answers)
    assert check.ok, check.summary
    assert "agrees up to seq 100 (seqs 101..120: by its start check)" in check.summary


def test_without_a_checkpoint_of_our_size_the_proof_decides() -> None:
    forked = HONEST[:110] + leaves(90, tag="rewritten")
    for log, ok in ((HONEST, True), (forked, False)):
        answers = replace(
            view(log, CURSOR, head=160, signed=150),
            at_ours=None,
            at_ours_error="NOT_FOUND: no checkpoint of size 100",
        )
        check = check_resume(ORIGIN, CURSOR, KEY, answers)
        assert check.ok == ok, check.summary
    answers = replace(answers, proof=None, proof_error="the collector pruned seq 120")
    check = check_resume(ORIGIN, CURSOR, KEY, answers)
    assert not check.ok
    assert "(NOT_FOUND: no checkpoint of size 100; the collector pruned seq 120)" in check.summary


def test_without_a_checkpoint_or_proof_covering_the_cursor_clearing_waits() -> None:
    cursor = Cursor(30, HONEST[29], None)
    answers = CollectorView(
        head=ledger_pb2.GetHeadResponse(origin=ORIGIN, head_seq=40, retention_floor=1),
        latest=checkpoint(HONEST, 20),
        proof_error="its latest checkpoint (size 20) does not reach seq 30",
    )
    check = check_resume(ORIGIN, cursor, KEY, answers)
    assert not check.ok and check.summary.startswith("nothing shows yet")


def test_checkpoints_signed_by_another_key_are_refused() -> None:
    other = Signer.generate(ORIGIN)
    answers = replace(
        view(HONEST, CURSOR, head=160, signed=150), latest=checkpoint(HONEST, 150, other)
    )
    check = check_resume(ORIGIN, CURSOR, KEY, answers)
    assert not check.ok and "re-pin it (public_key in [[collectors]])" in check.summary
    answers = replace(
        answers, latest=checkpoint(HONEST, 150), at_ours=checkpoint(HONEST, 100, other)
    )
    check = check_resume(ORIGIN, CURSOR, KEY, answers)
    assert not check.ok and "checkpoint of size 100 does not verify" in check.summary


def test_another_origin_or_silence_is_refused() -> None:
    answers = view(HONEST, CURSOR, head=160, signed=150)
    assert answers.head is not None
    elsewhere = ledger_pb2.GetHeadResponse(origin="collector.test/edge-2", head_seq=160)
    check = check_resume(ORIGIN, CURSOR, KEY, replace(answers, head=elsewhere))
    assert not check.ok and "serves origin 'collector.test/edge-2'" in check.summary
    silent = CollectorView(head=None, head_error="UNAVAILABLE: connection refused")
    check = check_resume(ORIGIN, CURSOR, KEY, silent)
    assert not check.ok and "did not answer (UNAVAILABLE: connection refused)" in check.summary


def test_nothing_stored_yet_needs_only_the_origin_and_key() -> None:
    answers = CollectorView(
        head=ledger_pb2.GetHeadResponse(origin=ORIGIN, head_seq=0, retention_floor=1),
        latest_error="NOT_FOUND: no checkpoint yet",
    )
    check = check_resume(ORIGIN, Cursor(0, bytes(32)), KEY, answers)
    assert check.ok and check.summary.startswith("nothing was stored from it yet")


@given(
    stored_seq=st.integers(1, 199),
    checkpoint_size=st.integers(1, 199),
    fork_at=st.integers(1, 200),
    extra=st.integers(0, 60),
)
def test_resuming_is_allowed_exactly_when_the_histories_agree_up_to_the_cursor(
    stored_seq: int, checkpoint_size: int, fork_at: int, extra: int
) -> None:
    """The collector's log forks at ``fork_at`` (its entries from there differ; 200: none
    differs within what is stored). Resuming is allowed iff nothing stored differs."""
    if checkpoint_size > stored_seq:
        checkpoint_size, stored_seq = stored_seq, checkpoint_size
    cursor = stored(HONEST, stored_seq, checkpoint_size)
    theirs = HONEST[: fork_at - 1] + leaves(200 - fork_at + 1, tag="theirs")
    head = min(200, stored_seq + extra)
    check = check_resume(ORIGIN, cursor, KEY, view(theirs, cursor, head=head, signed=head))
    assert check.ok == (fork_at > stored_seq), check.summary


@pytest.mark.parametrize("floor", [1, 50, 120, 121])
def test_the_floor_may_reach_the_first_unstored_seq_and_no_further(floor: int) -> None:
    check = check_resume(
        ORIGIN, CURSOR, KEY, view(HONEST, CURSOR, head=160, signed=150, floor=floor)
    )
    assert check.ok, check.summary

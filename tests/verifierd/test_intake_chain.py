"""The intake's verification step without I/O: honest streams pass, every tampering is caught."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from veritap.chain import ChainVerifier
from veritap.envelope import entry_hash
from veritap.note import CheckpointBody, sign_checkpoint
from veritap.signing import Signer
from veritap.v1 import ledger_pb2, log_pb2

from tests.ledger_fixtures import ORIGIN, append, open_log
from verifierd.intake.backoff import Backoff
from verifierd.intake.chain import IntakeChain, ViolationError


@dataclass(frozen=True)
class Stream:
    """What a Subscribe stream carries, in order: StreamedEntry and Checkpoint messages."""

    signer: Signer
    items: tuple[ledger_pb2.StreamedEntry | log_pb2.Checkpoint, ...]


@pytest.fixture(scope="module")
def stream(tmp_path_factory: pytest.TempPathFactory) -> Stream:
    signer = Signer.generate(ORIGIN)
    log = open_log(tmp_path_factory.mktemp("log"), signer, checkpoint_every=10)
    for first in range(0, 35, 7):
        append(log, first, 7)
    log.close()  # writes the final checkpoint, at 35
    with type(log).open(log.path, origin=ORIGIN, readonly=True) as reader:
        checkpoints = {cp.tree_size: cp for cp in reader.checkpoints_between(1, 35)}
        items: list[ledger_pb2.StreamedEntry | log_pb2.Checkpoint] = []
        for seq, envelope in reader.iter_entries(1):
            items.append(ledger_pb2.StreamedEntry(seq=seq, envelope=envelope))
            if seq in checkpoints:
                items.append(checkpoints[seq])
    assert isinstance(items[-1], log_pb2.Checkpoint)
    return Stream(signer, tuple(items))


def _chain(stream: Stream) -> IntakeChain:
    return IntakeChain(ChainVerifier(origin=ORIGIN, verifier=stream.signer.verifier()), None)


def _feed(
    chain: IntakeChain, items: tuple[ledger_pb2.StreamedEntry | log_pb2.Checkpoint, ...]
) -> None:
    for item in items:
        if isinstance(item, log_pb2.Checkpoint):
            chain.accept_checkpoint(item)
        else:
            chain.accept_entries([item])


def _entry_positions(stream: Stream) -> list[int]:
    return [i for i, item in enumerate(stream.items) if isinstance(item, ledger_pb2.StreamedEntry)]


def test_an_honest_stream_passes_and_yields_what_the_store_takes(stream: Stream) -> None:
    chain = _chain(stream)
    verified = []
    for item in stream.items:
        if isinstance(item, log_pb2.Checkpoint):
            chain.accept_checkpoint(item)
        else:
            verified.extend(chain.accept_entries([item]))
    assert [seq for seq, _, _ in verified] == list(range(1, 36))
    assert all(digest == entry_hash(envelope) for _, envelope, digest in verified)
    assert chain.last_checkpoint is not None and chain.last_checkpoint.tree_size == 35


def test_filtered_entries_still_verify_against_the_checkpoints(stream: Stream) -> None:
    items = tuple(
        ledger_pb2.StreamedEntry(seq=item.seq, filtered_hash=entry_hash(item.envelope))
        if isinstance(item, ledger_pb2.StreamedEntry) and item.seq % 3 == 0
        else item
        for item in stream.items
    )
    chain = _chain(stream)
    _feed(chain, items)
    assert chain.size == 35


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_flipped_bit_in_any_entry_is_caught(stream: Stream, data: st.DataObject) -> None:
    position = data.draw(st.sampled_from(_entry_positions(stream)))
    original = stream.items[position]
    assert isinstance(original, ledger_pb2.StreamedEntry)
    filtered = data.draw(st.booleans())
    body = entry_hash(original.envelope) if filtered else original.envelope
    bit = data.draw(st.integers(0, len(body) * 8 - 1))
    tampered = bytearray(body)
    tampered[bit // 8] ^= 1 << (bit % 8)
    entry = ledger_pb2.StreamedEntry(seq=original.seq)
    if filtered:
        entry.filtered_hash = bytes(tampered)
    else:
        entry.envelope = bytes(tampered)
    items = (*stream.items[:position], entry, *stream.items[position + 1 :])
    with pytest.raises(ViolationError) as caught:
        _feed(_chain(stream), items)
    assert caught.value.reason in {"bad_entry", "bad_hash", "fork"}


@pytest.mark.parametrize("change", ["skip", "repeat", "swap"])
def test_a_missing_repeated_or_reordered_entry_is_a_gap(stream: Stream, change: str) -> None:
    positions = _entry_positions(stream)
    a, b = positions[4], positions[5]
    items = list(stream.items)
    if change == "skip":
        del items[a]
    elif change == "repeat":
        items.insert(a, items[a])
    else:
        items[a], items[b] = items[b], items[a]
    with pytest.raises(ViolationError) as caught:
        _feed(_chain(stream), tuple(items))
    assert caught.value.reason == "gap"
    assert caught.value.entries  # the offending entry is kept


def _replace_checkpoint(
    stream: Stream, size: int, new: log_pb2.Checkpoint
) -> tuple[ledger_pb2.StreamedEntry | log_pb2.Checkpoint, ...]:
    return tuple(
        new if isinstance(i, log_pb2.Checkpoint) and i.tree_size == size else i
        for i in stream.items
    )


def test_a_checkpoint_signed_by_another_key_is_a_bad_signature(stream: Stream) -> None:
    other = Signer.generate(ORIGIN)
    honest = next(i for i in stream.items if isinstance(i, log_pb2.Checkpoint))
    body = CheckpointBody(ORIGIN, honest.tree_size, honest.root_hash)
    forged = log_pb2.Checkpoint()
    forged.CopyFrom(honest)
    forged.note = sign_checkpoint(body, other)
    with pytest.raises(ViolationError) as caught:
        _feed(_chain(stream), _replace_checkpoint(stream, honest.tree_size, forged))
    assert caught.value.reason == "bad_signature"
    assert caught.value.checkpoints[-1] == forged


def test_a_signed_root_that_disagrees_with_the_entries_is_a_fork(stream: Stream) -> None:
    checkpoints = [i for i in stream.items if isinstance(i, log_pb2.Checkpoint)]
    first, second = checkpoints[0], checkpoints[1]
    root = bytes(random.Random(1).randbytes(32))
    # The collector's own key signed a root its entries do not have: it rewrote history.
    lying = log_pb2.Checkpoint(
        origin=ORIGIN,
        tree_size=second.tree_size,
        root_hash=root,
        note=sign_checkpoint(CheckpointBody(ORIGIN, second.tree_size, root), stream.signer),
    )
    with pytest.raises(ViolationError) as caught:
        _feed(_chain(stream), _replace_checkpoint(stream, second.tree_size, lying))
    violation = caught.value
    assert violation.reason == "fork"
    assert list(violation.checkpoints) == [first, lying]
    assert [e.seq for e in violation.entries] == list(
        range(first.tree_size + 1, second.tree_size + 1)
    )


def test_a_misplaced_or_inconsistent_checkpoint_is_refused(stream: Stream) -> None:
    honest = next(i for i in stream.items if isinstance(i, log_pb2.Checkpoint))
    chain = _chain(stream)
    entries = [i for i in stream.items if isinstance(i, ledger_pb2.StreamedEntry)]
    chain.accept_entries(entries[: honest.tree_size - 1])
    with pytest.raises(ViolationError, match="bad_checkpoint"):
        chain.accept_checkpoint(honest)
    chain.accept_entries([entries[honest.tree_size - 1]])
    wrong_fields = log_pb2.Checkpoint()
    wrong_fields.CopyFrom(honest)
    wrong_fields.root_hash = bytes(32)
    with pytest.raises(ViolationError, match="bad_checkpoint"):
        chain.accept_checkpoint(wrong_fields)
    chain.accept_checkpoint(honest)


def test_backoff_grows_with_jitter_up_to_the_cap_and_resets() -> None:
    backoff = Backoff(initial_s=0.1, maximum_s=1.0, rng=random.Random(7))
    delays = [backoff.next_delay() for _ in range(12)]
    assert all(0.05 <= d <= 1.0 for d in delays)
    assert max(delays[:1]) <= 0.1 and max(delays[-4:]) > 0.1
    backoff.reset()
    assert backoff.next_delay() <= 0.1

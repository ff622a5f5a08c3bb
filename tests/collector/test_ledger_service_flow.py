"""The stream's flow control core: batch cutting and the acknowledgement window."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collector.ledger.errors import AckError
from collector.ledger.flow import Batch, SendWindow, plan_batches


@given(
    first=st.integers(1, 10_000),
    sizes=st.lists(st.integers(1, 5000), max_size=300),
    max_entries=st.integers(1, 64),
    max_bytes=st.integers(4096, 20_000),
    data=st.data(),
)
def test_batches_cover_the_run_in_order_within_limits(
    first: int, sizes: list[int], max_entries: int, max_bytes: int, data: st.DataObject
) -> None:
    seqs = range(first, first + len(sizes))
    checkpoints = set(data.draw(st.lists(st.sampled_from(seqs), unique=True))) if sizes else set()
    batches = plan_batches(first, sizes, checkpoints, max_entries=max_entries, max_bytes=max_bytes)
    covered = [seq for b in batches for seq in range(b.first, b.last + 1)]
    assert covered == list(seqs)
    for batch in batches:
        count = batch.last - batch.first + 1
        size = sum(sizes[batch.first - first : batch.last - first + 1])
        assert 1 <= count <= max_entries
        assert size <= max_bytes or count == 1
        assert batch.checkpoint_after == (batch.last in checkpoints)
    # Every checkpoint ends a batch, so it follows exactly the entry it covers.
    assert checkpoints <= {b.last for b in batches if b.checkpoint_after}


def test_a_checkpoint_splits_a_batch_and_an_oversized_entry_travels_alone() -> None:
    batches = plan_batches(5, [10, 10, 2000, 10], {6}, max_entries=64, max_bytes=1000)
    assert batches == [
        Batch(5, 6, checkpoint_after=True),
        Batch(7, 7, checkpoint_after=False),
        Batch(8, 8, checkpoint_after=False),
    ]


def test_window_limits_unacknowledged_entries() -> None:
    window = SendWindow(next_seq=11, window=4)
    assert window.room() == 4
    window.mark_sent(14)
    assert window.room() == 0
    with pytest.raises(ValueError):
        window.mark_sent(15)
    assert window.ack(12)
    assert window.room() == 2
    assert not window.ack(12)
    window.mark_sent(16)
    assert window.sent == 16


def test_window_rejects_acks_of_unsent_or_backwards_seqs() -> None:
    window = SendWindow(next_seq=1, window=8)
    window.mark_sent(3)
    with pytest.raises(AckError):
        window.ack(4)
    window.ack(3)
    with pytest.raises(AckError):
        window.ack(2)

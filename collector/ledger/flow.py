"""Flow control of one subscription, sans I/O: the ack window and how entries are cut into batches.

`SendWindow` counts entries sent but not yet acknowledged and says how many more may go
out. `plan_batches` cuts a run of consecutive entries into batches of at most
`max_entries` entries and `max_bytes` bytes, ending a batch wherever a checkpoint's tree
size falls so the checkpoint can follow exactly the entry it covers.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from collector.ledger.errors import AckError


@dataclass(frozen=True)
class Batch:
    """Entries `first..last` inclusive; with `checkpoint_after` the checkpoint of size `last`."""

    first: int
    last: int
    checkpoint_after: bool


class SendWindow:
    """At most `window` entries in flight between the last acknowledged seq and the last sent."""

    def __init__(self, next_seq: int, window: int) -> None:
        if next_seq < 1 or window < 1:
            raise ValueError("next_seq and window must be >= 1")
        self.window = window
        self.next_seq = next_seq
        self.acked = next_seq - 1

    @property
    def sent(self) -> int:
        """The last seq handed to the transport."""
        return self.next_seq - 1

    def room(self) -> int:
        return self.window - (self.sent - self.acked)

    def mark_sent(self, last_seq: int) -> None:
        if last_seq < self.next_seq or last_seq - self.acked > self.window:
            raise ValueError(
                f"cannot send up to {last_seq}: next {self.next_seq}, room {self.room()}"
            )
        self.next_seq = last_seq + 1

    def ack(self, durable_seq: int) -> bool:
        """Record an acknowledgement; True when it moved the window."""
        if durable_seq > self.sent:
            raise AckError(f"ack of seq {durable_seq}, but only up to {self.sent} was sent")
        if durable_seq < self.acked:
            raise AckError(f"ack went backwards from {self.acked} to {durable_seq}")
        moved = durable_seq > self.acked
        self.acked = durable_seq
        return moved


def plan_batches(
    first_seq: int,
    sizes: Sequence[int],
    checkpoint_sizes: Collection[int],
    *,
    max_entries: int,
    max_bytes: int,
) -> list[Batch]:
    """Cut entries `first_seq, first_seq+1, ...` (with encoded `sizes`) into batches.

    A batch ends after `max_entries` entries, before the entry that would take it past
    `max_bytes` (an entry larger than `max_bytes` travels alone), and after any entry
    whose seq is a checkpoint's tree size (then `checkpoint_after` is set).
    """
    batches: list[Batch] = []
    start = first_seq
    count = 0
    total = 0
    for offset, size in enumerate(sizes):
        seq = first_seq + offset
        if count and (count == max_entries or total + size > max_bytes):
            batches.append(Batch(start, seq - 1, checkpoint_after=False))
            start, count, total = seq, 0, 0
        count += 1
        total += size
        if seq in checkpoint_sizes:
            batches.append(Batch(start, seq, checkpoint_after=True))
            start, count, total = seq + 1, 0, 0
    if count:
        batches.append(Batch(start, first_seq + len(sizes) - 1, checkpoint_after=False))
    return batches

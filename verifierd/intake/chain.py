"""The intake's verification step, sans I/O: streamed entries and checkpoints in, evidence out.

`IntakeChain` drives the shared `veritap.chain.ChainVerifier` (chain links, the pinned
key, the Merkle root of every checkpoint) with what arrives on a Subscribe stream, and
turns each failure into a `ViolationError` that names its reason and carries the evidence:
the offending entries, the last checkpoint verified and the one that contradicts it. An
entry filtered out by model arrives as its hash only; its content cannot be checked, but
the next full entry's prev_hash and the next checkpoint's root cover it.
"""

from __future__ import annotations

from collections.abc import Iterable

from veritap.chain import BrokenLinkError, ChainError, ChainVerifier, CheckpointError
from veritap.merkle import HASH_SIZE
from veritap.note import NoteError, parse_checkpoint, parse_note
from veritap.v1 import ledger_pb2, log_pb2

from verifierd.errors import VerifierdError
from verifierd.intake.alert_reasons import AlertReason
from verifierd.intake.wire import EntryPart

# Leaf hashes kept since the last verified checkpoint, as evidence if its root disagrees.
MAX_UNCHECKPOINTED_HASHES = 1 << 20


class IntakeError(VerifierdError):
    """Base of the intake's errors."""


class ViolationError(IntakeError):
    """The collector's log, or what was stored of it, is contradicted: stop, keep evidence."""

    def __init__(
        self,
        reason: AlertReason,
        detail: str,
        *,
        entries: tuple[ledger_pb2.StreamedEntry, ...] = (),
        checkpoints: tuple[log_pb2.Checkpoint, ...] = (),
        remote_hash: bytes = b"",
    ) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.entries = entries
        self.checkpoints = checkpoints
        self.remote_hash = remote_hash


def _streamed(seq: int, filtered: bool | None, data: bytes) -> ledger_pb2.StreamedEntry:
    """The entry as it was streamed, for evidence."""
    if filtered is None:
        return ledger_pb2.StreamedEntry(seq=seq)
    if filtered:
        return ledger_pb2.StreamedEntry(seq=seq, filtered_hash=data)
    return ledger_pb2.StreamedEntry(seq=seq, envelope=data)


def _signed_root(checkpoint: log_pb2.Checkpoint) -> tuple[int, bytes] | None:
    """Tree size and root as the (already signature-checked) note states them."""
    try:
        body = parse_checkpoint(parse_note(checkpoint.note).text)
    except NoteError:
        return None
    return body.tree_size, body.root_hash


class IntakeChain:
    """What this verifier knows of one collector's log, advanced by what the stream brings."""

    def __init__(self, verifier: ChainVerifier, last_checkpoint: log_pb2.Checkpoint | None) -> None:
        self._chain = verifier
        self.last_checkpoint = last_checkpoint
        # Leaf hashes of entries _since_first, _since_first + 1, ... since the last checkpoint.
        self._since_first = verifier.next_seq
        self._since_checkpoint: list[bytes] = []

    @property
    def size(self) -> int:
        """How many entries were accepted (the seq of the last one)."""
        return self._chain.tree_size

    @property
    def last_hash(self) -> bytes:
        return self._chain.head_hash

    def frontier_bytes(self) -> bytes:
        return self._chain.frontier.to_bytes()

    def _earlier(self) -> tuple[log_pb2.Checkpoint, ...]:
        return () if self.last_checkpoint is None else (self.last_checkpoint,)

    def _refuse(
        self, reason: AlertReason, detail: str, streamed: ledger_pb2.StreamedEntry
    ) -> ViolationError:
        return ViolationError(reason, detail, entries=(streamed,), checkpoints=self._earlier())

    def accept_entries(
        self, batch: Iterable[ledger_pb2.StreamedEntry]
    ) -> list[tuple[int, bytes, bytes]]:
        """Check a batch of entries in order; returns (seq, envelope, entry hash) per entry,
        the form `Store.ingest` takes (an empty envelope for an entry filtered out)."""
        parts: list[EntryPart | tuple[int, None, bytes]] = []
        for streamed in batch:
            kind = streamed.WhichOneof("body")
            if kind == "envelope":
                parts.append((streamed.seq, False, streamed.envelope))
            elif kind == "filtered_hash":
                parts.append((streamed.seq, True, streamed.filtered_hash))
            else:
                parts.append((streamed.seq, None, b""))
        return self.accept_parts(parts)

    def accept_parts(
        self, parts: Iterable[EntryPart | tuple[int, None, bytes]]
    ) -> list[tuple[int, bytes, bytes]]:
        """`accept_entries` for entries already taken apart: (seq, filtered, bytes), where
        filtered is None for an entry that carried neither an envelope nor a hash."""
        chain = self._chain
        link = chain.link
        kept = self._since_checkpoint
        out: list[tuple[int, bytes, bytes]] = []
        for seq, filtered, data in parts:
            if seq != chain.next_seq:
                raise self._refuse(
                    AlertReason.GAP,
                    f"received seq {seq} where seq {chain.next_seq} was due",
                    _streamed(seq, filtered, data),
                )
            envelope = data
            if filtered is False:
                try:
                    digest = link(seq, data)
                except ChainError as exc:
                    reason = (
                        AlertReason.BAD_HASH
                        if isinstance(exc, BrokenLinkError)
                        else AlertReason.BAD_ENTRY
                    )
                    raise self._refuse(reason, str(exc), _streamed(seq, filtered, data)) from exc
            elif filtered and len(data) == HASH_SIZE:
                digest = data
                envelope = b""
                chain.frontier.append(digest)
                chain.head_hash = digest
                chain.next_seq = seq + 1
            else:
                raise self._refuse(
                    AlertReason.BAD_ENTRY,
                    f"seq {seq} has neither an envelope nor a 32-byte hash",
                    _streamed(seq, filtered, data),
                )
            if len(kept) < MAX_UNCHECKPOINTED_HASHES:
                kept.append(digest)
            out.append((seq, envelope, digest))
        return out

    def accept_checkpoint(self, checkpoint: log_pb2.Checkpoint) -> None:
        checkpoints = (*self._earlier(), checkpoint)
        try:
            self._chain.check_checkpoint(checkpoint)
        except CheckpointError as exc:
            if isinstance(exc.__cause__, NoteError):
                raise ViolationError(
                    AlertReason.BAD_SIGNATURE, str(exc), checkpoints=checkpoints
                ) from exc
            signed = _signed_root(checkpoint)
            if signed is None or signed[0] != self.size or signed[1] == self._chain.frontier.root():
                raise ViolationError(
                    AlertReason.BAD_CHECKPOINT, str(exc), checkpoints=checkpoints
                ) from exc
            raise ViolationError(
                AlertReason.FORK,
                f"{exc} (the entries since the last checkpoint are listed by hash)",
                entries=tuple(
                    ledger_pb2.StreamedEntry(seq=self._since_first + i, filtered_hash=h)
                    for i, h in enumerate(self._since_checkpoint)
                ),
                checkpoints=checkpoints,
            ) from exc
        self.last_checkpoint = checkpoint
        self._since_checkpoint.clear()
        self._since_first = checkpoint.tree_size + 1

"""Checking a collector's log as it is read or received: chain links, Merkle root, checkpoints.

`ChainVerifier` is sans-IO: feed it (seq, envelope bytes) in order and the
checkpoints at their positions; it raises a `ChainError` subclass, carrying
the seq it concerns, at the first thing that is wrong. Both `collector log
verify` and verifierd's intake use it.
"""

from __future__ import annotations

from veritap.envelope import (
    ZERO_HASH,
    EnvelopeError,
    EnvelopeMatcher,
    decode_envelope,
    entry_hash,
)
from veritap.merkle import Frontier
from veritap.note import CheckpointBody, NoteError, open_checkpoint
from veritap.signing import Verifier
from veritap.v1 import log_pb2


class ChainError(Exception):
    """Something is wrong at position `seq` of the log."""

    def __init__(self, seq: int, reason: str) -> None:
        super().__init__(f"seq {seq}: {reason}")
        self.seq = seq
        self.reason = reason


class EntryFormatError(ChainError):
    """The envelope does not decode, or its seq, origin or key id is not the expected one."""


class BrokenLinkError(ChainError):
    """The entry's prev_hash is not the hash of the entry before it (a fork or an edit)."""


class CheckpointError(ChainError):
    """A checkpoint is malformed, not signed by the pinned key, or names another root or size.

    `seq` is the checkpoint's tree size.
    """


class ChainVerifier:
    """Follows one log from a known position, checking every entry and checkpoint."""

    def __init__(
        self,
        *,
        origin: str,
        verifier: Verifier,
        next_seq: int = 1,
        prev_hash: bytes = ZERO_HASH,
        frontier: Frontier | None = None,
    ) -> None:
        frontier = frontier if frontier is not None else Frontier()
        if frontier.size != next_seq - 1:
            raise ValueError(f"frontier of size {frontier.size} cannot precede seq {next_seq}")
        self.origin = origin
        self.verifier = verifier
        self.next_seq = next_seq
        self.head_hash = prev_hash
        self.frontier = frontier
        self._matcher = EnvelopeMatcher(origin, verifier.key_id)

    @property
    def tree_size(self) -> int:
        return self.next_seq - 1

    def add(self, seq: int, envelope: bytes) -> log_pb2.Entry:
        """Check the next entry and take it into the chain; returns the decoded envelope."""
        if seq != self.next_seq:
            raise EntryFormatError(self.next_seq, f"expected seq {self.next_seq}, got seq {seq}")
        try:
            entry = decode_envelope(envelope)
        except EnvelopeError as exc:
            raise EntryFormatError(seq, str(exc)) from exc
        if entry.seq != seq:
            raise EntryFormatError(seq, f"envelope stored at seq {seq} says seq {entry.seq}")
        if entry.origin != self.origin:
            raise EntryFormatError(seq, f"envelope origin {entry.origin!r} is not {self.origin!r}")
        if entry.key_id != self.verifier.key_id:
            raise EntryFormatError(
                seq,
                f"envelope key id {entry.key_id.hex() or '(none)'} is not the pinned key's "
                f"{self.verifier.key_id.hex()}",
            )
        if entry.prev_hash != self.head_hash:
            raise BrokenLinkError(
                seq,
                f"prev_hash {entry.prev_hash.hex()} is not the hash of seq {seq - 1} "
                f"({self.head_hash.hex()})",
            )
        leaf = entry_hash(envelope)
        self.frontier.append(leaf)
        self.head_hash = leaf
        self.next_seq = seq + 1
        return entry

    def link(self, seq: int, envelope: bytes) -> bytes:
        """`add` without building the Entry: the same checks, returning the entry hash.

        The usual envelope is recognized byte for byte (`EnvelopeMatcher`: seq, link,
        origin, key id and canonical form at once); any other goes through `add`, which
        decodes it and raises the precise error, or accepts a valid but unusual one.
        """
        if seq != self.next_seq or not self._matcher.matches(envelope, seq, self.head_hash):
            self.add(seq, envelope)
            return self.head_hash
        leaf = entry_hash(envelope)
        self.frontier.append(leaf)
        self.head_hash = leaf
        self.next_seq = seq + 1
        return leaf

    def check_checkpoint(self, checkpoint: log_pb2.Checkpoint) -> CheckpointBody:
        """Verify a checkpoint for the entries taken so far (its tree size must be that count)."""
        size = checkpoint.tree_size
        try:
            body = open_checkpoint(checkpoint.note, self.verifier, origin=self.origin)
        except NoteError as exc:
            raise CheckpointError(size, f"checkpoint note: {exc}") from exc
        if (body.origin, body.tree_size, body.root_hash) != (
            checkpoint.origin,
            checkpoint.tree_size,
            checkpoint.root_hash,
        ):
            raise CheckpointError(size, "checkpoint fields differ from its signed note")
        if body.tree_size != self.tree_size:
            raise CheckpointError(
                size,
                f"checkpoint is for tree size {body.tree_size}, the chain is at {self.tree_size}",
            )
        root = self.frontier.root()
        if body.root_hash != root:
            raise CheckpointError(
                size,
                f"signed root {body.root_hash.hex()} is not the Merkle root {root.hex()} of "
                f"the entries received",
            )
        return body

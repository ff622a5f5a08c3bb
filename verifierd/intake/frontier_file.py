"""Where the intake keeps its Merkle frontier between runs, and how it rebuilds it.

The store's cursor (last seq and hash, last verified checkpoint) is written in the same
transaction as the entries; the frontier the intake needs to check the next checkpoint is
not. It is saved beside the store after the first ingest of a session and then about once
a second (see `link.FRONTIER_SAVE_S`), atomically (write, rename), tagged
with the size and last hash it covers. On start the intake loads it and replays the
stored entry hashes from there to the cursor; a missing, foreign or newer-than-the-store
file falls back to replaying from seq 1. Losing the file therefore costs time, never
correctness, and no fsync is needed.

The store's disk is not trusted either: the stored checkpoint must verify under the
collector's pinned key, and when the replay passes its tree size the rebuilt root must be
its signed root; otherwise intake stops with an alert (`ViolationError`).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from urllib.parse import quote

from veritap.chain import ChainVerifier
from veritap.merkle import HASH_SIZE, Frontier, FrontierFormatError
from veritap.signing import Verifier

from verifierd.intake.alert_reasons import AlertReason
from verifierd.intake.chain import IntakeError, ViolationError
from verifierd.intake.stored_entries import StoredCheckpointError, open_stored_checkpoint
from verifierd.store import Cursor, Store

_log = logging.getLogger(__name__)
_MAGIC = b"veritap-frontier-1\n"


class FrontierFile:
    def __init__(self, directory: Path, origin: str) -> None:
        self.path = directory / f"{quote(origin, safe='')}.frontier"
        self._directory_made = False

    def save(self, last_hash: bytes, frontier: bytes) -> None:
        if not self._directory_made:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._directory_made = True
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(_MAGIC + last_hash + frontier)
        tmp.replace(self.path)

    def load(self) -> tuple[bytes, Frontier] | None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        if not data.startswith(_MAGIC):
            return None
        body = data[len(_MAGIC) :]
        try:
            return body[:HASH_SIZE], Frontier.from_bytes(body[HASH_SIZE:])
        except (FrontierFormatError, ValueError):
            return None


def recover_chain(
    store: Store, origin: str, key: Verifier, cursor: Cursor, saved: FrontierFile
) -> ChainVerifier:
    """A verifier positioned at the store's cursor, its frontier rebuilt and cross-checked.

    Raises ViolationError when the stored checkpoint is forged or the stored entries do
    not lead to its root."""
    checkpoint = cursor.checkpoint
    if checkpoint is not None:
        try:
            open_stored_checkpoint(checkpoint, key, origin)
        except StoredCheckpointError as exc:
            raise ViolationError(
                AlertReason.STORED_CHECKPOINT_FORGED, str(exc), checkpoints=(checkpoint,)
            ) from exc
    frontier = Frontier()
    loaded = saved.load()
    if loaded is not None:
        last_hash, candidate = loaded
        at = store.entry(origin, candidate.size) if 0 < candidate.size <= cursor.seq else None
        if at is not None and at.entry_hash == last_hash:
            frontier = candidate
    if cursor.seq - frontier.size > 0:
        _log.info(
            "replaying stored entry hashes to rebuild the frontier",
            extra={"origin": origin, "from_seq": frontier.size + 1, "to_seq": cursor.seq},
        )
    for seq in range(frontier.size + 1, cursor.seq + 1):
        stored = store.entry(origin, seq)
        if stored is None:
            raise IntakeError(
                f"{origin}: stored entry {seq} is missing; cannot rebuild the frontier"
            )
        frontier.append(stored.entry_hash)
        if (
            checkpoint is not None
            and seq == checkpoint.tree_size
            and frontier.root() != checkpoint.root_hash
        ):
            raise ViolationError(
                AlertReason.STORED_ENTRIES_ALTERED,
                f"the stored entry hashes do not lead to the signed root of checkpoint {seq}",
                checkpoints=(checkpoint,),
            )
    return ChainVerifier(
        origin=origin,
        verifier=key,
        next_seq=cursor.seq + 1,
        prev_hash=cursor.hash,
        frontier=frontier,
    )

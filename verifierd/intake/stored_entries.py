"""Authenticating entries read back from the store before they are judged.

The intake checked every entry and checkpoint as it arrived, but the store's disk is not
trusted: an entry is judged only once this module has shown, from the bytes just read,
that its collector signed it. For each origin it keeps a Merkle frontier of the entries
already authenticated. When the store's inbox offers entries covered by a newer stored
checkpoint, that checkpoint's signature is verified with the collector's pinned key, the
stored entry hashes since the frontier are read in one transaction and must lead to the
signed root, and each offered envelope must hash to its authenticated entry hash. The
verdict then names that checkpoint (tree size and root).

What fails is evidence, never a verdict: a forged stored checkpoint or stored hashes that
miss the signed root stop judging the origin (an alert, `OriginAlert`); an envelope that
does not hash to its authenticated hash is set aside with an alert (`Tampered`).

Between classification and scoring an entry waits in the store's queue, so the classifier
tags it (`pending_tag`: an HMAC under the verifier's secret over the authenticated entry
hash and checkpoint) and scoring re-hashes the envelope and checks the tag: an entry, hash
or named checkpoint edited while it waited is set aside the same way.

The first pass over an origin after a start reads every stored entry hash from seq 1
(32 bytes each, no envelope); later passes read only what the newer checkpoint adds. The
authenticated hashes of entries still waiting in the inbox are kept in memory until they
are judged.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import struct
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from veritap.envelope import entry_hash
from veritap.merkle import Frontier
from veritap.note import CheckpointBody, NoteError, open_checkpoint
from veritap.signing import Verifier
from veritap.v1 import ledger_pb2, log_pb2

from verifierd.intake.alert_reasons import AlertReason
from verifierd.store import Store, StoredEntry, StoreError, Tampered, ekey

log = logging.getLogger(__name__)


_TAG_CONTEXT = b"veritap pending entry v1\x00"


def pending_tag(
    secret: bytes,
    *,
    origin: str,
    seq: int,
    entry_hash: bytes,
    checkpoint_tree_size: int,
    checkpoint_root_hash: bytes,
) -> bytes:
    """The MAC a queued entry carries from classification to scoring."""
    message = (
        _TAG_CONTEXT
        + ekey(origin, seq)
        + entry_hash
        + struct.pack(">Q", checkpoint_tree_size)
        + checkpoint_root_hash
    )
    return hmac.new(secret, message, hashlib.sha256).digest()


class StoredCheckpointError(Exception):
    """A stored checkpoint does not verify under the collector's pinned key."""


def open_stored_checkpoint(
    checkpoint: log_pb2.Checkpoint, key: Verifier, origin: str
) -> CheckpointBody:
    """The signed body of a checkpoint read from the store, once its note verifies under
    ``key`` for ``origin`` and the stored fields say what the note signs."""
    try:
        body = open_checkpoint(checkpoint.note, key, origin=origin)
    except NoteError as exc:
        raise StoredCheckpointError(f"stored checkpoint {checkpoint.tree_size}: {exc}") from exc
    if (body.origin, body.tree_size, body.root_hash) != (
        checkpoint.origin,
        checkpoint.tree_size,
        checkpoint.root_hash,
    ):
        raise StoredCheckpointError(
            f"stored checkpoint {checkpoint.tree_size}: its fields differ from its signed note"
        )
    return body


@dataclass(frozen=True)
class AuthenticEntry:
    """A stored entry shown to be the one its collector signed, and the proof's checkpoint."""

    entry: StoredEntry
    checkpoint_tree_size: int
    checkpoint_root_hash: bytes


@dataclass(frozen=True)
class OriginAlert:
    """Judging from ``origin`` must stop: what was stored of its log is not what it signed."""

    origin: str
    reason: AlertReason
    detail: str
    #: IntakeEvidence bytes, as the store keeps them.
    evidence: bytes


@dataclass(frozen=True)
class Authentication:
    authentic: tuple[AuthenticEntry, ...]
    tampered: tuple[Tampered, ...]
    alerts: tuple[OriginAlert, ...]


@dataclass
class _OriginState:
    #: Leaves 1..frontier.size are authenticated by `checkpoint`.
    frontier: Frontier = field(default_factory=Frontier)
    checkpoint: CheckpointBody | None = None
    #: Authenticated hashes of entries with an envelope not judged yet, by seq.
    waiting: dict[int, bytes] = field(default_factory=dict)


def evidence(
    origin: str,
    reason: AlertReason,
    detail: str,
    *,
    checkpoint: log_pb2.Checkpoint | None,
    entries: Sequence[StoredEntry] = (),
    expected_hash: bytes = b"",
) -> bytes:
    """IntakeEvidence for an alert about what was stored (``expected_hash``: the hash the
    signed checkpoint authenticates, where a stored entry disagrees with it)."""
    return ledger_pb2.IntakeEvidence(
        origin=origin,
        reason=reason,
        detail=detail,
        checkpoints=[] if checkpoint is None else [checkpoint],
        entries=[ledger_pb2.StreamedEntry(seq=e.seq, envelope=e.envelope) for e in entries],
        remote_hash=expected_hash,
        detected_at_ns=time.time_ns(),
    ).SerializeToString()


class StoredEntryAuthenticator:
    """Shows that inbox entries are what their collectors signed (see the module docstring).

    Not thread-safe: the pipeline's thread owns it."""

    def __init__(self, store: Store, keys: Mapping[str, Verifier]) -> None:
        self._store = store
        self._keys = dict(keys)
        self._origins: dict[str, _OriginState] = {}
        self._unpinned_logged: set[str] = set()

    def authenticate(self, entries: Sequence[StoredEntry]) -> Authentication:
        """Sort ``entries`` (the store's inbox, by origin then seq) into those that may be
        judged, those set aside as tampered, and alerts for origins that must stop."""
        authentic: list[AuthenticEntry] = []
        tampered: list[Tampered] = []
        alerts: list[OriginAlert] = []
        by_origin: dict[str, list[StoredEntry]] = {}
        for entry in entries:
            by_origin.setdefault(entry.origin, []).append(entry)
        for origin, group in by_origin.items():
            key = self._keys.get(origin)
            if key is None:
                if origin not in self._unpinned_logged:
                    self._unpinned_logged.add(origin)
                    log.error(
                        "no pinned collector key for this origin: its entries are not judged",
                        extra={"origin": origin},
                    )
                continue
            alert = self._authenticate_origin(origin, key, group, authentic, tampered)
            if alert is not None:
                self._origins.pop(origin, None)
                alerts.append(alert)
        return Authentication(tuple(authentic), tuple(tampered), tuple(alerts))

    def _authenticate_origin(
        self,
        origin: str,
        key: Verifier,
        group: Sequence[StoredEntry],
        authentic: list[AuthenticEntry],
        tampered: list[Tampered],
    ) -> OriginAlert | None:
        """Authenticate one origin's offered entries into ``authentic`` and ``tampered``;
        returns the alert that stops judging it, if any."""
        state = self._origins.setdefault(origin, _OriginState())
        checkpoint = self._store.cursor(origin).checkpoint
        if checkpoint is not None and checkpoint.tree_size > state.frontier.size:
            try:
                body = open_stored_checkpoint(checkpoint, key, origin)
            except StoredCheckpointError as exc:
                return _origin_alert(
                    origin, AlertReason.STORED_CHECKPOINT_FORGED, str(exc), checkpoint
                )
            try:
                self._advance(state, origin, body, first_waiting=group[0].seq)
            except StoreError as exc:
                return _origin_alert(
                    origin, AlertReason.STORED_ENTRIES_ALTERED, str(exc), checkpoint
                )
            if state.checkpoint is not body:
                detail = (
                    f"the stored entry hashes up to seq {body.tree_size} do not lead to the "
                    f"signed root {body.root_hash.hex()}"
                )
                return _origin_alert(origin, AlertReason.STORED_ENTRIES_ALTERED, detail, checkpoint)
        signed = state.checkpoint
        if signed is None:
            return None
        for entry in group:
            expected = state.waiting.pop(entry.seq, None)
            if expected is None:
                # Not among the hashes kept at the last pass: authenticate afresh next time.
                self._origins.pop(origin, None)
                return None
            if entry.entry_hash == expected and entry_hash(entry.envelope) == expected:
                authentic.append(AuthenticEntry(entry, signed.tree_size, signed.root_hash))
                continue
            assert checkpoint is not None, "an authenticated origin has a stored checkpoint"
            detail = (
                f"stored entry {entry.seq} does not hash to {expected.hex()}, the entry hash "
                f"checkpoint {signed.tree_size} authenticates"
            )
            tampered.append(
                Tampered(
                    origin,
                    entry.seq,
                    AlertReason.STORED_ENVELOPE_ALTERED,
                    evidence(
                        origin,
                        AlertReason.STORED_ENVELOPE_ALTERED,
                        detail,
                        checkpoint=checkpoint,
                        entries=(entry,),
                        expected_hash=expected,
                    ),
                )
            )
        return None

    def _advance(
        self, state: _OriginState, origin: str, body: CheckpointBody, *, first_waiting: int
    ) -> None:
        """Extend the frontier to the signed checkpoint ``body`` when the stored hashes
        lead to its root (state.checkpoint becomes ``body``); else leave it as it was."""
        first = state.frontier.size + 1
        leaves = self._store.leaf_hashes(origin, first, body.tree_size)
        frontier = state.frontier.copy()
        frontier.extend([h for h, _ in leaves])
        if frontier.root() != body.root_hash:
            return
        state.frontier = frontier
        state.checkpoint = body
        for seq, (leaf, has_envelope) in enumerate(leaves, start=first):
            if has_envelope and seq >= first_waiting:
                state.waiting[seq] = leaf


def _origin_alert(
    origin: str, reason: AlertReason, detail: str, checkpoint: log_pb2.Checkpoint
) -> OriginAlert:
    return OriginAlert(
        origin, reason, detail, evidence(origin, reason, detail, checkpoint=checkpoint)
    )

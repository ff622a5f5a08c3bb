"""May intake from a collector resume after an alert? Only when its log agrees again with
what this verifier stored.

An alert (fork, rollback, gap, bad signature, ...) stops intake and leaves the store as it
was: its cursor (the last stored seq and that entry's hash) and the last checkpoint it
verified. Clearing the alert resumes from that cursor, so it is safe only when the
collector can continue exactly there: when the alert was transient (a corrupted stream, a
bad signature that the collector no longer sends) or the collector's log was restored from
a backup that holds everything this verifier stored. The collector's answers
(:class:`CollectorView`) are judged against the pinned key:

1. It serves the configured origin; its head is at or past our cursor (otherwise it is
   still rolled back); its retention floor is at most cursor + 1 (otherwise entries this
   verifier never stored are gone, a gap no clearing can fill).
2. Its latest checkpoint verifies under the pinned key. A collector that signs with
   another key is not cleared: re-pin its key (``public_key`` in ``[[collectors]]``) and
   restart verifierd, a decision for whoever controls the configuration.
3. Its checkpoint of the size we last verified, when it has one (two histories need not
   have checkpoints of the same sizes), is signed by that key and has our root (otherwise
   the histories still differ up to there: the fork persists).
4. An inclusion proof puts our cursor's entry hash at our cursor's seq in its latest
   signed tree. Each entry holds the previous one's hash, so this pins every entry up to
   the cursor. When the collector no longer keeps that entry (pruned after we
   acknowledged it) or has not signed a checkpoint that reaches it yet, step 3 stands
   for it and the collector's own check of the Subscribe start (the hash before
   ``from_seq``) covers the rest; without either, clearing waits.

Passing is only the start: the resumed stream is verified entry by entry as always, and a
new violation raises a new alert (the cleared one stays in the store).

Pure code: protobuf values and keys in, a :class:`ResumeCheck` out.
"""

from __future__ import annotations

from dataclasses import dataclass

from veritap.merkle import ProofError, verify_inclusion
from veritap.note import CheckpointBody, NoteError, open_checkpoint, parse_checkpoint, parse_note
from veritap.signing import Verifier
from veritap.v1 import ledger_pb2, log_pb2

from verifierd.errors import VerifierdError
from verifierd.store import Cursor


class ClearError(VerifierdError):
    """An intake alert was not cleared."""


class NothingToClearError(ClearError):
    """The origin has no alert in force."""


class ResumeRefusedError(ClearError):
    """Intake may not resume: the collector's log still contradicts what was stored (or it
    cannot be checked now); the message says which."""


@dataclass(frozen=True)
class CollectorView:
    """What a collector answered when asked before a resume; None where it did not answer
    (the matching ``*_error`` says why, e.g. ``NOT_FOUND: no checkpoint yet``)."""

    head: ledger_pb2.GetHeadResponse | None
    head_error: str = ""
    #: Its latest checkpoint.
    latest: log_pb2.Checkpoint | None = None
    latest_error: str = ""
    #: Its checkpoint of the size of the last checkpoint this verifier verified.
    at_ours: log_pb2.Checkpoint | None = None
    at_ours_error: str = ""
    #: The proof of our cursor's seq against ``latest``.
    proof: ledger_pb2.GetInclusionProofResponse | None = None
    proof_error: str = ""


@dataclass(frozen=True)
class ResumeCheck:
    ok: bool
    #: One line: what agreed, or what still contradicts us and what to do.
    summary: str


def _short(digest: bytes) -> str:
    return digest.hex()[:16] + "…"


def _refuse(summary: str) -> ResumeCheck:
    return ResumeCheck(False, summary)


def check_resume(origin: str, cursor: Cursor, key: Verifier, view: CollectorView) -> ResumeCheck:
    """Judge ``view`` (see the module docstring for the steps)."""
    head = view.head
    if head is None:
        return _refuse(f"the collector did not answer ({view.head_error}); try again later")
    if head.origin != origin:
        return _refuse(f"the collector serves origin {head.origin!r}, not {origin!r}")
    if head.head_seq < cursor.seq:
        return _refuse(
            f"rollback: the collector's head is seq {head.head_seq}, this verifier stored up "
            f"to seq {cursor.seq}; restore the collector's log from a backup that holds them"
        )
    if head.retention_floor > cursor.seq + 1:
        return _refuse(
            f"gap: the collector's log starts at seq {head.retention_floor}, so seqs "
            f"{cursor.seq + 1}..{head.retention_floor - 1}, never stored here, are gone; "
            "intake cannot resume without losing them"
        )
    latest: CheckpointBody | None = None
    if view.latest is not None:
        try:
            latest = open_checkpoint(view.latest.note, key, origin=origin)
        except NoteError as exc:
            return _refuse(
                f"the collector's latest checkpoint does not verify under the pinned key "
                f"({exc}); if its key was rotated, re-pin it (public_key in [[collectors]]) "
                "and restart verifierd"
            )
    elif cursor.seq:
        return _refuse(f"the collector shows no signed checkpoint ({view.latest_error})")
    checked = 0
    if cursor.checkpoint is not None and view.at_ours is not None:
        # Verified when it was stored; parsed again here without its (maybe older) key.
        ours = parse_checkpoint(parse_note(cursor.checkpoint.note).text)
        try:
            theirs = open_checkpoint(view.at_ours.note, key, origin=origin)
        except NoteError as exc:
            return _refuse(
                f"the collector's checkpoint of size {ours.tree_size} does not verify under "
                f"the pinned key ({exc})"
            )
        if (theirs.tree_size, theirs.root_hash) != (ours.tree_size, ours.root_hash):
            return _refuse(
                f"fork: the collector's checkpoint of size {theirs.tree_size} has root "
                f"{_short(theirs.root_hash)}, this verifier verified root "
                f"{_short(ours.root_hash)} at size {ours.tree_size}"
            )
        checked = ours.tree_size
    if cursor.seq > checked:
        if view.proof is not None and latest is not None:
            if view.proof.leaf_hash != cursor.hash:
                return _refuse(
                    f"fork: the collector's entry {cursor.seq} hashes to "
                    f"{_short(view.proof.leaf_hash)}, this verifier stored "
                    f"{_short(cursor.hash)}"
                )
            try:
                verify_inclusion(
                    cursor.seq - 1, latest.tree_size, cursor.hash, view.proof.path, latest.root_hash
                )
            except ProofError as exc:
                return _refuse(
                    f"the collector's inclusion proof of seq {cursor.seq} does not lead to "
                    f"its signed root of size {latest.tree_size}: {exc}"
                )
            checked = cursor.seq
        elif not checked:
            why = "; ".join(e for e in (view.at_ours_error, view.proof_error) if e)
            return _refuse(
                f"nothing shows yet that the collector's log holds seq {cursor.seq} as stored "
                f"here ({why}); try again once it has signed a checkpoint covering it"
            )
    if not cursor.seq:
        how = "nothing was stored from it yet"
    else:
        how = f"its log agrees up to seq {checked}"
        if checked < cursor.seq:
            how += f" (seqs {checked + 1}..{cursor.seq}: by its start check)"
    signed = f", latest signed checkpoint of size {latest.tree_size}" if latest else ""
    return ResumeCheck(True, f"{how}; head {head.head_seq}, floor {head.retention_floor}{signed}")

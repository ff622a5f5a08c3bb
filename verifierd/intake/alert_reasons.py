"""Why intake (and judging) from a collector stopped: the reasons an intake alert names.

The values are what the store, GetStats, the metrics and `verifierd intake alerts` show.
"""

from __future__ import annotations

from enum import StrEnum


class AlertReason(StrEnum):
    # What the collector sent contradicts its own log.
    GAP = "gap"
    BAD_ENTRY = "bad_entry"
    BAD_HASH = "bad_hash"
    BAD_SIGNATURE = "bad_signature"
    BAD_CHECKPOINT = "bad_checkpoint"
    FORK = "fork"
    ROLLBACK = "rollback"
    ORIGIN_MISMATCH = "origin_mismatch"
    # What this verifier stored is not what the collector signed (its disk was altered).
    #: The stored checkpoint's signature does not verify under the pinned key.
    STORED_CHECKPOINT_FORGED = "stored_checkpoint_forged"
    #: The stored entry hashes do not lead to the stored checkpoint's signed root.
    STORED_ENTRIES_ALTERED = "stored_entries_altered"
    #: A stored envelope does not hash to its authenticated entry hash.
    STORED_ENVELOPE_ALTERED = "stored_envelope_altered"

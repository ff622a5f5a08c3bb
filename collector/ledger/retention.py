"""Retention accounting: the highest seq each verifier has acknowledged as durable.

The collector must never prune an entry that a configured verifier has not stored. The
LedgerService records every acknowledgement here and writes the book to a small JSON file
(atomically: temporary file, fsync, rename, fsync of the folder) at most every
`flush_interval_s` and when a subscription ends. The file therefore lags the verifiers
but never runs ahead of them, which is the safe direction: a prune checked against it
can only be more cautious than necessary.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from collector.ledger.errors import LedgerError, RetentionError

logger = logging.getLogger(__name__)
_FORMAT = 1


@dataclass(frozen=True)
class VerifierAck:
    verifier_id: str
    acked_seq: int


class AckBook:
    """Acknowledged seqs by verifier id; only ever moves forward."""

    def __init__(self, path: Path, acked: dict[str, int], *, flush_interval_s: float) -> None:
        self.path = path
        self._acked = acked
        self._flush_interval_s = flush_interval_s
        self._dirty = False
        self._flushed_at = -math.inf  # the first acknowledgement is written at once

    @classmethod
    def load(cls, path: Path, *, flush_interval_s: float = 0.5) -> AckBook:
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return cls(path, {}, flush_interval_s=flush_interval_s)
        except (OSError, ValueError) as exc:
            raise LedgerError(f"cannot read the acknowledgement file {str(path)!r}: {exc}") from exc
        acked = document.get("acked") if isinstance(document, dict) else None
        if (
            not isinstance(document, dict)
            or document.get("format") != _FORMAT
            or not isinstance(acked, dict)
            or not all(isinstance(k, str) and isinstance(v, int) for k, v in acked.items())
        ):
            raise LedgerError(f"{str(path)!r} is not an acknowledgement file of format {_FORMAT}")
        return cls(path, dict(acked), flush_interval_s=flush_interval_s)

    def acked(self, verifier_id: str) -> int:
        return self._acked.get(verifier_id, 0)

    def entries(self) -> tuple[VerifierAck, ...]:
        return tuple(VerifierAck(k, v) for k, v in sorted(self._acked.items()))

    def record(self, verifier_id: str, durable_seq: int) -> None:
        """Note an acknowledgement; writes the file when the last write is old enough."""
        if durable_seq <= self._acked.get(verifier_id, 0):
            return
        self._acked[verifier_id] = durable_seq
        self._dirty = True
        if time.monotonic() - self._flushed_at >= self._flush_interval_s:
            self.flush()

    def flush(self) -> None:
        if not self._dirty:
            return
        document = {"format": _FORMAT, "acked": dict(sorted(self._acked.items()))}
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with tmp.open("w", encoding="utf-8") as handle:
            json.dump(document, handle)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(self.path)
        folder = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
        self._dirty = False
        self._flushed_at = time.monotonic()
        logger.debug("acknowledgements written", extra={"path": str(self.path)})


def prune_limit(book: AckBook, verifiers: Sequence[str]) -> int | None:
    """The highest `before_seq` a prune may use, or None when no verifier is configured."""
    if not verifiers:
        return None
    return min(book.acked(v) for v in verifiers) + 1


def check_prune(book: AckBook, verifiers: Sequence[str], before_seq: int) -> None:
    """Raise RetentionError naming the verifier that has not acknowledged `before_seq - 1`."""
    for verifier_id in verifiers:
        acked = book.acked(verifier_id)
        if acked < before_seq - 1:
            raise RetentionError(
                f"verifier {verifier_id!r} has acknowledged only up to seq {acked}; "
                f"pruning before {before_seq} would drop entries it has not stored"
            )

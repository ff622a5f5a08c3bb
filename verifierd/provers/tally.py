"""What a prover's verdicts add up to over some span of time: a :class:`Tally`.

Pure values: a tally is built from verdicts, added to another, and encoded as compact
JSON for the store (one per window bucket, one since first seen).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
from veritap.v1 import verifier_pb2

from verifierd.verdicts import Reason

_UNVERIFIABLE = verifier_pb2.VERDICT_STATUS_UNVERIFIABLE
_SCORED = (verifier_pb2.VERDICT_STATUS_PASS, verifier_pb2.VERDICT_STATUS_FAIL)
_NO_SEED = (_UNVERIFIABLE, Reason.NO_SEED.value)


def verdict_margins(verdict: verifier_pb2.Verdict) -> np.ndarray:
    """The verdict's per-token margins as float64 (empty when nothing was scored)."""
    return np.frombuffer(verdict.margins_f16, dtype="<f2").astype(np.float64)


@dataclass(frozen=True)
class Tally:
    #: Verdicts by (status, reason).
    counts: Mapping[tuple[int, str], int] = field(default_factory=dict)
    #: Output tokens scored, the sum of their margins, and how many were not exact.
    tokens: int = 0
    margin_sum: float = 0.0
    inexact: int = 0
    #: Verdicts whose request samples, so that only a seed makes it replayable.
    needs_seed: int = 0

    @classmethod
    def of_verdict(cls, verdict: verifier_pb2.Verdict) -> Tally:
        tokens = inexact = 0
        margin_sum = 0.0
        if verdict.status in _SCORED and verdict.margins_f16:
            margins = verdict_margins(verdict)
            tokens = len(margins)
            margin_sum = float(margins.sum())
            inexact = int(np.count_nonzero(margins))
        return cls(
            {(verdict.status, verdict.reason): 1},
            tokens,
            margin_sum,
            inexact,
            int(verdict.needs_seed),
        )

    def __add__(self, other: Tally) -> Tally:
        counts = dict(self.counts)
        for key, n in other.counts.items():
            counts[key] = counts.get(key, 0) + n
        return Tally(
            counts,
            self.tokens + other.tokens,
            self.margin_sum + other.margin_sum,
            self.inexact + other.inexact,
            self.needs_seed + other.needs_seed,
        )

    def without(self, other: Tally) -> Tally | None:
        """This tally less ``other`` (a verdict counted in it, now withdrawn); None when
        ``other``'s verdicts are not all counted here."""
        if other.needs_seed > self.needs_seed:
            return None
        counts = dict(self.counts)
        for key, n in other.counts.items():
            left = counts.get(key, 0) - n
            if left < 0:
                return None
            if left:
                counts[key] = left
            else:
                counts.pop(key, None)
        return Tally(
            counts,
            self.tokens - other.tokens,
            self.margin_sum - other.margin_sum,
            self.inexact - other.inexact,
            self.needs_seed - other.needs_seed,
        )

    @classmethod
    def total(cls, tallies: Iterable[Tally]) -> Tally:
        out = cls()
        for tally in tallies:
            out = out + tally
        return out

    @property
    def verdicts(self) -> int:
        return sum(self.counts.values())

    def unverifiable(self) -> dict[str, int]:
        """UNVERIFIABLE verdicts by reason."""
        out: dict[str, int] = {}
        for (status, reason), n in self.counts.items():
            if status == _UNVERIFIABLE:
                out[reason] = out.get(reason, 0) + n
        return out

    def unverifiable_share(self) -> dict[str, float]:
        """The share of all verdicts that are UNVERIFIABLE, by reason."""
        total = self.verdicts
        return {r: n / total for r, n in self.unverifiable().items()} if total else {}

    def unseeded_share(self) -> float:
        """The share of the verdicts whose request samples that came without a seed
        (greedy traffic needs none, so it is not in the denominator)."""
        if not self.needs_seed:
            return 0.0
        # At most 1: a tally stored before needs_seed was counted holds no_seed verdicts
        # without them.
        return min(1.0, self.counts.get(_NO_SEED, 0) / self.needs_seed)

    def to_json(self) -> bytes:
        counts = sorted([status, reason, n] for (status, reason), n in self.counts.items())
        return json.dumps(
            {
                "c": counts,
                "t": self.tokens,
                "m": self.margin_sum,
                "x": self.inexact,
                "s": self.needs_seed,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Tally:
        data = json.loads(raw)
        counts = {(int(status), str(reason)): int(n) for status, reason, n in data["c"]}
        # Tallies stored before needs_seed was counted have no "s".
        needs_seed = int(data.get("s", 0))
        return cls(counts, int(data["t"]), float(data["m"]), int(data["x"]), needs_seed)

    def to_window(self, window_s: int) -> verifier_pb2.ProverWindow:
        """The tally as a ProverWindow message (``window_s`` 0: since first seen)."""
        window = verifier_pb2.ProverWindow(
            window_s=window_s,
            verdicts=self.verdicts,
            tokens_scored=self.tokens,
            margin_sum=self.margin_sum,
            inexact_tokens=self.inexact,
        )
        for (status, reason), n in sorted(self.counts.items()):
            window.counts.add(
                status=verifier_pb2.VerdictStatus.ValueType(status), reason=reason, count=n
            )
        shares = self.unverifiable_share()
        window.unverifiable_share.update(shares)
        window.unverifiable_ratio = sum(shares.values())
        window.needs_seed_verdicts = self.needs_seed
        window.unseeded_share = self.unseeded_share()
        return window

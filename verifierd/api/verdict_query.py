"""ListVerdicts and WatchVerdicts filters, and ListVerdicts' opaque page tokens.

A page token carries the store's resume key together with a fingerprint of the
query it belongs to, so a token reused with different filters is refused instead
of silently skipping or repeating verdicts.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import math
from dataclasses import dataclass

from veritap.v1 import verifier_pb2

from verifierd.api.errors import PageTokenError

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
_U64_MAX = (1 << 64) - 1
_TOKEN_VERSION = b"\x01"
_FINGERPRINT_SIZE = 8


class QueryError(ValueError):
    """A request's filters are inconsistent (e.g. from after to, NaN scores)."""


@dataclass(frozen=True)
class VerdictFilter:
    """What a verdict must match; empty fields match everything."""

    commitment_id: str = ""
    model: str = ""
    statuses: frozenset[int] = frozenset()
    min_score: float | None = None
    max_score: float | None = None

    def __post_init__(self) -> None:
        for bound in (self.min_score, self.max_score):
            if bound is not None and math.isnan(bound):
                raise QueryError("score bounds may not be NaN")
        if (
            self.min_score is not None
            and self.max_score is not None
            and self.min_score > self.max_score
        ):
            raise QueryError(f"min_score {self.min_score} is above max_score {self.max_score}")

    def accept(self, verdict: verifier_pb2.Verdict) -> bool:
        if self.commitment_id and verdict.commitment_id != self.commitment_id:
            return False
        if self.model and verdict.model != self.model:
            return False
        if self.statuses and verdict.status not in self.statuses:
            return False
        if self.min_score is not None and not verdict.score >= self.min_score:
            return False
        return self.max_score is None or verdict.score <= self.max_score

    def watches(self, verdict: verifier_pb2.Verdict) -> bool:
        """Whether a watcher with this filter is sent ``verdict``: it matches, or it
        supersedes a verdict that matched (which the watcher may hold: it learns so that
        the verdict is withdrawn)."""
        if self.accept(verdict):
            return True
        if not verdict.HasField("supersedes"):
            return False
        was = verdict.supersedes
        return self.accept(
            verifier_pb2.Verdict(
                commitment_id=verdict.commitment_id,
                model=verdict.model,
                status=was.status,
                score=was.score,
            )
        )

    @classmethod
    def of_list(cls, request: verifier_pb2.ListVerdictsRequest) -> VerdictFilter:
        return cls(
            commitment_id=request.commitment_id,
            model=request.model,
            statuses=frozenset(request.statuses),
            min_score=request.min_score if request.HasField("min_score") else None,
            max_score=request.max_score if request.HasField("max_score") else None,
        )

    @classmethod
    def of_watch(cls, request: verifier_pb2.WatchVerdictsRequest) -> VerdictFilter:
        return cls(commitment_id=request.commitment_id, statuses=frozenset(request.statuses))


@dataclass(frozen=True)
class VerdictQuery:
    """One ListVerdicts call, validated: filter, time range, page size and resume key."""

    filter: VerdictFilter
    from_ns: int
    to_ns: int
    page_size: int
    #: The store's resume key (b"" for the first page).
    after: bytes
    #: The newest page_size matches, newest first, in one page.
    newest_first: bool = False

    @classmethod
    def of(cls, request: verifier_pb2.ListVerdictsRequest) -> VerdictQuery:
        verdict_filter = VerdictFilter.of_list(request)
        to_ns = request.to_ns or _U64_MAX
        if request.from_ns > to_ns:
            raise QueryError(f"from_ns {request.from_ns} is after to_ns {to_ns}")
        size = request.page_size or DEFAULT_PAGE_SIZE
        partial = cls(
            verdict_filter,
            request.from_ns,
            to_ns,
            min(size, MAX_PAGE_SIZE),
            b"",
            request.newest_first,
        )
        if not request.page_token:
            return partial
        if request.newest_first:
            raise QueryError("newest_first gives one page: it takes no page_token")
        after = decode_page_token(request.page_token, partial.fingerprint())
        return cls(verdict_filter, request.from_ns, to_ns, partial.page_size, after)

    def fingerprint(self) -> bytes:
        """Identifies the query a page token belongs to (filters and range, not the page)."""
        f = self.filter
        text = "\x1f".join(
            (
                f.commitment_id,
                f.model,
                ",".join(str(s) for s in sorted(f.statuses)),
                repr(f.min_score),
                repr(f.max_score),
                str(self.from_ns),
                str(self.to_ns),
                str(self.newest_first),
            )
        )
        return hashlib.sha256(text.encode()).digest()[:_FINGERPRINT_SIZE]

    def next_token(self, after: bytes) -> str:
        """The page token for the store's resume key ("" at the end)."""
        return encode_page_token(after, self.fingerprint()) if after else ""


def encode_page_token(after: bytes, fingerprint: bytes) -> str:
    raw = _TOKEN_VERSION + fingerprint + after
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_page_token(token: str, fingerprint: bytes) -> bytes:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except (binascii.Error, ValueError) as exc:
        raise PageTokenError("page_token is not a token this service issued") from exc
    head = len(_TOKEN_VERSION) + _FINGERPRINT_SIZE
    if len(raw) <= head or raw[:1] != _TOKEN_VERSION:
        raise PageTokenError("page_token is not a token this service issued")
    if raw[1:head] != fingerprint:
        raise PageTokenError("page_token belongs to a query with other filters")
    return raw[head:]

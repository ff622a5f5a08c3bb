"""The Verdicts screen's filter line: a few words an operator types, parsed into a query.

    fail error model:tiny-chat score>=1.5 since:2025-03-01T09:00

Terms, separated by spaces, in any order:

- a status (``pass``, ``fail``, ``unverifiable``, ``skipped``, ``error``; several: any of them)
- ``model:NAME``
- ``score>=X`` / ``score<=X`` (``>`` and ``<`` read the same: bounds are inclusive)
- ``since:TIME`` / ``until:TIME`` (ISO 8601, UTC unless it names a zone)

The same spec filters the ListVerdicts request and the live verdicts from WatchVerdicts.
"""

from __future__ import annotations

import datetime
import math
import re
from dataclasses import dataclass
from typing import TypeAlias

from veritap.v1 import verifier_pb2

StatusValue: TypeAlias = verifier_pb2.VerdictStatus.ValueType

STATUS_WORDS: dict[str, StatusValue] = {
    "pass": verifier_pb2.VERDICT_STATUS_PASS,
    "fail": verifier_pb2.VERDICT_STATUS_FAIL,
    "unverifiable": verifier_pb2.VERDICT_STATUS_UNVERIFIABLE,
    "skipped": verifier_pb2.VERDICT_STATUS_SKIPPED,
    "error": verifier_pb2.VERDICT_STATUS_ERROR,
}
_WORD_OF = {value: word for word, value in STATUS_WORDS.items()}
_SCORE = re.compile(r"^score(>=|<=|>|<)(.+)$")


class FilterSyntaxError(ValueError):
    """A filter line that does not parse; the message names the bad term."""


@dataclass(frozen=True)
class VerdictFilterSpec:
    statuses: frozenset[StatusValue] = frozenset()
    model: str = ""
    min_score: float | None = None
    max_score: float | None = None
    from_ns: int = 0
    to_ns: int = 0

    def request(self, page_size: int) -> verifier_pb2.ListVerdictsRequest:
        request = verifier_pb2.ListVerdictsRequest(
            model=self.model,
            statuses=sorted(self.statuses),
            from_ns=self.from_ns,
            to_ns=self.to_ns,
            page_size=page_size,
        )
        if self.min_score is not None:
            request.min_score = self.min_score
        if self.max_score is not None:
            request.max_score = self.max_score
        return request

    def accept(self, verdict: verifier_pb2.Verdict) -> bool:
        return (
            (not self.statuses or verdict.status in self.statuses)
            and (not self.model or verdict.model == self.model)
            and (self.min_score is None or verdict.score >= self.min_score)
            and (self.max_score is None or verdict.score <= self.max_score)
            and verdict.decided_at_ns >= self.from_ns
            and (not self.to_ns or verdict.decided_at_ns <= self.to_ns)
        )

    def text(self) -> str:
        """The canonical filter line for this spec (parses back to it)."""
        terms = [_WORD_OF[s] for s in sorted(self.statuses)]
        if self.model:
            terms.append(f"model:{self.model}")
        if self.min_score is not None:
            terms.append(f"score>={self.min_score!r}")
        if self.max_score is not None:
            terms.append(f"score<={self.max_score!r}")
        if self.from_ns:
            terms.append(f"since:{self.from_ns}")
        if self.to_ns:
            terms.append(f"until:{self.to_ns}")
        return " ".join(terms)


def _time(term: str, value: str) -> int:
    if value.isdigit():
        return int(value)
    try:
        when = datetime.datetime.fromisoformat(value)
    except ValueError:
        raise FilterSyntaxError(f"{term}: not an ISO 8601 time") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return int(when.timestamp()) * 1_000_000_000 + when.microsecond * 1000


def _number(term: str, value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise FilterSyntaxError(f"{term}: not a number") from None
    if math.isnan(number):
        raise FilterSyntaxError(f"{term}: not a number")
    return number


def parse_filter(line: str) -> VerdictFilterSpec:
    statuses: set[StatusValue] = set()
    model = ""
    low: float | None = None
    high: float | None = None
    from_ns = to_ns = 0
    for term in line.split():
        lowered = term.lower()
        if lowered in STATUS_WORDS:
            statuses.add(STATUS_WORDS[lowered])
            continue
        key, sep, value = term.partition(":")
        key = key.lower()
        score = _SCORE.match(term)
        if score:
            bound = _number(term, score.group(2))
            if score.group(1).startswith(">"):
                low = bound
            else:
                high = bound
        elif sep and key == "model" and value:
            model = value
        elif sep and key == "since" and value:
            from_ns = _time(term, value)
        elif sep and key == "until" and value:
            to_ns = _time(term, value)
        else:
            raise FilterSyntaxError(
                f"{term!r}: expected a status, model:NAME, score>=X, score<=X, "
                "since:TIME or until:TIME"
            )
    if low is not None and high is not None and low > high:
        raise FilterSyntaxError(f"score>={low} is above score<={high}")
    if to_ns and from_ns > to_ns:
        raise FilterSyntaxError("since: is after until:")
    return VerdictFilterSpec(frozenset(statuses), model, low, high, from_ns, to_ns)

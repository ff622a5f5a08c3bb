"""`RetryingAppend`: a failed group commit is retried with back-off, then fails for good."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from veritap.v1 import record_pb2

from collector.log import InvalidRecordError, LogClosedError, LogWriteError
from collector.log.append_retry import AppendFailedError, RetryingAppend


class FlakyLog:
    """Fails the calls whose numbers (from 1) are in `failing` with `error`."""

    def __init__(self, failing: set[int], error: Exception | None = None) -> None:
        self.failing = failing
        self.error = error or LogWriteError("disk full")
        self.calls = 0
        self.stored: list[str] = []

    def append_many(self, records: Sequence[record_pb2.InferenceRecord]) -> list[int]:
        self.calls += 1
        if self.calls in self.failing:
            raise self.error
        self.stored += [r.record_id for r in records]
        return list(range(len(self.stored) - len(records), len(self.stored)))


def batch(*ids: str) -> list[record_pb2.InferenceRecord]:
    return [record_pb2.InferenceRecord(record_id=i) for i in ids]


def test_a_passing_failure_is_retried_with_doubling_delays() -> None:
    slept: list[float] = []
    log = FlakyLog({1, 2, 3})
    retrying = RetryingAppend(
        log, attempts=6, first_delay_s=0.5, max_delay_s=1.5, sleep=slept.append
    )
    assert retrying.append_many(batch("a", "b")) == [0, 1]
    assert slept == [0.5, 1.0, 1.5] and retrying.retries == 3 and not retrying.broken
    assert log.stored == ["a", "b"]


def test_spent_attempts_fail_loudly_then_each_append_is_tried_once() -> None:
    slept: list[float] = []
    log = FlakyLog({1, 2, 3, 4})
    retrying = RetryingAppend(log, attempts=3, sleep=slept.append)
    with pytest.raises(AppendFailedError, match="failed 3 times"):
        retrying.append_many(batch("a"))
    assert retrying.broken and log.calls == 3 and len(slept) == 2
    with pytest.raises(AppendFailedError, match="failed 1 times"):
        retrying.append_many(batch("b"))
    assert log.calls == 4 and len(slept) == 2
    assert retrying.append_many(batch("c")) == [0]
    assert not retrying.broken and log.stored == ["c"]


@pytest.mark.parametrize("error", [LogClosedError("closed"), InvalidRecordError("no id")])
def test_errors_no_retry_can_cure_are_raised_at_once(error: Exception) -> None:
    slept: list[float] = []
    log = FlakyLog({1}, error)
    with pytest.raises(type(error)):
        RetryingAppend(log, sleep=slept.append).append_many(batch("a"))
    assert log.calls == 1 and not slept


def test_at_least_one_attempt() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        RetryingAppend(FlakyLog(set()), attempts=0)

"""Appends that survive a passing failure: retried with back-off, then a loud, final error.

`collector run` must not stop for good on the first failed group commit (a full
disk being cleaned up, an fsync that timed out), nor retry forever while the
capture ring overflows. `RetryingAppend` wraps the log's `append_many`: a failed
append is logged and retried after a delay that doubles from `first_delay_s` up
to `max_delay_s`, at most `attempts` times in all. While it waits, the batching
writer's queue fills and blocks the capture loop: that is the back-pressure, and
the kernel ring absorbs (or counts as drops) what arrives meanwhile. When the
attempts are spent it raises `AppendFailedError`, and every later append is tried
once until one succeeds: the caller is expected to stop (the collector exits
non-zero so systemd restarts it). Errors no retry can cure (a closed log, an invalid
record) are raised at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from veritap.v1 import record_pb2

from collector.log.errors import InvalidRecordError, LogClosedError, LogError

logger = logging.getLogger(__name__)

Sleep = Callable[[float], None]
_NOT_RETRIED = (InvalidRecordError, LogClosedError)


class AppendFailedError(LogError):
    """An append failed on every attempt; the log takes no more records for now."""


class Appender(Protocol):
    """What is retried: the log's group commit."""

    def append_many(self, records: Sequence[record_pb2.InferenceRecord]) -> list[int]: ...


class RetryingAppend:
    """`append_many` of `log`, retried with back-off; see the module docstring."""

    def __init__(
        self,
        log: Appender,
        *,
        attempts: int = 6,
        first_delay_s: float = 0.25,
        max_delay_s: float = 4.0,
        sleep: Sleep = time.sleep,
    ) -> None:
        if attempts < 1:
            raise ValueError("attempts must be at least 1")
        self._log = log
        self._attempts = attempts
        self._first_delay_s = first_delay_s
        self._max_delay_s = max_delay_s
        self._sleep = sleep
        self.retries = 0
        self.broken = False

    def append_many(self, records: Sequence[record_pb2.InferenceRecord]) -> list[int]:
        attempts = 1 if self.broken else self._attempts
        delay = self._first_delay_s
        attempt = 1
        while True:
            try:
                seqs = self._log.append_many(records)
            except _NOT_RETRIED:
                raise
            except Exception as exc:
                if attempt >= attempts:
                    self.broken = True
                    raise AppendFailedError(
                        f"appending {len(records)} records failed {attempt} times: {exc!r}"
                    ) from exc
                self.retries += 1
                logger.warning(
                    "log append failed; retrying",
                    extra={"records": len(records), "attempt": attempt, "delay_s": delay},
                    exc_info=True,
                )
                self._sleep(delay)
                delay = min(delay * 2, self._max_delay_s)
                attempt += 1
            else:
                self.broken = False
                return seqs

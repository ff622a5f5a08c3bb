"""The collector's signed, hash-chained, append-only LMDB log (see `lmdb_log` and `layout`)."""

from collector.log.errors import (
    InvalidRecordError,
    LogClosedError,
    LogCorruptError,
    LogError,
    LogOpenError,
    LogPrunedError,
    LogRangeError,
    LogReadOnlyError,
    LogWriteError,
)
from collector.log.lmdb_log import Head, Log, LogStats

__all__ = [
    "Head",
    "InvalidRecordError",
    "Log",
    "LogClosedError",
    "LogCorruptError",
    "LogError",
    "LogOpenError",
    "LogPrunedError",
    "LogRangeError",
    "LogReadOnlyError",
    "LogStats",
    "LogWriteError",
]

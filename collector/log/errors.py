"""The log's exception hierarchy: every error the log raises is a LogError."""

from __future__ import annotations


class LogError(Exception):
    """Base of every error the collector's log raises."""


class LogOpenError(LogError):
    """The log cannot be opened: locked by another writer, wrong origin or key, bad format."""


class LogCorruptError(LogError):
    """What is on disk contradicts itself (a gap, a head that is not the last entry, ...)."""


class LogClosedError(LogError):
    """The log was closed (or is closing) and takes no more work."""


class LogReadOnlyError(LogError):
    """A write was attempted on a log opened read-only."""


class InvalidRecordError(LogError):
    """A record cannot be appended (no record id, an id too long, another origin)."""


class LogWriteError(LogError):
    """The transaction holding these records failed; none of them was stored."""


class LogRangeError(LogError):
    """A seq or tree size outside the log (past the head, below zero, ...)."""


class LogPrunedError(LogRangeError):
    """What was asked for lies below the retention floor and is gone."""

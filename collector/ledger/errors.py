"""Errors of the ledger service: configuration, retention and protocol misuse."""

from __future__ import annotations


class LedgerError(Exception):
    """Base of the ledger service's errors."""


class RetentionError(LedgerError):
    """A prune would drop entries that a configured verifier has not acknowledged."""


class AckError(LedgerError):
    """A subscriber acknowledged entries it was never sent, or went backwards."""

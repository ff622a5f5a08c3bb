"""verifierd's exception hierarchy: every error the daemon raises on purpose derives from here."""

from __future__ import annotations


class VerifierdError(Exception):
    """Base of verifierd's own errors."""

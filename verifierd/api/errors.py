"""Errors of the VerifierService package."""

from __future__ import annotations

from verifierd.errors import VerifierdError


class ApiError(VerifierdError):
    """The VerifierService cannot start (bad listen address, TLS files)."""


class PageTokenError(ApiError):
    """A ListVerdicts page token that is malformed or belongs to another query."""

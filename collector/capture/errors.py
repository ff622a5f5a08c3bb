"""Errors of the capture sources."""

from __future__ import annotations


class CaptureError(Exception):
    """A capture source could not be opened or read."""


class UnsupportedLinkTypeError(CaptureError):
    """The file or interface carries a link layer the decoder does not know."""


class BadCaptureFileError(CaptureError):
    """The file is not a pcap or pcapng file, or its structure is broken."""


class LiveCaptureError(CaptureError):
    """The live capture socket could not be set up (interface, permissions, filter)."""

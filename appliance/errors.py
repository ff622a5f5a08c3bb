"""The appliance package's exceptions."""

from __future__ import annotations


class ApplianceError(Exception):
    """Base of every error raised by the systemd glue."""


class NotifySocketError(ApplianceError):
    """NOTIFY_SOCKET names an address this glue cannot send to."""


class NotifyMessageError(ApplianceError):
    """A notification field cannot be encoded (bad name, newline in a value)."""

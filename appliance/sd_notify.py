"""Tell systemd what the daemon is doing: the sd_notify(3) protocol.

A service with ``Type=notify`` finds ``NOTIFY_SOCKET`` in its environment: the
path of a unix datagram socket, or ``@name`` for one in the abstract
namespace. Each notification is one datagram of newline-separated
``KEY=value`` assignments, e.g. ``READY=1\\nSTATUS=serving on :50051``.

libsystemd's ``sd_notify`` (through systemd-python) sends them when it is
importable; otherwise this module sends the datagram itself. Outside systemd
(no NOTIFY_SOCKET) every call is a cheap no-op that returns False, so a daemon
calls its notifier unconditionally::

    notifier = Notifier.from_env()
    notifier.extend_timeout(120_000_000)  # loading a model: give us 2 more minutes
    notifier.ready(status="serving 3 commitments")
    notifier.watchdog()                   # from the main loop; see appliance.watchdog
    notifier.stopping()
"""

from __future__ import annotations

import logging
import os
import re
import socket
from collections.abc import Callable, Mapping
from typing import Literal, Protocol

from appliance.errors import NotifyMessageError, NotifySocketError

NOTIFY_SOCKET = "NOTIFY_SOCKET"
WATCHDOG_USEC = "WATCHDOG_USEC"
WATCHDOG_PID = "WATCHDOG_PID"

Backend = Literal["auto", "libsystemd", "socket"]

_log = logging.getLogger(__name__)
_FIELD_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")


def notify_address(value: str) -> str:
    """The unix socket address a NOTIFY_SOCKET value names ('@x' is abstract: '\\0x')."""
    if value.startswith("/"):
        return value
    if value.startswith("@") and len(value) > 1:
        return "\0" + value[1:]
    raise NotifySocketError(
        f"{NOTIFY_SOCKET}={value!r}: only socket paths and @abstract names are supported "
        "without systemd-python"
    )


def encode_notification(fields: tuple[tuple[str, str], ...]) -> bytes:
    """One notification datagram: the assignments joined by newlines."""
    if not fields:
        raise NotifyMessageError("a notification needs at least one field")
    lines = []
    for name, value in fields:
        if not _FIELD_NAME.fullmatch(name):
            raise NotifyMessageError(f"bad notification field name {name!r}")
        if "\n" in value:
            raise NotifyMessageError(f"newline in the value of {name}")
        lines.append(f"{name}={value}")
    return "\n".join(lines).encode()


def watchdog_interval(
    environ: Mapping[str, str] | None = None, pid: int | None = None
) -> float | None:
    """systemd's watchdog timeout for this process in seconds; None when it is off.

    Like sd_watchdog_enabled(3): WATCHDOG_USEC must be a positive integer, and
    when WATCHDOG_PID is set it must name this process (a child that inherited
    the environment does not own the watchdog). Ping at least twice per interval.
    """
    env = os.environ if environ is None else environ
    usec_text = env.get(WATCHDOG_USEC)
    if not usec_text:
        return None
    pid_text = env.get(WATCHDOG_PID)
    if pid_text and pid_text != str(os.getpid() if pid is None else pid):
        return None
    try:
        usec = int(usec_text)
    except ValueError:
        _log.warning("ignoring malformed %s", WATCHDOG_USEC, extra={"value": usec_text})
        return None
    if usec <= 0:
        return None
    return usec / 1_000_000


class NotifyTransport(Protocol):
    """Delivers one encoded notification; raises OSError when it cannot."""

    def send(self, message: bytes) -> None: ...


class DatagramTransport:
    """Sends each notification as one datagram on a fresh socket, as sd_notify does."""

    def __init__(self, address: str) -> None:
        self.address = address

    def send(self, message: bytes) -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(self.address)
            sock.send(message)


class LibsystemdTransport:
    """Sends through libsystemd's sd_notify, which reads NOTIFY_SOCKET itself."""

    def __init__(self, notify: Callable[[str], bool]) -> None:
        self._notify = notify

    def send(self, message: bytes) -> None:
        if not self._notify(message.decode()):
            raise OSError(f"sd_notify: {NOTIFY_SOCKET} is not set")


def _libsystemd_notify() -> Callable[[str], bool] | None:
    try:
        from systemd import daemon
    except ImportError:
        return None
    notify: Callable[[str], bool] = daemon.notify
    return notify


class Notifier:
    """Sends READY/STATUS/WATCHDOG/... to systemd; a disabled one sends nothing."""

    def __init__(self, transport: NotifyTransport | None) -> None:
        self._transport = transport

    @classmethod
    def from_env(cls, backend: Backend = "auto") -> Notifier:
        """A notifier for this process's NOTIFY_SOCKET (disabled when it is unset).

        ``auto`` uses libsystemd when systemd-python is importable and the
        built-in datagram sender otherwise; ``socket`` forces the latter.
        """
        value = os.environ.get(NOTIFY_SOCKET)
        if not value:
            return cls(None)
        if backend != "socket":
            notify = _libsystemd_notify()
            if notify is not None:
                return cls(LibsystemdTransport(notify))
            if backend == "libsystemd":
                raise NotifySocketError("systemd-python is not installed")
        return cls(DatagramTransport(notify_address(value)))

    @property
    def enabled(self) -> bool:
        """Whether notifications go anywhere (the process runs under systemd)."""
        return self._transport is not None

    def notify(self, *fields: tuple[str, str]) -> bool:
        """Send one notification; True when it was delivered.

        A failure to deliver is logged, never raised: systemd going away must
        not take the daemon down.
        """
        message = encode_notification(fields)
        if self._transport is None:
            return False
        try:
            self._transport.send(message)
        except OSError as exc:
            _log.warning(
                "sd_notify failed", extra={"notification": message.decode(), "error": str(exc)}
            )
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        """Startup is finished: systemd starts units ordered after this one."""
        return self.notify(("READY", "1"), *_status_field(status))

    def status(self, text: str) -> bool:
        """A one-line description of what the daemon is doing (systemctl status shows it)."""
        return self.notify(*_status_field(text))

    def watchdog(self) -> bool:
        """Keep-alive: the main loop is still turning."""
        return self.notify(("WATCHDOG", "1"))

    def extend_timeout(self, usec: int) -> bool:
        """Ask for `usec` more microseconds before the current start/stop timeout fires."""
        if usec <= 0:
            raise NotifyMessageError(f"EXTEND_TIMEOUT_USEC must be positive, not {usec}")
        return self.notify(("EXTEND_TIMEOUT_USEC", str(usec)))

    def stopping(self, status: str | None = None) -> bool:
        """Shutdown has begun."""
        return self.notify(("STOPPING", "1"), *_status_field(status))


def _status_field(text: str | None) -> tuple[tuple[str, str], ...]:
    """STATUS is one line: newlines in free text (e.g. an error message) become spaces."""
    if text is None:
        return ()
    return (("STATUS", " ".join(text.splitlines())),)

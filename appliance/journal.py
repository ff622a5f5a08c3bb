"""Logging for the daemons: journald with structured fields, and stderr.

`setup_logging(name, level)` configures the root logger once at start:

* **journald**, when the process runs under systemd (``JOURNAL_STREAM`` or
  ``INVOCATION_ID`` in the environment). Each record is one journal entry sent
  with the native protocol: MESSAGE, PRIORITY, SYSLOG_IDENTIFIER, LOGGER,
  CODE_FILE/CODE_LINE/CODE_FUNC, THREAD_NAME, EXCEPTION_TYPE, and every
  ``extra=`` key as its own upper-cased field, so
  ``logger.info("record stored", extra={"record_id": rid})`` can be found with
  ``journalctl RECORD_ID=...``. libsystemd's sd_journal_sendv carries the
  entry when systemd-python is importable; otherwise it is written to
  journald's socket here (large entries go through a sealed memfd, as
  libsystemd does).
* **stderr**, one line per record with the extra fields appended as
  ``key=value``. It is left out only when stderr is itself connected to the
  journal (``JOURNAL_STREAM`` names fd 2) while the native handler is on,
  because every line would otherwise be stored twice; ``stderr=True`` forces it.

The events an operator acts on carry a fixed ``MESSAGE_ID`` (`MessageId`, passed as
``extra={"message_id": MessageId.INTAKE_ALERT, ...}``): ``journalctl MESSAGE_ID=...``
finds every one of a kind, and ``journalctl -x`` shows its entry of
appliance/catalog/veritap.catalog, which the playbook installs into journald's catalog.
"""

from __future__ import annotations

import array
import contextlib
import enum
import errno
import fcntl
import logging
import os
import re
import socket
import struct
import sys
from collections.abc import Callable, Mapping
from typing import Literal, Protocol, TextIO

JOURNAL_SOCKET = "/run/systemd/journal/socket"
JOURNAL_STREAM = "JOURNAL_STREAM"
INVOCATION_ID = "INVOCATION_ID"

Backend = Literal["auto", "libsystemd", "socket"]


class MessageId(enum.StrEnum):
    """journald MESSAGE_IDs (128-bit, fixed forever), one per kind of event operators act
    on; each has an entry in appliance/catalog/veritap.catalog."""

    #: Intake from a collector stopped, or an entry withheld: its log contradicts what was
    #: verified, or an entry cannot be received (verifierd.intake).
    INTAKE_ALERT = "aa97b65a096e4701a887d5eb96eae6a1"
    #: A prover is judged dishonest, or hides its traffic (verifierd.provers).
    PROVER_ALARM = "6c819f7287b84b47b1297461f5407010"
    #: A verdict is FAIL: the recomputation or the captured text contradicts the prover.
    FAIL_VERDICT = "a14d46f8c72c4bd3b269510340a9fccd"


# syslog priorities (sd-daemon(3)) for the logging levels.
_PRIORITIES = ((logging.CRITICAL, 2), (logging.ERROR, 3), (logging.WARNING, 4), (logging.INFO, 6))
_DEBUG_PRIORITY = 7
_STANDARD_ATTRIBUTES = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}
_RESERVED_FIELDS = frozenset(
    {
        "MESSAGE",
        "PRIORITY",
        "SYSLOG_IDENTIFIER",
        "LOGGER",
        "CODE_FILE",
        "CODE_LINE",
        "CODE_FUNC",
        "THREAD_NAME",
        "EXCEPTION_TYPE",
    }
)
_BAD_FIELD_CHARS = re.compile(r"[^A-Z0-9_]")
_MAX_FIELD_NAME = 64
_STDERR_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def under_systemd(environ: Mapping[str, str] | None = None) -> bool:
    """Whether systemd started this process (it sets these for every service)."""
    env = os.environ if environ is None else environ
    return bool(env.get(JOURNAL_STREAM) or env.get(INVOCATION_ID))


def stderr_is_journal(environ: Mapping[str, str] | None = None, fd: int = 2) -> bool:
    """Whether `fd` is the journal stream systemd connected (JOURNAL_STREAM=dev:inode)."""
    env = os.environ if environ is None else environ
    value = env.get(JOURNAL_STREAM, "")
    try:
        stat = os.fstat(fd)
    except OSError:
        return False
    return value == f"{stat.st_dev}:{stat.st_ino}"


def syslog_priority(levelno: int) -> int:
    """The syslog priority for a logging level (custom levels round down)."""
    for level, priority in _PRIORITIES:
        if levelno >= level:
            return priority
    return _DEBUG_PRIORITY


def journal_field_name(key: str) -> str | None:
    """A valid journal field name for an `extra=` key, or None when nothing is left.

    Journal names are upper-case letters, digits and underscores, do not start
    with an underscore or digit (those are journald's trusted fields) and are at
    most 64 characters. A key that would shadow a field this handler sets gets
    an ``EXTRA_`` prefix.
    """
    name = _BAD_FIELD_CHARS.sub("_", key.upper()).lstrip("_0123456789")
    if not name:
        return None
    if name in _RESERVED_FIELDS:
        name = f"EXTRA_{name}"
    return name[:_MAX_FIELD_NAME]


def extra_fields(record: logging.LogRecord) -> dict[str, object]:
    """The attributes a caller attached with ``extra=``, in the order given."""
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD_ATTRIBUTES}


def journal_fields(
    record: logging.LogRecord, identifier: str, message: str
) -> tuple[tuple[str, str], ...]:
    """The journal entry for one record; `message` is the formatted text."""
    fields = [
        ("MESSAGE", message),
        ("PRIORITY", str(syslog_priority(record.levelno))),
        ("SYSLOG_IDENTIFIER", identifier),
        ("LOGGER", record.name),
        ("CODE_FILE", record.pathname),
        ("CODE_LINE", str(record.lineno)),
        ("CODE_FUNC", record.funcName),
        ("THREAD_NAME", str(record.threadName)),
    ]
    if record.exc_info and record.exc_info[0] is not None:
        fields.append(("EXCEPTION_TYPE", record.exc_info[0].__qualname__))
    for key, value in extra_fields(record).items():
        name = journal_field_name(key)
        if name is not None:
            fields.append((name, value.decode() if isinstance(value, bytes) else str(value)))
    return tuple(fields)


def encode_journal_entry(fields: tuple[tuple[str, str], ...]) -> bytes:
    """journald's native datagram: ``NAME=value\\n``, or for a value holding a
    newline ``NAME\\n`` + 64-bit little-endian length + value + ``\\n``."""
    out = bytearray()
    for name, text in fields:
        value = text.encode()
        if b"\n" in value:
            out += name.encode() + b"\n" + struct.pack("<Q", len(value)) + value + b"\n"
        else:
            out += name.encode() + b"=" + value + b"\n"
    return bytes(out)


class JournalTransport(Protocol):
    """Delivers one journal entry; raises OSError when it cannot."""

    def send(self, fields: tuple[tuple[str, str], ...]) -> None: ...


class SocketJournal:
    """Writes entries to journald's native socket."""

    def __init__(self, path: str = JOURNAL_SOCKET) -> None:
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    def send(self, fields: tuple[tuple[str, str], ...]) -> None:
        data = encode_journal_entry(fields)
        try:
            self._sock.sendto(data, self.path)
        except OSError as exc:
            if exc.errno not in (errno.EMSGSIZE, errno.ENOBUFS):
                raise
            self._send_memfd(data)

    def _send_memfd(self, data: bytes) -> None:
        """An entry too big for a datagram: pass a sealed memfd holding it."""
        fd = os.memfd_create("journal-entry", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.write(fd, data)
            seals = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
            rights = (socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))
            self._sock.sendmsg([b""], [rights], 0, self.path)
        finally:
            os.close(fd)

    def close(self) -> None:
        self._sock.close()


class LibsystemdJournal:
    """Sends entries with libsystemd's sd_journal_sendv."""

    def __init__(self, sendv: Callable[..., object]) -> None:
        self._sendv = sendv

    def send(self, fields: tuple[tuple[str, str], ...]) -> None:
        self._sendv(*(f"{name}={value}".encode() for name, value in fields))


def journal_transport(backend: Backend = "auto") -> JournalTransport:
    """libsystemd when importable (unless `socket` is asked for), else the socket writer."""
    if backend != "socket":
        try:
            from systemd import journal
        except ImportError:
            if backend == "libsystemd":
                raise
        else:
            return LibsystemdJournal(journal.sendv)
    return SocketJournal()


class JournalHandler(logging.Handler):
    """A logging handler that stores each record as one structured journal entry."""

    def __init__(self, identifier: str, transport: JournalTransport) -> None:
        super().__init__()
        self.identifier = identifier
        self.transport = transport
        self.dropped = 0

    def emit(self, record: logging.LogRecord) -> None:
        try:
            fields = journal_fields(record, self.identifier, self.format(record))
            self.transport.send(fields)
        except OSError:
            # Report the first loss through logging's own error path; stay quiet after.
            self.dropped += 1
            if self.dropped == 1:
                self.handleError(record)

    def close(self) -> None:
        if isinstance(self.transport, SocketJournal):
            self.transport.close()
        super().close()


class StderrFormatter(logging.Formatter):
    """One line per record: time, level, logger, message, then the extra fields."""

    def __init__(self) -> None:
        super().__init__(_STDERR_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        extras = " ".join(f"{key}={_show(value)}" for key, value in extra_fields(record).items())
        if not extras:
            return text
        first, newline, rest = text.partition("\n")
        return f"{first} {extras}{newline}{rest}"


def _show(value: object) -> str:
    text = str(value)
    return repr(text) if not text or any(c.isspace() for c in text) else text


def setup_logging(
    name: str,
    level: int | str = logging.INFO,
    *,
    stderr: bool | None = None,
    journal: bool | None = None,
    backend: Backend = "auto",
    stream: TextIO | None = None,
) -> logging.Logger:
    """Route the root logger to journald and stderr; returns the logger `name`.

    `name` is the SYSLOG_IDENTIFIER of the journal entries. `journal` defaults
    to `under_systemd()`; `stderr` defaults to on (see the module docstring for
    the one exception). Handlers already on the root logger are replaced, like
    ``logging.basicConfig(force=True)``, so calling this twice is harmless.
    """
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        with contextlib.suppress(Exception):
            handler.close()
    use_journal = under_systemd() if journal is None else journal
    if use_journal:
        root.addHandler(JournalHandler(name, journal_transport(backend)))
    use_stderr = not (use_journal and stderr_is_journal()) if stderr is None else stderr
    if use_stderr:
        handler = logging.StreamHandler(sys.stderr if stream is None else stream)
        handler.setFormatter(StderrFormatter())
        root.addHandler(handler)
    root.setLevel(level)
    return logging.getLogger(name)

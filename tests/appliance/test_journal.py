"""journald logging: the native protocol on a real socket, fields, and handler setup."""

from __future__ import annotations

import io
import logging
import os
import shlex
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance import journal
from appliance.journal import (
    JournalHandler,
    MessageId,
    SocketJournal,
    encode_journal_entry,
    journal_field_name,
    setup_logging,
    stderr_is_journal,
    syslog_priority,
)

REPO = Path(__file__).resolve().parents[2]


def parse_native(data: bytes) -> list[tuple[str, str]]:
    """An independent reader of journald's native format (systemd's journal-file docs)."""
    fields = []
    pos = 0
    while pos < len(data):
        end = data.index(b"\n", pos)
        line = data[pos:end]
        if b"=" in line:
            name, value = line.split(b"=", 1)
            pos = end + 1
        else:
            name = line
            (size,) = struct.unpack_from("<Q", data, end + 1)
            start = end + 1 + 8
            value = data[start : start + size]
            assert data[start + size : start + size + 1] == b"\n"
            pos = start + size + 1
        fields.append((name.decode(), value.decode()))
    return fields


@pytest.fixture
def journal_socket() -> Iterator[tuple[socket.socket, str]]:
    directory = tempfile.mkdtemp(prefix="vt-", dir="/tmp")
    path = os.path.join(directory, "socket")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.settimeout(5)
        yield sock, path
    shutil.rmtree(directory)


@pytest.fixture
def restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    for handler in saved[0]:
        root.addHandler(handler)
    root.setLevel(saved[1])


def test_structured_entry_reaches_the_socket(journal_socket: tuple[socket.socket, str]) -> None:
    sock, path = journal_socket
    logger = logging.getLogger("veritap.test.journal")
    logger.propagate = False
    handler = JournalHandler("collector", SocketJournal(path))
    logger.addHandler(handler)
    try:
        logger.warning(
            "capture gap on %s", "eth1", extra={"record_id": "01J0", "gap-bytes": 1448, "_pid": 7}
        )
        fields = dict(parse_native(sock.recv(1 << 20)))
        try:
            raise ValueError("bad\nrecord")
        except ValueError:
            logger.exception("parse failed", extra={"priority": "shadowed"})
        err = dict(parse_native(sock.recv(1 << 20)))
    finally:
        logger.removeHandler(handler)
        handler.close()
    assert fields["MESSAGE"] == "capture gap on eth1"
    assert fields["PRIORITY"] == "4"
    assert fields["SYSLOG_IDENTIFIER"] == "collector"
    assert fields["LOGGER"] == "veritap.test.journal"
    assert fields["CODE_FUNC"] == "test_structured_entry_reaches_the_socket"
    assert fields["RECORD_ID"] == "01J0"
    assert fields["GAP_BYTES"] == "1448"
    assert fields["PID"] == "7"
    assert err["PRIORITY"] == "3"
    assert err["EXCEPTION_TYPE"] == "ValueError"
    assert err["MESSAGE"].startswith("parse failed\nTraceback")
    assert "ValueError: bad\nrecord" in err["MESSAGE"]
    assert err["EXTRA_PRIORITY"] == "shadowed"


def test_a_message_id_is_the_journals_own_field() -> None:
    record = logging.LogRecord("verifierd", logging.ERROR, "f.py", 1, "intake stopped", None, None)
    record.message_id = MessageId.INTAKE_ALERT
    record.commitment_id = "ab" * 32
    fields = dict(journal.journal_fields(record, "verifierd", "intake stopped"))
    assert fields["MESSAGE_ID"] == "aa97b65a096e4701a887d5eb96eae6a1"
    assert fields["COMMITMENT_ID"] == "ab" * 32


def test_an_entry_too_big_for_a_datagram_travels_in_a_sealed_memfd(
    journal_socket: tuple[socket.socket, str],
) -> None:
    sock, path = journal_socket
    big = "x" * (4 << 20)
    SocketJournal(path).send((("MESSAGE", big), ("PRIORITY", "6")))
    data, fds, _flags, _addr = socket.recv_fds(sock, 16, 1)
    assert data == b""
    (fd,) = fds
    try:
        import fcntl

        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        assert seals & fcntl.F_SEAL_WRITE
        assert parse_native(os.pread(fd, 8 << 20, 0)) == [("MESSAGE", big), ("PRIORITY", "6")]
    finally:
        os.close(fd)


@given(
    st.lists(
        st.tuples(
            st.from_regex(r"[A-Z][A-Z0-9_]{0,30}", fullmatch=True),
            st.text(alphabet=st.characters(codec="utf-8", blacklist_categories=["Cs"])),
        ),
        max_size=6,
    )
)
def test_native_encoding_round_trips(fields: list[tuple[str, str]]) -> None:
    assert parse_native(encode_journal_entry(tuple(fields))) == fields


@given(st.text())
def test_field_names_are_valid_journal_names(key: str) -> None:
    name = journal_field_name(key)
    if name is not None:
        assert 0 < len(name) <= 64
        assert name[0].isalpha() and name[0].isupper()
        assert all(c.isdigit() or ("A" <= c <= "Z") or c == "_" for c in name)


def test_priorities() -> None:
    levels = [logging.CRITICAL, logging.ERROR, logging.WARNING, logging.INFO, logging.DEBUG, 25]
    assert [syslog_priority(level) for level in levels] == [2, 3, 4, 6, 7, 6]


def test_stderr_line_carries_the_extra_fields(restore_root_logger: None) -> None:
    stream = io.StringIO()
    logger = setup_logging("verifierd", logging.DEBUG, journal=False, stream=stream)
    logger.debug("batch done", extra={"commitment": "m1", "note": "two words"})
    line = stream.getvalue()
    assert line.endswith("DEBUG verifierd: batch done commitment=m1 note='two words'\n")


def test_setup_adds_the_journal_under_systemd(
    restore_root_logger: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    monkeypatch.delenv("INVOCATION_ID", raising=False)
    setup_logging("collector")
    kinds = [type(h) for h in logging.getLogger().handlers]
    assert kinds == [logging.StreamHandler]

    monkeypatch.setenv("INVOCATION_ID", "0123456789abcdef0123456789abcdef")
    setup_logging("collector", backend="socket")
    kinds = [type(h) for h in logging.getLogger().handlers]
    assert kinds == [JournalHandler, logging.StreamHandler]


def test_journal_stream_is_recognised_by_device_and_inode() -> None:
    with tempfile.TemporaryFile() as one, tempfile.TemporaryFile() as other:
        stat = os.fstat(one.fileno())
        env = {"JOURNAL_STREAM": f"{stat.st_dev}:{stat.st_ino}"}
        assert stderr_is_journal(env, fd=one.fileno())
        assert not stderr_is_journal(env, fd=other.fileno())
        assert not stderr_is_journal({}, fd=one.fileno())


def test_stderr_is_dropped_only_when_it_is_the_journal_stream(
    restore_root_logger: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INVOCATION_ID", "0123456789abcdef0123456789abcdef")
    monkeypatch.setattr(journal, "stderr_is_journal", lambda: True)
    setup_logging("collector", backend="socket")
    assert [type(h) for h in logging.getLogger().handlers] == [JournalHandler]
    setup_logging("collector", backend="socket", stderr=True)
    assert [type(h) for h in logging.getLogger().handlers] == [
        JournalHandler,
        logging.StreamHandler,
    ]


@pytest.mark.root
def test_libsystemd_sender_writes_the_same_fields() -> None:
    """sd_journal_sendv only knows /run/systemd/journal/socket: give it one in a
    private mount namespace, with a tmpfs over /run, and read what it sent."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a private mount namespace")
    script = (
        "import logging, socket, os, sys\n"
        "os.makedirs('/run/systemd/journal')\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
        "s.bind('/run/systemd/journal/socket'); s.settimeout(5)\n"
        "from appliance.journal import setup_logging\n"
        "os.environ['INVOCATION_ID'] = 'x'\n"
        "log = setup_logging('verifierd', backend='libsystemd', stderr=False)\n"
        "log.info('two\\nlines', extra={'commitment': 'm1'})\n"
        "sys.stdout.buffer.write(s.recv(1 << 20))\n"
    )
    command = f"mount -t tmpfs tmpfs /run && exec {sys.executable} -c {shlex.quote(script)}"
    out = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", command],
        capture_output=True,
        check=True,
        timeout=60,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    ).stdout
    fields = dict(parse_native(out))
    assert fields["MESSAGE"] == "two\nlines"
    assert fields["COMMITMENT"] == "m1"
    assert fields["SYSLOG_IDENTIFIER"] == "verifierd"

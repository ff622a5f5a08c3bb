"""Fixtures for the systemd glue: real unix datagram sockets standing in for systemd."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import tempfile
from collections.abc import Iterator

import pytest

from tests.appliance.datagram_listener import DatagramListener


@pytest.fixture
def path_listener() -> Iterator[DatagramListener]:
    # A short directory: unix socket paths are limited to 107 bytes.
    directory = tempfile.mkdtemp(prefix="vt-", dir="/tmp")
    path = os.path.join(directory, "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        yield DatagramListener(sock, path)
    shutil.rmtree(directory)


@pytest.fixture
def abstract_listener() -> Iterator[DatagramListener]:
    name = f"veritap-test-{secrets.token_hex(8)}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        yield DatagramListener(sock, "@" + name)

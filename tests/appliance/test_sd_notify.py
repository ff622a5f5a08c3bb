"""sd_notify against a real unix datagram socket, with both senders."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.errors import NotifyMessageError, NotifySocketError
from appliance.sd_notify import (
    DatagramTransport,
    Notifier,
    encode_notification,
    notify_address,
    watchdog_interval,
)
from tests.appliance.datagram_listener import DatagramListener

BACKENDS = ["socket", "libsystemd"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("listener_kind", ["path_listener", "abstract_listener"])
def test_each_notification_is_one_exact_datagram(
    backend: str,
    listener_kind: str,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    listener: DatagramListener = request.getfixturevalue(listener_kind)
    monkeypatch.setenv("NOTIFY_SOCKET", listener.env_value)
    notifier = Notifier.from_env(backend=backend)  # type: ignore[arg-type]
    assert notifier.enabled

    assert notifier.extend_timeout(90_000_000)
    assert listener.receive() == b"EXTEND_TIMEOUT_USEC=90000000"
    assert notifier.ready(status="serving 2 commitments")
    assert listener.receive() == b"READY=1\nSTATUS=serving 2 commitments"
    assert notifier.status("loading model m1\n(shard 3 of 8)")
    assert listener.receive() == b"STATUS=loading model m1 (shard 3 of 8)"
    assert notifier.watchdog()
    assert listener.receive() == b"WATCHDOG=1"
    assert notifier.stopping()
    assert listener.receive() == b"STOPPING=1"
    assert listener.pending() == []


def test_without_notify_socket_nothing_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    notifier = Notifier.from_env()
    assert not notifier.enabled
    assert notifier.ready(status="x") is False
    assert notifier.watchdog() is False


def test_a_vanished_socket_is_logged_not_raised(
    path_listener: DatagramListener, caplog: pytest.LogCaptureFixture
) -> None:
    notifier = Notifier(DatagramTransport(path_listener.env_value + "-gone"))
    with caplog.at_level(logging.WARNING, logger="appliance.sd_notify"):
        assert notifier.watchdog() is False
    (record,) = caplog.records
    assert getattr(record, "notification") == "WATCHDOG=1"  # noqa: B009


def test_a_child_process_reaches_the_socket(
    abstract_listener: DatagramListener,
) -> None:
    """The way a daemon really uses it: from its own process, found via the environment."""
    code = "from appliance.sd_notify import Notifier; Notifier.from_env().ready(status='up')"
    env = {**os.environ, "NOTIFY_SOCKET": abstract_listener.env_value}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    assert abstract_listener.receive() == b"READY=1\nSTATUS=up"


def test_notify_address() -> None:
    assert notify_address("/run/systemd/notify") == "/run/systemd/notify"
    assert notify_address("@name") == "\0name"
    for bad in ("@", "vsock:2:1234", "relative/path", ""):
        with pytest.raises(NotifySocketError):
            notify_address(bad)


def test_unsupported_address_fails_at_start_with_the_socket_backend(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", "vsock:2:1234")
    with pytest.raises(NotifySocketError, match="vsock"):
        Notifier.from_env(backend="socket")


def test_bad_fields_are_refused() -> None:
    with pytest.raises(NotifyMessageError):
        encode_notification(())
    with pytest.raises(NotifyMessageError):
        encode_notification((("ready", "1"),))
    with pytest.raises(NotifyMessageError):
        encode_notification((("STATUS", "a\nb"),))
    with pytest.raises(NotifyMessageError):
        Notifier(None).extend_timeout(0)


_names = st.from_regex(r"[A-Z_][A-Z0-9_]{0,20}", fullmatch=True)
_values = st.text(alphabet=st.characters(blacklist_characters="\n\0", codec="utf-8"))


@given(st.lists(st.tuples(_names, _values), min_size=1, max_size=8))
def test_encoding_round_trips(fields: list[tuple[str, str]]) -> None:
    """What systemd parses (split on newlines, then on the first '=') is what was sent."""
    data = encode_notification(tuple(fields))
    parsed = [tuple(line.split("=", 1)) for line in data.decode().split("\n")]
    assert parsed == fields


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"WATCHDOG_USEC": "30000000"}, 30.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "4242"}, 30.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "-5"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
    ],
)
def test_watchdog_interval(env: dict[str, str], expected: float | None) -> None:
    assert watchdog_interval(env, pid=4242) == expected


@given(st.integers(min_value=1, max_value=2**63), st.integers(min_value=1, max_value=2**22))
def test_watchdog_interval_is_usec_for_the_owner_only(usec: int, pid: int) -> None:
    env = {"WATCHDOG_USEC": str(usec), "WATCHDOG_PID": str(pid)}
    assert watchdog_interval(env, pid=pid) == usec / 1_000_000
    assert watchdog_interval(env, pid=pid + 1) is None

"""Watchdog pacing: ticks from a loop, and the asyncio task with a health check."""

from __future__ import annotations

import asyncio

import pytest

from appliance.sd_notify import DatagramTransport, Notifier
from appliance.watchdog import Watchdog
from tests.appliance.datagram_listener import DatagramListener


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_tick_pings_once_per_half_interval(path_listener: DatagramListener) -> None:
    clock = FakeClock()
    dog = Watchdog(Notifier(DatagramTransport(path_listener.env_value)), 10.0, clock)
    assert dog.period == 5.0
    sent = []
    for step in range(12):  # 0, 1, ..., 11 seconds
        clock.now = 100.0 + step
        sent.append(dog.tick())
    assert sent == [True, False, False, False, False, True] + [False] * 4 + [True, False]
    assert path_listener.pending() == [b"WATCHDOG=1"] * 3


def test_disabled_without_interval_or_socket(path_listener: DatagramListener) -> None:
    assert not Watchdog(Notifier(DatagramTransport(path_listener.env_value)), None).enabled
    assert not Watchdog(Notifier(None), 10.0).enabled
    assert Watchdog(Notifier(None), 10.0).tick() is False


def test_from_env_reads_watchdog_usec(
    path_listener: DatagramListener, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", path_listener.env_value)
    monkeypatch.setenv("WATCHDOG_USEC", "4000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    dog = Watchdog.from_env(Notifier.from_env(backend="socket"))
    assert dog.interval == 4.0


async def test_run_pings_while_healthy_and_stops_when_not(
    path_listener: DatagramListener,
) -> None:
    dog = Watchdog(Notifier(DatagramTransport(path_listener.env_value)), 0.02)
    healthy = True
    task = asyncio.create_task(dog.run(lambda: healthy))
    loop = asyncio.get_running_loop()
    for _ in range(3):
        assert await loop.run_in_executor(None, path_listener.receive) == b"WATCHDOG=1"
    healthy = False
    await asyncio.sleep(0.05)  # let the task observe the failed check
    path_listener.pending()
    for _ in range(5):
        await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert path_listener.pending() == []


async def test_run_returns_when_disabled() -> None:
    await asyncio.wait_for(Watchdog(Notifier(None), None).run(), timeout=5)

"""verifierd's [intake] table: the collector links' reconnect backoff, validated and used."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from veritap.config_schema import ConfigError
from veritap.signing import Signer

from verifierd.config import CollectorConfig, Config, IntakeConfig, parse_config
from verifierd.intake import Intake
from verifierd.intake.runner import reconnect_backoff
from verifierd.store import Store

pytestmark = pytest.mark.timeout(60)


def test_the_defaults_are_the_backoffs_own() -> None:
    intake = parse_config({}, Path("/")).intake
    assert intake == IntakeConfig()
    assert (intake.reconnect_initial_s, intake.reconnect_max_s, intake.reconnect_factor) == (
        0.05,
        5.0,
        2.0,
    )


def test_the_keys_are_read() -> None:
    table = {"reconnect_initial_s": 0.5, "reconnect_max_s": 60, "reconnect_factor": 3}
    intake = parse_config({"intake": table}, Path("/")).intake
    assert intake == IntakeConfig(
        reconnect_initial_s=0.5, reconnect_max_s=60.0, reconnect_factor=3.0
    )


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"reconnect_initial_s": 0}, "intake.reconnect_initial_s: must be >= 0.001, got 0"),
        ({"reconnect_initial_s": "1s"}, "intake.reconnect_initial_s: expected a number"),
        ({"reconnect_max_s": 7200}, "intake.reconnect_max_s: must be <= 3600.0, got 7200"),
        ({"reconnect_factor": 0.5}, "intake.reconnect_factor: must be >= 1.0, got 0.5"),
        ({"reconnect_factor": True}, "intake.reconnect_factor: expected a number"),
        (
            {"reconnect_initial_s": 2, "reconnect_max_s": 1},
            "intake.reconnect_max_s: 1 is below reconnect_initial_s (2)",
        ),
        ({"reconnect_jitter": 0.1}, "intake.reconnect_jitter: unknown key"),
    ],
)
def test_bad_values_name_the_key(table: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"intake": table}, Path("/"))
    assert str(caught.value).startswith(message)


def test_intake_must_be_a_table() -> None:
    with pytest.raises(ConfigError, match="intake: expected a table"):
        parse_config({"intake": 3}, Path("/"))


@given(
    initial=st.floats(0.001, 3600),
    maximum=st.floats(0.001, 3600),
    factor=st.floats(1.0, 100.0),
)
def test_any_valid_table_gives_delays_within_its_bounds(
    initial: float, maximum: float, factor: float
) -> None:
    table = {"reconnect_initial_s": initial, "reconnect_max_s": maximum, "reconnect_factor": factor}
    try:
        intake = parse_config({"intake": table}, Path("/")).intake
    except ConfigError as exc:
        assert maximum < initial and "reconnect_max_s" in str(exc)
        return
    backoff = reconnect_backoff(intake)
    delays = [backoff.next_delay() for _ in range(12)]
    assert all(initial / 2 <= delay <= maximum for delay in delays)
    backoff.reset()
    assert backoff.next_delay() <= initial


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_the_links_reconnect_with_the_configured_backoff(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A collector that is not there: the link retries, each delay inside [initial/2, max]."""
    collector = CollectorConfig(
        origin="collector.test/absent",
        address=f"127.0.0.1:{_closed_port()}",
        public_key=Signer.generate("collector.test/absent").verifier().key_string(),
    )
    config = Config(
        state_dir=tmp_path / "verifier",
        collectors=(collector,),
        intake=IntakeConfig(reconnect_initial_s=0.02, reconnect_max_s=0.04, reconnect_factor=1.5),
    )
    caplog.set_level(logging.INFO, logger="verifierd.intake.link")
    store = Store.open(tmp_path / "store")
    intake = Intake(store, config)
    await intake.start()
    try:
        deadline = time.monotonic() + 30
        while len(_delays(caplog)) < 5:
            assert time.monotonic() < deadline, "the link did not retry five times"
            await asyncio.sleep(0.02)
        # The link alternates between "connecting" and "retrying: ..." every few ms: poll
        # until the status shows it waiting out a delay, rather than sample it once.
        while not intake.status()[0].state.startswith("retrying"):
            assert time.monotonic() < deadline, intake.status()[0].state
            await asyncio.sleep(0.002)
    finally:
        await intake.stop()
        store.close()
    delays = _delays(caplog)
    assert all(0.01 <= d <= 0.04 for d in delays), delays


def _delays(caplog: pytest.LogCaptureFixture) -> list[float]:
    return [
        float(record.__dict__["delay_s"])
        for record in caplog.records
        if record.getMessage() == "collector link down, reconnecting"
    ]

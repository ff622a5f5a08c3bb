"""An entry the intake cannot receive raises an alert and intake moves on (never a retry loop).

Two ways an entry is too large for a stream message, each against a real LedgerService on
loopback with mutual TLS: the collector sends it as its hash (it refuses to send a message
the verifier must refuse), or the verifier's receive limit is smaller than what the
collector sends (RESOURCE_EXHAUSTED). Both store the entry's hash in its place, count an
intake alert with reason withheld_entry, audit it, and store the entries after it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from veritap.envelope import entry_hash
from veritap.tls import ClientTls
from veritap.tls import channel_options as real_channel_options

from collector.ledger import subscription
from collector.ledger.config import LedgerConfig
from collector.ledger.server import start_ledger_service
from collector.log import Log
from tests.ledger_fixtures import ORIGIN, make_record, open_log
from tests.polling import wait_for
from tests.verifierd.intake_pair import Pair
from verifierd.intake import Intake
from verifierd.intake import link as intake_link
from verifierd.metrics import VerifierMetrics

pytestmark = pytest.mark.timeout(90)

BIG = 20_000


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[Pair]:
    pair = Pair(tmp_path)
    yield pair
    for server in pair.servers:
        await server.stop(0)
    pair.store.close()


def log_with_a_big_entry(pair: Pair) -> Log:
    log = open_log(pair.root / "log", pair.signer, checkpoint_every=1)
    log.append_many([make_record(0), make_record(1, body_size=BIG), make_record(2)])
    return log


async def intake_past_the_big_entry(pair: Pair, log: Log, why: str) -> None:
    # Batches of at most 4 KiB, below the receive limit as 1 MiB is below 16 MiB in service,
    # so the big entry travels alone.
    config = LedgerConfig(
        listen="127.0.0.1:0", tls=pair.tls(), heartbeat_s=0.1, batch_bytes=4096,
        verifiers=("verifier-a",),
    )  # fmt: skip
    server = await start_ledger_service(log, config, log_dir=log.path)
    pair.servers.append(server)
    metrics = VerifierMetrics()
    intake = Intake(pair.store, pair.config(server.port), metrics=metrics)
    await intake.start()
    try:
        # The link's own count, which follows the store's cursor once the commit returns.
        await wait_for(lambda: intake.status()[0].stored_seq == 3, "the intake to pass it")
        status = intake.status()[0]
    finally:
        await intake.stop()
    assert status.alert_reason == "" and status.stored_seq == 3
    first, withheld, last = (pair.store.entry(ORIGIN, seq) for seq in (1, 2, 3))
    assert first is not None and first.envelope == log.entry(1)
    assert withheld is not None and withheld.envelope == b""
    assert withheld.entry_hash == entry_hash(log.entry(2))
    assert last is not None and last.envelope == log.entry(3)
    (event,) = [e for e in pair.store.audit_log() if e.action == "withheld_entry"]
    detail = json.loads(event.detail)
    assert (detail["origin"], detail["seq"]) == (ORIGIN, 2)
    assert detail["why"].startswith(why), detail
    assert detail["entry_hash"] == entry_hash(log.entry(2)).hex()
    labels = {"origin": ORIGIN, "reason": "withheld_entry"}
    assert metrics.registry.get_sample_value("veritap_verifier_intake_alerts_total", labels) == 1


async def test_an_entry_the_collector_sends_as_its_hash_is_an_alert(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(subscription, "MAX_ENVELOPE_BYTES", BIG // 2)
    log = log_with_a_big_entry(pair)
    await intake_past_the_big_entry(pair, log, "the collector sent only its hash")
    log.close()


async def test_an_entry_over_the_receive_limit_is_passed_by_its_hash(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    def small_receive_limit(tls: ClientTls | None) -> list[tuple[str, str | int]]:
        options = [
            o for o in real_channel_options(tls) if o[0] != "grpc.max_receive_message_length"
        ]
        return [*options, ("grpc.max_receive_message_length", BIG // 2)]

    monkeypatch.setattr(intake_link, "channel_options", small_receive_limit)
    log = log_with_a_big_entry(pair)
    await intake_past_the_big_entry(pair, log, "it cannot be received: ")
    log.close()

"""The LedgerService's metrics over real gRPC: subscribers, streamed entries, and a lag that
follows both the log's head and the subscriber's acknowledgements."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest
from veritap.envelope import ZERO_HASH
from veritap.signing import Signer
from veritap.v1 import ledger_pb2, ledger_pb2_grpc

from collector.ledger.config import LedgerConfig
from collector.ledger.server import start_ledger_service
from collector.metrics import CollectorMetrics
from tests.ledger_fixtures import ORIGIN, append, open_log

pytestmark = pytest.mark.timeout(60)
VERIFIER = "verifier-a"


async def eventually(check: Callable[[], bool], what: str) -> None:
    """Poll `check()` (bounded: 10 s) until it is true."""
    for _ in range(200):
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never: {what}")


async def test_lag_follows_head_and_acks(tmp_path: Path) -> None:
    metrics = CollectorMetrics()
    log = open_log(tmp_path / "log", Signer.generate(ORIGIN))
    append(log, 0, 20)
    config = LedgerConfig(listen="127.0.0.1:0")
    server = await start_ledger_service(log, config, log_dir=tmp_path / "log", metrics=metrics)
    requests: asyncio.Queue[ledger_pb2.SubscribeRequest] = asyncio.Queue()
    start = ledger_pb2.SubscribeStart(
        origin=ORIGIN, from_seq=1, prev_hash=ZERO_HASH, verifier_id=VERIFIER
    )
    requests.put_nowait(ledger_pb2.SubscribeRequest(start=start))

    async def outgoing() -> AsyncIterator[ledger_pb2.SubscribeRequest]:
        while True:
            yield await requests.get()

    def value(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value("veritap_collector_" + name, labels)

    def lag() -> float | None:
        return value("stream_lag_entries", subscriber=VERIFIER)

    def ack(seq: int) -> None:
        requests.put_nowait(
            ledger_pb2.SubscribeRequest(ack=ledger_pb2.SubscribeAck(durable_seq=seq))
        )

    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = ledger_pb2_grpc.LedgerServiceStub(channel)
            call = stub.Subscribe(outgoing())
            last = 0
            while last < 20:
                response = await asyncio.wait_for(call.read(), 10)
                assert isinstance(response, ledger_pb2.SubscribeResponse)
                if response.HasField("batch"):
                    last = response.batch.entries[-1].seq
            assert value("subscribers") == 1
            assert value("streamed_entries_total", subscriber=VERIFIER) == 20
            await eventually(lambda: lag() == 20, "lag 20 before any ack")
            ack(20)
            await eventually(lambda: lag() == 0, "lag 0 after the ack")
            append(log, 20, 5)  # the head moves on; nothing is acknowledged
            await eventually(lambda: lag() == 5, "lag 5 after the head moved")
            call.cancel()
        await eventually(lambda: value("subscribers") == 0, "no subscriber left")
        assert lag() is None  # a gone subscriber's lag is not kept at a stale value
    finally:
        await server.stop(0)
        log.close()

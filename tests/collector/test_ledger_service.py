"""The LedgerService over real gRPC on loopback: streaming, refusals, proofs, status, retention."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from veritap.chain import ChainVerifier
from veritap.envelope import ZERO_HASH, entry_hash
from veritap.merkle import ProofError, verify_inclusion
from veritap.note import open_checkpoint
from veritap.signing import Signer
from veritap.v1 import ledger_pb2, ledger_pb2_grpc

from collector.cli import main as collector_main
from collector.ledger.config import LedgerConfig
from collector.ledger.errors import LedgerError
from collector.ledger.server import LedgerServer, LedgerServiceThread, start_ledger_service
from collector.log import Log
from collector.metrics import CollectorMetrics
from tests.ledger_fixtures import ORIGIN, append, open_log

pytestmark = pytest.mark.timeout(60)


@dataclass
class Served:
    log: Log
    server: LedgerServer
    signer: Signer
    log_dir: Path
    metrics: CollectorMetrics

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.port}"


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    signer = Signer.generate(ORIGIN)
    log_dir = tmp_path / "log"
    log = open_log(log_dir, signer, checkpoint_every=50)
    for first, count in ((0, 50), (50, 50), (100, 20)):  # one transaction each: checkpoints 50, 100
        append(log, first, count, models=("model-a", "model-b"))
    config = LedgerConfig(listen="127.0.0.1:0", heartbeat_s=0.05, verifiers=("verifier-a",))
    metrics = CollectorMetrics()
    server = await start_ledger_service(log, config, log_dir=log_dir, metrics=metrics)
    yield Served(log, server, signer, log_dir, metrics)
    await server.stop(0)
    log.close()


def _start(
    from_seq: int = 1, prev_hash: bytes = ZERO_HASH, **fields: object
) -> ledger_pb2.SubscribeStart:
    start = ledger_pb2.SubscribeStart(origin=ORIGIN, from_seq=from_seq, prev_hash=prev_hash)
    for name, value in fields.items():
        if isinstance(value, list):
            getattr(start, name).extend(value)
        else:
            setattr(start, name, value)
    return start


class Subscriber:
    """A bare Subscribe client: queue requests, read responses, remember what came."""

    def __init__(self, channel: grpc.aio.Channel, start: ledger_pb2.SubscribeStart) -> None:
        self.requests: asyncio.Queue[ledger_pb2.SubscribeRequest] = asyncio.Queue()
        self.requests.put_nowait(ledger_pb2.SubscribeRequest(start=start))
        stub: ledger_pb2_grpc.LedgerServiceAsyncStub = ledger_pb2_grpc.LedgerServiceStub(channel)
        self.call = stub.Subscribe(self._drain())
        self.responses: list[ledger_pb2.SubscribeResponse] = []
        self.last_seq = start.from_seq - 1

    async def _drain(self) -> AsyncIterator[ledger_pb2.SubscribeRequest]:
        while True:
            yield await self.requests.get()

    def ack(self, seq: int) -> None:
        ack = ledger_pb2.SubscribeAck(durable_seq=seq)
        self.requests.put_nowait(ledger_pb2.SubscribeRequest(ack=ack))

    async def read_until(self, seq: int, *, ack: bool = True) -> None:
        while self.last_seq < seq:
            await self.read_one(ack=ack)

    async def read_one(self, *, ack: bool = True) -> ledger_pb2.SubscribeResponse:
        response = await asyncio.wait_for(self.call.read(), 10)
        assert isinstance(response, ledger_pb2.SubscribeResponse)
        self.responses.append(response)
        if response.HasField("batch"):
            self.last_seq = response.batch.entries[-1].seq
            if ack:
                self.ack(self.last_seq)
        return response

    def entries(self) -> list[ledger_pb2.StreamedEntry]:
        return [e for r in self.responses if r.HasField("batch") for e in r.batch.entries]


async def test_stream_is_complete_and_in_order_with_checkpoints_inline(served: Served) -> None:
    async with grpc.aio.insecure_channel(served.address) as channel:
        sub = Subscriber(channel, _start(verifier_id="verifier-a"))
        await sub.read_until(120)
        append(served.log, 120, 30)  # arrives through the commit listener
        await sub.read_until(150)
        sub.call.cancel()
    entries = sub.entries()
    assert [e.seq for e in entries] == list(range(1, 151))
    assert all(e.envelope == served.log.entry(e.seq) for e in entries)
    assert all(len(r.batch.entries) <= 64 for r in sub.responses if r.HasField("batch"))
    chain = ChainVerifier(origin=ORIGIN, verifier=served.signer.verifier())
    checkpoint_sizes = []
    for response in sub.responses:
        if response.HasField("batch"):
            for entry in response.batch.entries:
                chain.add(entry.seq, entry.envelope)
        elif response.HasField("checkpoint"):
            chain.check_checkpoint(response.checkpoint)  # sits right after its last entry
            checkpoint_sizes.append(response.checkpoint.tree_size)
    assert checkpoint_sizes[:2] == [50, 100]
    heartbeats = [r.heartbeat for r in sub.responses if r.HasField("heartbeat")]
    assert heartbeats and heartbeats[0].head_seq == 120
    sample = served.metrics.registry.get_sample_value
    assert sample("veritap_collector_streamed_entries_total", {"subscriber": "verifier-a"}) == 150


async def test_a_time_driven_checkpoint_follows_once_the_stream_is_idle(tmp_path: Path) -> None:
    signer = Signer.generate(ORIGIN)
    log = Log.open(tmp_path / "log", origin=ORIGIN, signer=signer, checkpoint_interval_s=0.2)
    append(log, 0, 7)
    server = await start_ledger_service(
        log, LedgerConfig(listen="127.0.0.1:0"), log_dir=tmp_path / "log"
    )
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            sub = Subscriber(channel, _start())
            while not any(r.HasField("checkpoint") for r in sub.responses):
                await sub.read_one()
            sub.call.cancel()
    finally:
        await server.stop(0)
        log.close()
    checkpoint = next(r.checkpoint for r in sub.responses if r.HasField("checkpoint"))
    assert checkpoint.tree_size == 7 == sub.last_seq


async def test_the_window_bounds_unacknowledged_entries(served: Served) -> None:
    async with grpc.aio.insecure_channel(served.address) as channel:
        sub = Subscriber(channel, _start(window=10))
        await sub.read_until(10, ack=False)
        for _ in range(4):  # only heartbeats while nothing is acknowledged
            assert not (await sub.read_one(ack=False)).HasField("batch")
        sub.ack(4)
        await sub.read_until(14, ack=False)
        assert sub.last_seq == 14
        sub.call.cancel()


async def test_filtered_models_arrive_as_hashes_that_keep_the_chain(served: Served) -> None:
    async with grpc.aio.insecure_channel(served.address) as channel:
        sub = Subscriber(channel, _start(models=["model-a"]))
        await sub.read_until(120)
        sub.call.cancel()
    chain = ChainVerifier(origin=ORIGIN, verifier=served.signer.verifier())
    for entry in sub.entries():
        envelope = served.log.entry(entry.seq)
        if entry.seq % 2 == 0:  # record index seq - 1 is odd: model-b
            assert entry.filtered_hash == entry_hash(envelope)
        else:
            assert entry.envelope == envelope
        chain.add(entry.seq, envelope)
    assert chain.tree_size == 120


@pytest.mark.parametrize(
    ("case", "code"),
    [
        ("wrong prev_hash", grpc.StatusCode.FAILED_PRECONDITION),
        ("past the head", grpc.StatusCode.OUT_OF_RANGE),
        ("other origin", grpc.StatusCode.NOT_FOUND),
        ("ack first", grpc.StatusCode.INVALID_ARGUMENT),
        ("ack of unsent", grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
async def test_refusals_never_skip_silently(
    served: Served, case: str, code: grpc.StatusCode
) -> None:
    prev_of_61 = entry_hash(served.log.entry(60))
    first = ledger_pb2.SubscribeRequest(start=_start(61, prev_of_61))
    if case == "wrong prev_hash":
        first.start.prev_hash = entry_hash(served.log.entry(59))
    elif case == "past the head":
        first.start.from_seq, first.start.prev_hash = 122, served.log.head().hash
    elif case == "other origin":
        first.start.origin = "someone.else/edge"
    elif case == "ack first":
        first = ledger_pb2.SubscribeRequest(ack=ledger_pb2.SubscribeAck(durable_seq=1))
    requests = [first]
    if case == "ack of unsent":
        requests.append(ledger_pb2.SubscribeRequest(ack=ledger_pb2.SubscribeAck(durable_seq=500)))
    async with grpc.aio.insecure_channel(served.address) as channel:
        stub: ledger_pb2_grpc.LedgerServiceAsyncStub = ledger_pb2_grpc.LedgerServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in stub.Subscribe(iter(requests), timeout=10):
                pass
    assert caught.value.code() == code


async def test_the_head_itself_and_the_retention_floor(served: Served) -> None:
    head = served.log.head()
    async with grpc.aio.insecure_channel(served.address) as channel:
        sub = Subscriber(channel, _start(head.seq + 1, head.hash))  # caught up: waits
        assert (await sub.read_one()).HasField("heartbeat")
        sub.call.cancel()
        before = entry_hash(served.log.entry(60))
        await asyncio.to_thread(served.log.prune, 61)
        sub = Subscriber(channel, _start(61, before))
        await sub.read_until(61)
        sub.call.cancel()
        sub = Subscriber(channel, _start(60, entry_hash(served.log.entry(61))))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await sub.read_one()
        assert caught.value.code() == grpc.StatusCode.OUT_OF_RANGE


async def test_inclusion_proofs_verify_and_tampered_ones_do_not(served: Served) -> None:
    async with grpc.aio.insecure_channel(served.address) as channel:
        stub: ledger_pb2_grpc.LedgerServiceAsyncStub = ledger_pb2_grpc.LedgerServiceStub(channel)
        proof = await stub.GetInclusionProof(
            ledger_pb2.GetInclusionProofRequest(seq=37, tree_size=100)
        )
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await stub.GetInclusionProof(ledger_pb2.GetInclusionProofRequest(seq=1, tree_size=99))
        with pytest.raises(grpc.aio.AioRpcError) as outside:
            await stub.GetInclusionProof(
                ledger_pb2.GetInclusionProofRequest(seq=101, tree_size=100)
            )
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    assert outside.value.code() == grpc.StatusCode.OUT_OF_RANGE
    body = open_checkpoint(proof.checkpoint.note, served.signer.verifier(), origin=ORIGIN)
    assert (body.tree_size, proof.tree_size) == (100, 100)
    assert proof.leaf_hash == entry_hash(served.log.entry(37))
    path = list(proof.path)
    verify_inclusion(36, 100, proof.leaf_hash, path, body.root_hash)
    flipped = bytearray(path[2])
    flipped[5] ^= 1
    for index, leaf, bad_path in (
        (36, proof.leaf_hash, [*path[:2], bytes(flipped), *path[3:]]),
        (36, entry_hash(served.log.entry(38)), path),
        (37, proof.leaf_hash, path),
        (36, proof.leaf_hash, path[:-1]),
    ):
        with pytest.raises(ProofError):
            verify_inclusion(index, 100, leaf, bad_path, body.root_hash)


async def test_head_status_health_and_reflection(served: Served) -> None:
    async with grpc.aio.insecure_channel(served.address) as channel:
        stub: ledger_pb2_grpc.LedgerServiceAsyncStub = ledger_pb2_grpc.LedgerServiceStub(channel)
        sub = Subscriber(channel, _start(verifier_id="verifier-a", window=30))
        await sub.read_until(30)
        await sub.read_one()  # the server has read the ack of 30 by the time it sends more
        head = await stub.GetHead(ledger_pb2.GetHeadRequest())
        status = await stub.GetStatus(ledger_pb2.GetStatusRequest())
        latest = await stub.GetCheckpoint(ledger_pb2.GetCheckpointRequest())
        health = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="veritap.v1.LedgerService")
        )
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        )
        services = [s.name async for r in reflection for s in r.list_services_response.service]
        sub.call.cancel()
    assert (head.origin, head.head_seq, head.head_hash) == (ORIGIN, 120, served.log.head().hash)
    assert head.retention_floor == 1
    assert (status.head_seq, status.checkpoints, status.origin) == (120, 2, ORIGIN)
    assert [(s.verifier_id, s.connected) for s in status.subscribers] == [("verifier-a", True)]
    assert status.subscribers[0].acked_seq >= 30
    assert latest.checkpoint.tree_size == 100
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    assert {"veritap.v1.LedgerService", "grpc.health.v1.Health"} <= set(services)


async def _acknowledged(channel: grpc.aio.Channel, seq: int) -> None:
    """Wait (bounded) until the server has read the subscriber's ack of ``seq``."""
    stub: ledger_pb2_grpc.LedgerServiceAsyncStub = ledger_pb2_grpc.LedgerServiceStub(channel)
    for _ in range(400):
        status = await stub.GetStatus(ledger_pb2.GetStatusRequest())
        if status.subscribers and status.subscribers[0].acked_seq >= seq:
            return
        await asyncio.sleep(0.025)
    raise AssertionError(f"the server never read the ack of {seq}")


async def test_log_prune_waits_for_every_configured_verifier(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with grpc.aio.insecure_channel(served.address) as channel:
        sub = Subscriber(channel, _start(verifier_id="verifier-a", window=60))
        await sub.read_until(60)
        await _acknowledged(channel, 60)
        sub.call.cancel()
    await served.server.stop(0)  # writes the acknowledgement book
    served.log.close()
    config = tmp_path / "collector.toml"
    config.write_text('[ledger]\nverifiers = ["verifier-a"]\n')
    common = ["log", "prune", str(served.log_dir), "--config", str(config), "--origin", ORIGIN]
    assert collector_main([*common, "--before", "62"]) == 1  # 61 is not acknowledged
    assert "verifier 'verifier-a' has acknowledged only up to seq 60" in capsys.readouterr().err
    with Log.open(served.log_dir, origin=ORIGIN, readonly=True) as log:
        assert log.retention_floor == 1  # nothing was deleted
    assert collector_main([*common, "--before", "61"]) == 0
    with Log.open(served.log_dir, origin=ORIGIN, readonly=True) as log:
        assert log.retention_floor == 61
        assert log.entry(61)


def test_a_threaded_daemon_runs_the_service_on_its_own_loop(tmp_path: Path) -> None:
    log = open_log(tmp_path / "log", Signer.generate(ORIGIN))
    append(log, 0, 5)
    stats = ledger_pb2.CaptureStats(packets=42)
    service = LedgerServiceThread(
        log,
        LedgerConfig(listen="127.0.0.1:0"),
        log_dir=tmp_path / "log",
        stats_provider=lambda: stats,
    )
    port = service.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = ledger_pb2_grpc.LedgerServiceStub(channel)
            append(log, 5, 5)
            status = stub.GetStatus(ledger_pb2.GetStatusRequest(), timeout=10)
    finally:
        service.stop()
        log.close()
    assert (status.head_seq, status.capture.packets) == (10, 42)


async def test_plaintext_off_loopback_is_refused_even_when_configured_in_code(
    tmp_path: Path,
) -> None:
    log = open_log(tmp_path / "log", Signer.generate(ORIGIN))
    try:
        with pytest.raises(LedgerError, match="loopback"):
            await start_ledger_service(
                log, LedgerConfig(listen="0.0.0.0:0"), log_dir=tmp_path / "log"
            )
    finally:
        log.close()


def test_a_port_in_use_is_an_error_at_start(tmp_path: Path) -> None:
    log = open_log(tmp_path / "log", Signer.generate(ORIGIN))
    first = LedgerServiceThread(log, LedgerConfig(listen="127.0.0.1:0"), log_dir=tmp_path / "log")
    port = first.start()
    config = LedgerConfig(listen=f"127.0.0.1:{port}")
    try:
        with pytest.raises(LedgerError):
            LedgerServiceThread(log, config, log_dir=tmp_path / "log").start()
    finally:
        first.stop()
        log.close()

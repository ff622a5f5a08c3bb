"""The VerifierService inside a real verifierd daemon (verifierd.daemon with the
verifier_api service plugged in), over the daemon's own store and commitments."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import grpc
import pytest
from veritap.v1 import verifier_pb2, verifier_pb2_grpc

from tests.recorded_traffic import install_committed_model
from verifierd.commitments import write_commitment
from verifierd.config import Config, ServiceConfig
from verifierd.daemon import Daemon
from verifierd.services import verifier_api

pytestmark = pytest.mark.timeout(120)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_the_daemon_serves_its_store_and_commitments(tmp_path: Path) -> None:
    model = install_committed_model(tmp_path / "model")
    commitments = tmp_path / "commitments"
    commitments.mkdir()
    write_commitment(model.commitment, commitments / "tiny-chat.json")
    address = f"127.0.0.1:{free_port()}"
    config = Config(
        state_dir=tmp_path / "state",
        key_file=tmp_path / "state" / "verifier.key",
        secret_file=tmp_path / "state" / "sampling.secret",
        commitments_dir=commitments,
        weights_dir=tmp_path / "model" / "weights",
        service=ServiceConfig(listen=address),
    )
    stop = asyncio.Event()
    daemon = asyncio.create_task(Daemon(config, factories=[verifier_api.create]).run(stop))
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = verifier_pb2_grpc.VerifierServiceStub(channel)
            listed = await stub.ListCommitments(
                verifier_pb2.ListCommitmentsRequest(), wait_for_ready=True, timeout=60
            )
            [commitment] = listed.commitments
            assert commitment.commitment_id == model.commitment.commitment_id
            stats = await stub.GetStats(verifier_pb2.GetStatsRequest(), timeout=10)
            assert stats.entries == 0 and stats.pending == 0
            [engine] = (await stub.GetEngines(verifier_pb2.GetEnginesRequest())).engines
            assert engine.state == verifier_pb2.ENGINE_STATE_UNLOADED
            assert engine.detail == ""
    finally:
        stop.set()
        assert await asyncio.wait_for(daemon, 60) == 0

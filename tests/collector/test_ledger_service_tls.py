"""TLS and mutual TLS on the LedgerService, with certificates the test generates."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from veritap.signing import Signer
from veritap.tls import ClientTls, ServerTls, channel_credentials
from veritap.v1 import ledger_pb2, ledger_pb2_grpc

from collector.ledger.config import LedgerConfig
from collector.ledger.server import start_ledger_service
from tests.ledger_fixtures import ORIGIN, append, open_log
from tests.tls import LoopbackPki, write_test_pki

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def pki(tmp_path: Path) -> LoopbackPki:
    return write_test_pki(tmp_path / "pki")


async def _serve(tmp_path: Path, tls: ServerTls) -> AsyncIterator[str]:
    log = open_log(tmp_path / "log", Signer.generate(ORIGIN))
    append(log, 0, 3)
    config = LedgerConfig(listen="127.0.0.1:0", tls=tls)
    server = await start_ledger_service(log, config, log_dir=tmp_path / "log")
    try:
        yield f"127.0.0.1:{server.port}"
    finally:
        await server.stop(0)
        log.close()


@pytest.fixture
async def mtls_address(tmp_path: Path, pki: LoopbackPki) -> AsyncIterator[str]:
    async for address in _serve(tmp_path, ServerTls(pki.server_cert, pki.server_key, pki.ca)):
        yield address


async def _head(address: str, tls: ClientTls | None) -> ledger_pb2.GetHeadResponse:
    channel = (
        grpc.aio.insecure_channel(address)
        if tls is None
        else grpc.aio.secure_channel(address, channel_credentials(tls))
    )
    async with channel:
        stub: ledger_pb2_grpc.LedgerServiceAsyncStub = ledger_pb2_grpc.LedgerServiceStub(channel)
        return await stub.GetHead(ledger_pb2.GetHeadRequest(), timeout=5)


async def test_a_client_with_a_certificate_from_the_ca_is_served(
    mtls_address: str, pki: LoopbackPki
) -> None:
    head = await _head(mtls_address, ClientTls(pki.ca, pki.client_cert, pki.client_key))
    assert head.head_seq == 3


@pytest.mark.parametrize("client", ["no certificate", "rogue certificate", "plaintext"])
async def test_clients_without_a_good_certificate_are_refused(
    mtls_address: str, pki: LoopbackPki, client: str
) -> None:
    tls = {
        "no certificate": ClientTls(pki.ca),
        "rogue certificate": ClientTls(pki.ca, pki.rogue_cert, pki.rogue_key),
        "plaintext": None,
    }[client]
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _head(mtls_address, tls)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_server_only_tls_needs_no_client_certificate_but_a_trusted_server(
    tmp_path: Path, pki: LoopbackPki
) -> None:
    async for address in _serve(tmp_path, ServerTls(pki.server_cert, pki.server_key)):
        assert (await _head(address, ClientTls(pki.ca))).head_seq == 3
        # A client pinning another CA does not trust this server.
        with pytest.raises(grpc.aio.AioRpcError):
            await _head(address, ClientTls(pki.rogue_ca))


async def _start_then_wait(
    start: ledger_pb2.SubscribeStart,
) -> AsyncIterator[ledger_pb2.SubscribeRequest]:
    yield ledger_pb2.SubscribeRequest(start=start)
    await asyncio.Event().wait()  # keep the request stream open until the call ends


@pytest.mark.parametrize(("verifier_id", "allowed"), [("verifier-a", True), ("verifier-b", False)])
async def test_a_subscriber_acknowledges_only_under_its_certificate_name(
    mtls_address: str, pki: LoopbackPki, verifier_id: str, allowed: bool
) -> None:
    start = ledger_pb2.SubscribeStart(
        origin=ORIGIN, from_seq=1, prev_hash=bytes(32), verifier_id=verifier_id
    )
    tls = ClientTls(pki.ca, pki.client_cert, pki.client_key)
    async with grpc.aio.secure_channel(mtls_address, channel_credentials(tls)) as channel:
        stub: ledger_pb2_grpc.LedgerServiceAsyncStub = ledger_pb2_grpc.LedgerServiceStub(channel)
        call = stub.Subscribe(_start_then_wait(start), timeout=10)
        if allowed:
            response = await call.read()
            assert isinstance(response, ledger_pb2.SubscribeResponse)
            assert [e.seq for e in response.batch.entries] == [1, 2, 3]
            call.cancel()
        else:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call.read()
            assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED

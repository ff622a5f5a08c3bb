"""The provers under test: a store with calibrated prover tables, and its service with mTLS;
a restartable verifier (``verifier``) under a module's ``prover_config``."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from veritap.signing import Signer
from veritap.tls import ClientTls, channel_credentials
from veritap.v1 import verifier_pb2_grpc

from tests.service_pki import ADMIN_CN, ServicePki, write_service_pki
from tests.verifierd.provers.prover_fixtures import (
    CID,
    FLOAT32_TAILS,
    Clock,
    ProverTraffic,
    Verifier,
)
from verifierd.api import ServiceSettings, VerifierServer, start_verifier_service
from verifierd.commitments import CommitmentRegistry
from verifierd.config import ProversConfig
from verifierd.provers.store import ProverTables
from verifierd.store import Store


@dataclass
class Provers:
    """Prover tables with CID calibrated at FLOAT32_TAILS, on a store fed by ``traffic``;
    their clock stands still until the test moves it."""

    store: Store
    signer: Signer
    tables: ProverTables
    traffic: ProverTraffic
    clock: Clock


@dataclass
class Served(Provers):
    """The provers behind a running VerifierService (mTLS, ADMIN_CN the admin)."""

    pki: ServicePki
    server: VerifierServer

    def stub(self, tls: ClientTls | None = None) -> verifier_pb2_grpc.VerifierServiceStub:
        creds = channel_credentials(tls or self.pki.client_tls(self.pki.operator))
        channel = grpc.aio.secure_channel(f"localhost:{self.server.port}", creds)
        return verifier_pb2_grpc.VerifierServiceStub(channel)

    def admin(self) -> verifier_pb2_grpc.VerifierServiceStub:
        return self.stub(self.pki.client_tls(self.pki.admin))


@pytest.fixture
def provers(tmp_path: Path) -> Iterator[Provers]:
    store = Store.open(tmp_path / "store")
    signer = Signer.generate("verifier-test")
    clock = Clock(time.time_ns())
    tables = ProverTables(store, ProversConfig(), signer, clock=clock)
    tables.set_honest_tails(CID, FLOAT32_TAILS, actor="calibration")
    yield Provers(store, signer, tables, ProverTraffic(store, signer), clock)
    store.close()


@pytest.fixture
async def served(provers: Provers, tmp_path: Path) -> AsyncIterator[Served]:
    pki = write_service_pki(tmp_path / "pki")
    settings = ServiceSettings(
        listen="127.0.0.1:0", tls=pki.server_tls(), admin_subjects=frozenset({ADMIN_CN})
    )
    server = await start_verifier_service(
        provers.store, CommitmentRegistry.of([]), settings, provers=provers.tables
    )
    p = provers
    yield Served(p.store, p.signer, p.tables, p.traffic, p.clock, pki, server)
    await server.stop(0)


@pytest.fixture
def prover_config() -> ProversConfig:
    """The config of the ``verifier`` fixture's prover tables (a module overrides it)."""
    return ProversConfig()


@pytest.fixture
def verifier(tmp_path: Path, prover_config: ProversConfig) -> Iterator[Verifier]:
    v = Verifier(tmp_path / "store", prover_config)
    yield v
    v.close()

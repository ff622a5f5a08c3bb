"""Both ends of verifierd's intake on loopback: a collector's signed log served by a real
LedgerService (mutual TLS, certificates made for the test), and verifierd's store and
config pointing at it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from veritap.signing import Signer
from veritap.tls import ServerTls

from collector.ledger.config import LedgerConfig
from collector.ledger.server import LedgerServer, start_ledger_service
from collector.log import Log
from tests.ledger_fixtures import ORIGIN
from tests.tls import LoopbackPki, write_test_pki
from verifierd.config import CollectorConfig, Config
from verifierd.store import Store


class Pair:
    """A signed log served by a LedgerService, and a verifierd config pointing at it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.pki: LoopbackPki = write_test_pki(root / "pki")
        self.signer = Signer.generate(ORIGIN)
        self.servers: list[LedgerServer] = []
        self.store = Store.open(root / "verifier" / "store")

    def tls(self) -> ServerTls:
        return ServerTls(self.pki.server_cert, self.pki.server_key, self.pki.ca)

    async def serve(self, log: Log, *, port: int = 0) -> LedgerServer:
        config = LedgerConfig(
            listen=f"127.0.0.1:{port}", tls=self.tls(), heartbeat_s=0.1, verifiers=("verifier-a",)
        )
        server = await start_ledger_service(log, config, log_dir=log.path)
        self.servers.append(server)
        return server

    def config(self, port: int, **collector: Any) -> Config:
        pki = self.pki
        source = CollectorConfig(
            origin=ORIGIN,
            address=f"localhost:{port}",
            public_key=self.signer.verifier().key_string(),
            ca_file=str(pki.ca),
            cert_file=str(pki.client_cert),
            key_file=str(pki.client_key),
            window=256,
        )
        return Config(
            state_dir=self.root / "verifier",
            verifier_id="verifier-a",
            collectors=(replace(source, **collector),),
        )

    def stored(self) -> int:
        return self.store.cursor(ORIGIN).seq

    def checkpointed(self) -> int:
        checkpoint = self.store.cursor(ORIGIN).checkpoint
        return 0 if checkpoint is None else checkpoint.tree_size

"""Real daemons for the console's tests, in a thread and event loop of their own.

A collector (signed LMDB log holding the recorded exchanges, served by its LedgerService)
and a verifierd (intake subscribed to that collector, LMDB store, VerifierService), all on
loopback with mutual TLS. The intake pulls the whole log, then every record gets its
recorded outcome (signed verdict or a place in the queue), so the console sees what it
would see on an appliance that verified this traffic. The console under test runs in the
test's own loop (or in App.run's), like an operator's terminal beside the daemons.

With ``provers=True`` verifierd also keeps prover tables (on a fixed clock) holding, beside
the recorded traffic's prover, an honest prover and a dishonest one whose sequential test
raised an alarm (tests.verifierd.provers.prover_fixtures), and serves them.

The collector's log stamps each entry with the time it was appended, so entry hashes
differ from run to run. Snapshot tests of screens that show them start the daemons with
``intake=False``: verifierd's store then receives the same records as a log with fixed
stamps (the collector still serves its own copy), and every pixel is the same each run.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from veritap.signing import Signer
from veritap.v1 import log_pb2, record_pb2

from collector.ledger.config import LedgerConfig
from collector.ledger.server import LedgerServer, start_ledger_service
from collector.log import Log
from tests.recorded_traffic import (
    BASE_NS,
    EXCHANGES,
    ORIGIN,
    PASS,
    SECOND,
    Exchange,
    classify_inbox,
    collector_signer,
    install_committed_model,
    make_record,
    store_as_log,
    verdict_for,
    verifier_signer,
)
from tests.service_pki import ADMIN_SUBJECT, VERIFIER_CN, CertFiles, write_service_pki
from tests.verifierd.provers.prover_fixtures import (
    CID,
    FLOAT32_TAILS,
    Outcome,
    ProverTraffic,
    dishonest,
    honest,
)
from tui.client import ConsoleClient, Endpoint
from verifierd.api import ServiceSettings, ServiceSources, VerifierServer, start_verifier_service
from verifierd.commitments import CommitmentRegistry
from verifierd.config import CollectorConfig, Config, ProversConfig
from verifierd.intake import Intake
from verifierd.provers.identity import ProverKey
from verifierd.provers.store import ProverTables
from verifierd.store import Store, VerdictWrite
from verifierd.verdicts import sign_verdict

T = TypeVar("T")

#: The prover tables' clock, and the provers they judge beside the recorded traffic's.
PROVERS_NOW_NS = BASE_NS + 3600 * SECOND
HONEST_PROVER = ProverKey("edge-2.lab", "10.20.2.7", 8000)
DISHONEST_PROVER = ProverKey("edge-2.lab", "fd00::9", 8000)

#: How the console names the daemons.
VERIFIER_NAME = "verifierd"
COLLECTOR_NAME = "edge-1"
_TIMEOUT_S = 60.0


class Daemons:
    def __init__(
        self,
        root: Path,
        *,
        intake: bool = True,
        exchanges: Sequence[Exchange] = EXCHANGES,
        provers: bool = False,
    ) -> None:
        self.root = root
        self._with_intake = intake
        self.exchanges = tuple(exchanges)
        self.pki = write_service_pki(root / "pki")
        self.model = install_committed_model(root / "model")
        self.registry = CommitmentRegistry.of([self.model.commitment])
        self.signer: Signer = verifier_signer()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.store = Store.open(root / "verifier" / "store")
        self.provers: ProverTables | None = None
        if provers:
            self.provers = ProverTables(
                self.store, ProversConfig(), self.signer, clock=lambda: PROVERS_NOW_NS
            )
            self.provers.set_honest_tails(CID, FLOAT32_TAILS, actor="calibration")
        self._prover_traffic = ProverTraffic(self.store, self.signer)
        self.log: Log | None = None
        self.ledger: LedgerServer | None = None
        self.intake: Intake | None = None
        self.verifier: VerifierServer | None = None
        self.verifier_port = 0
        self.ledger_port = 0

    # -- running coroutines in the daemons' loop ---------------------------------------

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(_TIMEOUT_S)

    async def acall(self, coro: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return await asyncio.wait_for(asyncio.wrap_future(future), _TIMEOUT_S)

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        self.call(self._start())

    async def _start(self) -> None:
        signer = collector_signer()
        log = Log.open(self.root / "collector" / "log", origin=ORIGIN, signer=signer)
        self.log = log
        await asyncio.to_thread(
            log.append_many, [make_record(e, self.model.tokenizer) for e in self.exchanges]
        )
        await self._start_ledger(0)
        assert self.ledger is not None
        if self.provers is not None:
            await asyncio.to_thread(self._judge_provers)
        if not self._with_intake:
            await asyncio.to_thread(self._replay_into_store)
            await self._start_verifier(0)
            return
        config = Config(
            state_dir=self.root / "verifier",
            verifier_id=VERIFIER_CN,
            collectors=(
                CollectorConfig(
                    origin=ORIGIN,
                    address=f"localhost:{self.ledger_port}",
                    public_key=signer.verifier().key_string(),
                    ca_file=str(self.pki.ca),
                    cert_file=str(self.pki.verifier.cert),
                    key_file=str(self.pki.verifier.key),
                ),
            ),
        )
        self.intake = Intake(self.store, config)
        await self.intake.start()
        deadline = time.monotonic() + _TIMEOUT_S
        while self._judgeable() < len(self.exchanges) or not self._streaming():
            if time.monotonic() > deadline:
                raise AssertionError("the intake did not catch up with the collector")
            await asyncio.sleep(0.05)
        await asyncio.to_thread(
            classify_inbox, self.store, self.model, self.signer, exchanges=self.exchanges
        )
        await self._start_verifier(0)

    def _judgeable(self) -> int:
        """How many entries a verified checkpoint in the store covers."""
        checkpoint = self.store.cursor(ORIGIN).checkpoint
        return 0 if checkpoint is None else checkpoint.tree_size

    def _judge_provers(self) -> None:
        """Verdicts about an honest and a dishonest prover, a second apart."""
        at = [BASE_NS + n * SECOND for n in range(12)]
        self.judge(HONEST_PROVER, [honest(100, t) for t in at])
        self.judge(DISHONEST_PROVER, [dishonest(50, t) for t in at])

    def judge(self, prover: ProverKey, outcomes: Sequence[Outcome]) -> list[str]:
        """Records from ``prover`` and their verdicts, written as the pipeline writes them;
        returns their record ids."""
        return self._prover_traffic.send(prover, outcomes)

    def _replay_into_store(self) -> None:
        """Ingest the exchanges as ORIGIN's log with fixed stamps, and classify them."""
        store_as_log(self.store, [make_record(e, self.model.tokenizer) for e in self.exchanges])
        classify_inbox(self.store, self.model, self.signer, exchanges=self.exchanges)

    async def _start_ledger(self, port: int) -> None:
        assert self.log is not None
        self.ledger = await start_ledger_service(
            self.log,
            LedgerConfig(
                listen=f"127.0.0.1:{port}",
                tls=self.pki.server_tls(),
                verifiers=(VERIFIER_CN,),
                heartbeat_s=0.2,
            ),
            log_dir=self.log.path,
        )
        self.ledger_port = self.ledger.port

    async def stop_collector(self) -> None:
        """Take the collector's LedgerService away."""
        assert self.ledger is not None
        await self.acall(self.ledger.stop(0))
        self.ledger = None

    async def restart_collector(self) -> None:
        await self.acall(self._start_ledger(self.ledger_port))

    def _streaming(self) -> bool:
        assert self.intake is not None
        return all(
            s.state == "streaming" and s.remote_head_seq == len(self.exchanges)
            for s in self.intake.status()
        )

    async def _start_verifier(self, port: int) -> None:
        self.verifier = await start_verifier_service(
            self.store,
            self.registry,
            ServiceSettings(
                listen=f"127.0.0.1:{port}",
                tls=self.pki.server_tls(),
                admin_subjects=frozenset({ADMIN_SUBJECT}),
            ),
            weights=self.model.weights,
            sources=ServiceSources(intake=self.intake),
            provers=self.provers,
        )
        self.verifier_port = self.verifier.port

    async def stop_verifier(self) -> None:
        """Take verifierd's API away (as a crash or restart would)."""
        assert self.verifier is not None
        await self.acall(self.verifier.stop(0))
        self.verifier = None

    async def restart_verifier(self) -> None:
        """Bring it back on the same port."""
        await self.acall(self._start_verifier(self.verifier_port))

    def close(self) -> None:
        self.call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(_TIMEOUT_S)
        self._loop.close()
        self.store.close()
        if self.log is not None:
            self.log.close()

    async def _close(self) -> None:
        if self.verifier is not None:
            await self.verifier.stop(0)
        if self.intake is not None:
            await self.intake.stop()
        if self.ledger is not None:
            await self.ledger.stop(0)

    # -- the console's view -------------------------------------------------------------

    def client(self, who: CertFiles | None = None, *, timeout_s: float = 3.0) -> ConsoleClient:
        """A console client with the operator's certificate (or ``who``'s)."""
        return ConsoleClient(
            Endpoint(VERIFIER_NAME, f"localhost:{self.verifier_port}"),
            [Endpoint(COLLECTOR_NAME, f"localhost:{self.ledger_port}")],
            tls=self.pki.client_tls(who or self.pki.operator),
            timeout_s=timeout_s,
        )

    # -- more traffic -------------------------------------------------------------------

    def decide_pending(self, count: int, status: int = PASS) -> list[str]:
        """Give the oldest ``count`` queued records a signed verdict (as the engine would);
        returns their record ids."""
        items = self.store.take_pending(self.model.commitment.commitment_id, count, 1 << 63)
        writes = []
        for item in items:
            entry = self.store.entry(item.origin, item.seq)
            assert entry is not None
            record_id = record_pb2.InferenceRecord.FromString(
                log_pb2.Entry.FromString(entry.envelope).record
            ).record_id
            exchange = next(e for e in self.exchanges if e.record_id == record_id)
            verdict = verdict_for(exchange, entry, self.model.commitment, self.model.tokenizer)
            verdict.status = status  # type: ignore[assignment]
            signed = sign_verdict(verdict, self.signer)
            writes.append(
                (item.key, VerdictWrite(item.origin, item.seq, record_id, signed, verdict))
            )
        self.store.finish(writes)
        return [write.record_id for _, write in writes]

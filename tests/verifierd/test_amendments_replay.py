"""A crafted capture with a late differing copy, through `collector replay` and verifierd.

Two keep-alive exchanges; a differing copy of the first answer arrives after its record
was written, so the collector's log holds: the first record (complete), its amendment,
the second record. The log is served by the collector's LedgerService, verifierd's
intake stores it, and the pipeline (engine double) judges it, one entry at a time, with
a verifierd restart in between: whether the first record was judged before its amendment
came or not, it ends UNVERIFIABLE(record_amended), a PASS it had kept in the history.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import grpc
import pytest
from veritap.envelope import decode_envelope, decode_record
from veritap.signing import Signer
from veritap.tls import channel_credentials
from veritap.v1 import verifier_pb2, verifier_pb2_grpc

from collector.cli import main as collector_main
from collector.log import Log
from tests.collector.late_copies import late_copy_of_a_written_answer
from tests.ledger_fixtures import ORIGIN
from tests.pcapgen import frame, write_frames
from tests.polling import wait_for
from tests.service_pki import ADMIN_CN, write_service_pki
from tests.verifierd.commitment_fixtures import commit, make_model_dir
from tests.verifierd.engine_doubles import FACTORY
from tests.verifierd.intake_pair import Pair
from verifierd.api import ServiceSettings, start_verifier_service
from verifierd.commitments import CommitmentRegistry, DifrSettings, write_commitment
from verifierd.config import Config, EnginesConfig, SchedulerConfig
from verifierd.engine.pool import EnginePool
from verifierd.intake import Intake
from verifierd.pipeline import Pipeline
from verifierd.provers.identity import ProverKey
from verifierd.provers.store import ProverTables
from verifierd.store import Store, StoredVerdict
from verifierd.verdicts import check_signed_verdict
from verifierd.weights_cache import WeightsCache

pytestmark = pytest.mark.timeout(180)

PASS = verifier_pb2.VERDICT_STATUS_PASS
UNVERIFIABLE = verifier_pb2.VERDICT_STATUS_UNVERIFIABLE


class Verifierd:
    """verifierd's store, prover tables and pipeline over one state directory; restarted
    by opening them again (the signing key is the same, as its key file would be)."""

    def __init__(self, pair: Pair, config: Config) -> None:
        self.config = config
        self.signer = Signer.generate("verifierd")
        self.collector = pair.signer
        self.pool = EnginePool(config.engines)
        self.store = pair.store
        self._start()

    def _start(self) -> None:
        self.tables = ProverTables(self.store, self.config.provers, self.signer)
        self.pipeline = Pipeline(
            config=self.config,
            store=self.store,
            registry=CommitmentRegistry.from_dir(self.config.commitments_dir),
            weights=WeightsCache(self.config.weights_dir),
            pool=self.pool,
            signer=self.signer,
            secret=b"s" * 32,
            collector_keys={ORIGIN: self.collector.verifier()},
        )

    def restart(self) -> None:
        self.store.close()
        self.store = Store.open(self.config.store_dir)
        self._start()

    def step(self) -> None:
        """Classify one entry, then run one engine batch."""
        self.pipeline.classify_some()
        self.pipeline.score_some()

    def verdict(self, seq: int) -> StoredVerdict:
        stored = self.store.verdict(ORIGIN, seq)
        assert stored is not None, f"entry {seq} has no verdict"
        assert check_signed_verdict(stored.signed, self.signer.verifier()) == stored.verdict
        return stored

    def close(self) -> None:
        self.pool.close()
        self.store.close()


async def replayed_into(tmp_path: Path, *, models: tuple[str, ...] = ()) -> Verifierd:
    """The capture replayed into a collector log, served, and stored by verifierd's
    intake subscribed to ``models`` (all when empty); nothing judged yet."""
    conv, packets, _answer, _late = late_copy_of_a_written_answer()
    pcap = write_frames(tmp_path / "late.pcap", [(p.ts, frame(conv, p)) for p in packets])
    log_dir = tmp_path / "log"
    assert collector_main(["replay", str(pcap), "--log", str(log_dir), "--origin", ORIGIN]) == 0
    pair = Pair(tmp_path / "pair")
    pair.signer = Signer.load(log_dir / "collector.key")
    log = Log.open(log_dir, origin=ORIGIN, signer=pair.signer)
    server = await pair.serve(log)
    intake = Intake(pair.store, pair.config(server.port, models=models))
    await intake.start()
    try:
        await wait_for(lambda: pair.checkpointed() == 3, "the intake to store the log")
    finally:
        await intake.stop()
        await server.stop(0)
        log.close()
    model = make_model_dir(tmp_path / "model")
    c = commit(
        model,
        served_model_names=("first", "second"),
        generation_config="vllm",
        difr=DifrSettings(threshold=0.05, delta_max=5.0, sample_rate=1.0),
    )
    config = dataclasses.replace(
        pair.config(server.port),
        commitments_dir=tmp_path / "commitments",
        weights_dir=tmp_path / "weights",
        engines=EnginesConfig(backend=FACTORY, max_batch_requests=4),
        scheduler=SchedulerConfig(backoff_initial_s=0.0, max_attempts=2, classify_batch=1),
    )
    config.commitments_dir.mkdir()
    write_commitment(c, config.commitments_dir / "tiny.json")
    WeightsCache(config.weights_dir).install(c, model)
    return Verifierd(pair, config)


def records(verifierd: Verifierd) -> list[str]:
    """The record ids of the log's entries received whole: first, amendment, second."""
    ids = []
    for seq in (1, 2, 3):
        entry = verifierd.store.entry(ORIGIN, seq)
        assert entry is not None
        if entry.envelope:
            ids.append(decode_record(decode_envelope(entry.envelope)).record_id)
    return ids


def prover_counts(verifierd: Verifierd) -> dict[tuple[int, str], int]:
    (prover,) = verifierd.tables.provers()
    assert ProverKey.of_proto(prover.id).origin == ORIGIN
    since_first_seen = next(w for w in prover.windows if w.window_s == 0)
    return {(c.status, c.reason): c.count for c in since_first_seen.counts}


async def test_a_passed_record_is_superseded_when_its_amendment_arrives_after_a_restart(
    tmp_path: Path,
) -> None:
    verifierd = await replayed_into(tmp_path)
    try:
        first, amendment, second = records(verifierd)
        verifierd.step()
        passed = verifierd.verdict(1)
        assert (passed.verdict.record_id, passed.verdict.status) == (first, PASS)

        verifierd.restart()
        verifierd.step()
        verifierd.step()
        now = verifierd.verdict(1).verdict
        assert (now.status, now.reason, now.amended_by_record_id) == (
            UNVERIFIABLE,
            "record_amended",
            amendment,
        )
        assert (now.supersedes.status, now.supersedes.decided_at_ns) == (
            PASS,
            passed.verdict.decided_at_ns,
        )
        assert f"of record {first} arrived in 2 versions" in now.detail
        assert [h.signed for h in verifierd.store.verdict_history(ORIGIN, 1)] == [passed.signed]
        own = verifierd.verdict(2).verdict
        assert (own.record_id, own.status, own.reason) == (amendment, UNVERIFIABLE, "amendment")
        assert (verifierd.verdict(3).verdict.record_id, verifierd.verdict(3).verdict.status) == (
            second,
            PASS,
        )
        assert prover_counts(verifierd) == {(PASS, ""): 1, (UNVERIFIABLE, "record_amended"): 1}
        await verdict_api_shows_the_superseded_pass(verifierd, tmp_path, first, passed)
    finally:
        verifierd.close()


async def verdict_api_shows_the_superseded_pass(
    verifierd: Verifierd, tmp_path: Path, first: str, passed: StoredVerdict
) -> None:
    """GetVerdict and ListVerdicts, from the VerifierService over the store."""
    pki = write_service_pki(tmp_path / "pki")
    settings = ServiceSettings(
        listen="127.0.0.1:0", tls=pki.server_tls(), admin_subjects=frozenset({ADMIN_CN})
    )
    server = await start_verifier_service(verifierd.store, verifierd.pipeline.registry, settings)
    creds = channel_credentials(pki.client_tls(pki.operator))
    try:
        async with grpc.aio.secure_channel(f"localhost:{server.port}", creds) as channel:
            stub = verifier_pb2_grpc.VerifierServiceStub(channel)
            got = await stub.GetVerdict(verifier_pb2.GetVerdictRequest(record_id=first))
            assert (got.verdict.reason, got.verdict.supersedes.status) == ("record_amended", PASS)
            assert list(got.superseded) == [passed.signed]
            listed = await stub.ListVerdicts(verifier_pb2.ListVerdictsRequest(page_size=10))
            mine = [v for v in listed.verdicts if v.record_id == first]
            assert [(v.reason, v.supersedes.status) for v in mine] == [("record_amended", PASS)]
            assert len(listed.verdicts) == 3
    finally:
        await server.stop(0)


async def test_a_record_whose_amendment_was_seen_first_is_judged_amended_after_a_restart(
    tmp_path: Path,
) -> None:
    # Subscribed to "first" only: the amendment, which has no model, still comes whole.
    verifierd = await replayed_into(tmp_path, models=("first",))
    try:
        first, amendment = records(verifierd)[:2]
        verifierd.pipeline.classify_some()
        verifierd.pipeline.classify_some()
        assert verifierd.store.verdict(ORIGIN, 1) is None
        assert verifierd.store.counts().pending == 1

        verifierd.restart()
        for _ in range(3):
            verifierd.step()
        v = verifierd.verdict(1).verdict
        assert (v.record_id, v.status, v.reason, v.amended_by_record_id) == (
            first,
            UNVERIFIABLE,
            "record_amended",
            amendment,
        )
        assert not v.HasField("supersedes")
        assert not verifierd.store.verdict_history(ORIGIN, 1)
        assert verifierd.store.verdict(ORIGIN, 3) is None  # "second", received as its hash
        assert verifierd.store.counts().pending == 0
        assert prover_counts(verifierd) == {(UNVERIFIABLE, "record_amended"): 1}
    finally:
        verifierd.close()

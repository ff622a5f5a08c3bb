"""The metrics service: verdicts and backlog from a real store, served at /metrics."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from veritap.signing import Signer
from veritap.v1 import verifier_pb2

from tests.verifierd.commitment_fixtures import commit, make_model_dir
from verifierd.commitments import CommitmentRegistry
from verifierd.config import Config, MetricsConfig, ProversConfig
from verifierd.engine.pool import EngineStatus
from verifierd.metrics import VerifierMetrics
from verifierd.provers.store import ProverTables
from verifierd.services.metrics import MetricsService
from verifierd.store import Enqueue, Store, VerdictWrite

COMMITMENT = "cd" * 32


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store.open(tmp_path / "store")
    yield store
    store.close()


def verdict_write(seq: int, status: int, prefill_ns: int = 0) -> VerdictWrite:
    """A verdict; with `prefill_ns`, one recomputed in an engine batch (it has a batch size)."""
    verdict = verifier_pb2.Verdict(
        record_id=f"r{seq}",
        origin="edge",
        seq=seq,
        commitment_id=COMMITMENT,
        status=status,
        decided_at_ns=time.time_ns(),
        timings=verifier_pb2.VerdictTimings(
            prefill_ns=prefill_ns, scoring_ns=prefill_ns // 10, batch_size=2 if prefill_ns else 0
        ),
    )
    signed = verifier_pb2.SignedVerdict(verdict=verdict.SerializeToString())
    return VerdictWrite("edge", seq, f"r{seq}", signed, verdict)


async def test_verdicts_backlog_engines_and_commitments_are_exported(
    store: Store, tmp_path: Path
) -> None:
    metrics = VerifierMetrics()
    known = commit(make_model_dir(tmp_path / "model"), served_model_names=("tiny", "tiny-alias"))
    engines = [
        EngineStatus(COMMITMENT, verifier_pb2.ENGINE_STATE_READY, 1 << 30, (), 0, "pid 1"),
        EngineStatus("ef" * 32, verifier_pb2.ENGINE_STATE_LOADING, 1 << 30, (), 0, "pid 2"),
    ]
    context = SimpleNamespace(
        store=store,
        pool=SimpleNamespace(status=lambda: engines),
        registry=CommitmentRegistry.of([known]),
        provers=ProverTables(store, ProversConfig(), Signer.generate("verifier-test")),
    )
    service = MetricsService(context, metrics, listen="127.0.0.1:0")  # type: ignore[arg-type]
    await service.start()
    try:
        store.ingest("edge", [(seq, b"entry", bytes([seq]) * 32) for seq in range(1, 6)])
        store.classify(
            [
                verdict_write(1, verifier_pb2.VERDICT_STATUS_PASS, prefill_ns=200_000_000),
                verdict_write(2, verifier_pb2.VERDICT_STATUS_FAIL, prefill_ns=400_000_000),
                verdict_write(3, verifier_pb2.VERDICT_STATUS_SKIPPED),
                Enqueue("edge", 4, "r4", COMMITMENT),
                Enqueue("edge", 5, "r5", COMMITMENT),
            ]
        )
        store.ingest("edge", [(6, b"entry", bytes([6]) * 32)])  # no checkpoint covers it
        service.refresh()
        assert service.url is not None
        with urllib.request.urlopen(service.url, timeout=5) as response:
            text = response.read().decode()
    finally:
        await service.stop()

    def sample(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    p = "veritap_verifier_"
    assert sample(f"{p}verdicts_total", commitment=COMMITMENT, status="pass", reason="") == 1
    assert sample(f"{p}verdicts_total", commitment=COMMITMENT, status="fail", reason="") == 1
    assert sample(f"{p}verdicts_total", commitment=COMMITMENT, status="skipped", reason="") == 1
    assert sample(f"{p}prefill_seconds_count", commitment=COMMITMENT) == 2
    assert sample(f"{p}prefill_seconds_sum", commitment=COMMITMENT) == pytest.approx(0.6)
    assert sample(f"{p}backlog_records", commitment=COMMITMENT) == 2
    age = sample(f"{p}backlog_oldest_age_seconds", commitment=COMMITMENT)
    assert age is not None and 0 <= age < 60
    assert sample(f"{p}engines_loaded") == 1
    assert sample(f"{p}awaiting_checkpoint_entries") == 1
    info = {"commitment": known.commitment_id, "model": "tiny", "dtype": known.dtype}
    assert sample("veritap_commitment_info", **info, sampler="vllm-cpu-splitmix") == 1
    assert f'{p}verdicts_total{{commitment="{COMMITMENT}",reason="",status="pass"}} 1.0' in text

    # After stop, new verdicts are no longer counted by this service.
    store.ingest("edge", [(7, b"entry", bytes([7]) * 32)])
    store.classify([verdict_write(7, verifier_pb2.VERDICT_STATUS_PASS)])
    assert sample(f"{p}verdicts_total", commitment=COMMITMENT, status="pass", reason="") == 1


async def test_a_taken_port_keeps_the_metrics_unserved(store: Store) -> None:
    first = VerifierMetrics()
    context = SimpleNamespace(
        store=store, pool=SimpleNamespace(status=list), registry=CommitmentRegistry.of([])
    )
    holder = first.serve("127.0.0.1:0")
    try:
        address = holder.url.removeprefix("http://").removesuffix("/metrics")
        service = MetricsService(context, VerifierMetrics(), listen=address)  # type: ignore[arg-type]
        await service.start()
        assert service.url is None
        await service.stop()
    finally:
        holder.close()


async def test_the_address_comes_from_the_config_and_empty_serves_nothing(store: Store) -> None:
    def context(listen: str) -> SimpleNamespace:
        config = Config(metrics=MetricsConfig(listen=listen))
        return SimpleNamespace(
            store=store,
            pool=SimpleNamespace(status=list),
            config=config,
            registry=CommitmentRegistry.of([]),
        )

    off = MetricsService(context(""), VerifierMetrics())  # type: ignore[arg-type]
    await off.start()
    assert off.url is None
    await off.stop()
    on = MetricsService(context("127.0.0.1:0"), VerifierMetrics())  # type: ignore[arg-type]
    await on.start()
    try:
        assert on.url is not None and on.url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(on.url, timeout=5) as response:
            assert b"veritap_verifier_engines_loaded" in response.read()
    finally:
        await on.stop()

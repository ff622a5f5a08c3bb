"""A pipeline over a real store, the stand-in engine in a child process (engine_doubles)
and one tiny committed model, drained round by round, with its signed verdicts checked."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from veritap.signing import Signer

from tests.verifierd.commitment_fixtures import commit, make_model_dir
from tests.verifierd.engine_doubles import FACTORY
from tests.verifierd.record_fixtures import pinned
from verifierd.commitments import Commitment, CommitmentRegistry, DifrSettings, write_commitment
from verifierd.config import parse_config
from verifierd.engine.pool import EnginePool
from verifierd.metrics import VerifierMetrics
from verifierd.pipeline import Pipeline
from verifierd.store import Store, StoredVerdict
from verifierd.verdicts import check_signed_verdict
from verifierd.weights_cache import WeightsCache


@dataclass
class Rig:
    store: Store
    pool: EnginePool
    pipeline: Pipeline
    signer: Signer
    commitment: Commitment
    weights: WeightsCache
    metrics: VerifierMetrics

    def drain(self, rounds: int = 50) -> None:
        for _ in range(rounds):
            self.pipeline.classify_some()
            self.pipeline.score_some()
            counts = self.store.counts()
            if counts.inbox == 0 and counts.pending == 0:
                return
        raise AssertionError(f"work left after {rounds} rounds: {self.store.counts()}")

    def verdicts(self, origin: str) -> list[StoredVerdict]:
        out = []
        for seq in range(1, self.store.cursor(origin).seq + 1):
            stored = self.store.verdict(origin, seq)
            assert stored is not None, f"{origin}/{seq} has no verdict"
            assert check_signed_verdict(stored.signed, self.signer.verifier()) == stored.verdict
            out.append(stored)
        return out


def make_rig(tmp_path: Path, *, reverify: bool = False) -> Iterator[Rig]:
    """Yield a rig over ``tmp_path``; resumed, close its engines and store (a fixture's body)."""
    model = make_model_dir(tmp_path / "model")
    c = commit(
        model,
        generation_config="vllm",
        difr=DifrSettings(threshold=0.05, delta_max=5.0, sample_rate=1.0),
    )
    (tmp_path / "commitments").mkdir()
    write_commitment(c, tmp_path / "commitments" / "tiny.json")
    config = parse_config(
        {
            "engines": {"backend": FACTORY, "max_batch_requests": 4},
            "scheduler": {"backoff_initial_s": 0.0, "max_attempts": 2, "classify_batch": 5},
        },
        tmp_path,
    )
    weights = WeightsCache(config.weights_dir)
    weights.install(c, model)
    store = Store.open(config.store_dir)
    pool = EnginePool(config.engines)
    signer = Signer.generate("verifierd")
    metrics = VerifierMetrics()
    pipeline = Pipeline(
        config=config,
        store=store,
        registry=CommitmentRegistry.from_dir(config.commitments_dir),
        weights=weights,
        pool=pool,
        signer=signer,
        secret=b"s" * 32,
        reverify=reverify,
        metrics=metrics,
        collector_keys=pinned("edge", "edge-reject", "crash-edge"),
    )
    yield Rig(store, pool, pipeline, signer, c, weights, metrics)
    pool.close()
    store.close()

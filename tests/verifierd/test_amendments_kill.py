"""A verifierd killed while it supersedes a verdict counts the record once after its restart.

A record's current verdict is counted once everywhere it is counted: the store's counts by
status, its superseded verdicts (the history) and its prover's tallies. Superseding moves
the record out of its old status and reason in the transaction that writes the new
verdict, so a kill -9 can leave only the state before it or the state after it, and the
restarted verifierd redoes only what was not committed. Here a child process classifies
an amendment of a FAIL and kills itself with ``os._exit``: inside that transaction, after
every verdict hook has moved the counts (nothing committed: the amendment is classified
again after the restart), or right after its commit (nothing is replayed).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from veritap.signing import Signer, Verifier
from veritap.v1 import verifier_pb2

from tests.verifierd.amendment_records import amendment
from tests.verifierd.commitment_fixtures import commit, make_model_dir
from tests.verifierd.engine_doubles import FACTORY
from tests.verifierd.provers.prover_fixtures import counts
from tests.verifierd.record_fixtures import COLLECTOR, Exchange, ingest
from verifierd.commitments import CommitmentRegistry, DifrSettings, write_commitment
from verifierd.config import Config, parse_config
from verifierd.engine.pool import EnginePool
from verifierd.pipeline import Pipeline
from verifierd.provers.store import ProverTables
from verifierd.store import Store
from verifierd.verdicts import check_signed_verdict
from verifierd.weights_cache import WeightsCache

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]
ORIGIN = "edge"
KILLED = 9
PASS = verifier_pb2.VERDICT_STATUS_PASS
FAIL = verifier_pb2.VERDICT_STATUS_FAIL
UNVERIFIABLE = verifier_pb2.VERDICT_STATUS_UNVERIFIABLE

_KILLED_WHILE_SUPERSEDING = f"""
import os, sys
from pathlib import Path
from veritap.signing import Verifier
from tests.verifierd.test_amendments_kill import Verifierd

verifierd = Verifierd.open(Path(sys.argv[1]), Verifier.parse(sys.argv[2]))
if sys.argv[3] == "inside":
    # Added after the provers' hook: the counts have all moved, nothing is committed.
    verifierd.store.add_verdict_hook(
        lambda txn, stored: stored.previous is not None and os._exit({KILLED})
    )
else:
    verifierd.store.add_verdict_listener(
        lambda written: any(s.previous is not None for s in written) and os._exit({KILLED})
    )
verifierd.pipeline.classify_some()
sys.exit(0)
"""


@dataclass
class Verifierd:
    """verifierd's store, prover tables and pipeline over a state directory made by
    :func:`prepare` (its signing key kept there, as its key file would be)."""

    config: Config
    signer: Signer
    store: Store
    tables: ProverTables
    pool: EnginePool
    pipeline: Pipeline

    @classmethod
    def open(cls, root: Path, collector: Verifier) -> Verifierd:
        config = _config(root)
        signer = Signer.load(root / "verifierd.key")
        store = Store.open(config.store_dir)
        tables = ProverTables(store, config.provers, signer)
        pool = EnginePool(config.engines)
        pipeline = Pipeline(
            config=config,
            store=store,
            registry=CommitmentRegistry.from_dir(config.commitments_dir),
            weights=WeightsCache(config.weights_dir),
            pool=pool,
            signer=signer,
            secret=b"s" * 32,
            collector_keys={ORIGIN: collector},
        )
        return cls(config, signer, store, tables, pool, pipeline)

    def drain(self) -> None:
        for _ in range(20):
            self.pipeline.classify_some()
            self.pipeline.score_some()
            if self.store.counts().inbox == 0 and self.store.counts().pending == 0:
                return
        raise AssertionError(f"work left: {self.store.counts()}")

    def close(self) -> None:
        self.pool.close()
        self.store.close()

    def verdict(self, record_id: str) -> verifier_pb2.Verdict:
        (stored,) = self.store.verdicts_for_record(record_id)
        assert check_signed_verdict(stored.signed, self.signer.verifier()) == stored.verdict
        return stored.verdict

    def counted(self) -> Counted:
        (prover,) = self.tables.provers()
        store_counts = self.store.counts()
        return Counted(
            by_status=self.store.verdict_counts(),
            verdicts=store_counts.verdicts,
            superseded=store_counts.superseded,
            prover={w.window_s: counts(w) for w in prover.windows},
        )


@dataclass(frozen=True)
class Counted:
    """Every persisted count of verdicts: the store's current verdicts by status, its
    records with a verdict and its superseded verdicts, and the prover's verdicts by
    (status, reason) in each of its windows (0: since first seen)."""

    by_status: dict[str, int]
    verdicts: int
    superseded: int
    prover: dict[int, dict[tuple[int, str], int]]


def _config(root: Path) -> Config:
    return parse_config(
        {
            "engines": {"backend": FACTORY, "max_batch_requests": 4},
            "scheduler": {"backoff_initial_s": 0.0, "max_attempts": 2, "classify_batch": 5},
        },
        root,
    )


def prepare(root: Path) -> None:
    """A state directory with the tiny commitment installed and a signing key."""
    model = make_model_dir(root / "model")
    c = commit(
        model,
        generation_config="vllm",
        difr=DifrSettings(threshold=0.05, delta_max=5.0, sample_rate=1.0),
    )
    (root / "commitments").mkdir()
    write_commitment(c, root / "commitments" / "tiny.json")
    WeightsCache(_config(root).weights_dir).install(c, model)
    Signer.generate("verifierd").save(root / "verifierd.key")


def killed_while_superseding(root: Path, where: str) -> None:
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            _KILLED_WHILE_SUPERSEDING,
            str(root),
            COLLECTOR.verifier().key_string(),
            where,
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'protos'}"},
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert child.returncode == KILLED, child.stderr.decode()[-2000:]


@pytest.mark.parametrize("where", ["inside", "after"])
def test_a_kill_while_superseding_leaves_each_record_counted_once(
    tmp_path: Path, where: str
) -> None:
    prepare(tmp_path)
    verifierd = Verifierd.open(tmp_path, COLLECTOR.verifier())
    ingest(
        verifierd.store, ORIGIN, [Exchange("honest"), Exchange("cheat", outputs=((5, 1500, 7),))]
    )
    verifierd.drain()
    judged = verifierd.counted()
    assert judged.by_status == {"VERDICT_STATUS_PASS": 1, "VERDICT_STATUS_FAIL": 1}
    assert judged.prover[0] == {(PASS, ""): 1, (FAIL, "score_over_threshold"): 1}
    ingest(verifierd.store, ORIGIN, [amendment("amend-1", "cheat")])
    verifierd.close()

    killed_while_superseding(tmp_path, where)

    verifierd = Verifierd.open(tmp_path, COLLECTOR.verifier())
    try:
        if where == "inside":  # rolled back: as judged, the amendment still to classify
            assert verifierd.counted() == judged
            assert verifierd.store.counts().inbox == 1
            assert verifierd.verdict("cheat").status == FAIL
        verifierd.drain()
        amended = verifierd.verdict("cheat")
        assert (amended.status, amended.reason, amended.supersedes.status) == (
            UNVERIFIABLE,
            "record_amended",
            FAIL,
        )
        (superseded,) = verifierd.store.verdict_history(ORIGIN, amended.seq)
        assert superseded.verdict.status == FAIL
        once = verifierd.counted()
        # The amendment record's own verdict counts in the store, for no prover.
        assert once.by_status == {"VERDICT_STATUS_PASS": 1, "VERDICT_STATUS_UNVERIFIABLE": 2}
        assert (once.verdicts, once.superseded) == (3, 1)
        for window_s, by_reason in once.prover.items():
            assert by_reason == {(PASS, ""): 1, (UNVERIFIABLE, "record_amended"): 1}, window_s
        verifierd.close()

        verifierd = Verifierd.open(tmp_path, COLLECTOR.verifier())
        verifierd.drain()
        assert verifierd.counted() == once
    finally:
        verifierd.close()

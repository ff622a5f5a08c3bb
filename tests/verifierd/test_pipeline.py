"""From stored entries to signed verdicts: classification, batches, retries, weights.

The engine here is the stand-in backend in a real child process (engine_doubles);
tests/verifierd/test_daemon_kill.py runs the whole daemon, with the real engine too.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from veritap.v1 import record_pb2, verifier_pb2

from appliance.journal import MessageId
from tests.verifierd.pipeline_rig import Rig, make_rig
from tests.verifierd.record_fixtures import Exchange, ingest
from verifierd import pipeline as pipeline_module
from verifierd.commitments import Commitment
from verifierd.serving_flags import ServingFlags
from verifierd.weights_cache import VerifiedWeights

PASS = verifier_pb2.VERDICT_STATUS_PASS
FAIL = verifier_pb2.VERDICT_STATUS_FAIL
UNVERIFIABLE = verifier_pb2.VERDICT_STATUS_UNVERIFIABLE
SKIPPED = verifier_pb2.VERDICT_STATUS_SKIPPED


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    yield from make_rig(tmp_path)


def test_every_record_gets_exactly_one_signed_verdict(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    exchanges = [
        Exchange("honest"),
        Exchange("dishonest", outputs=((5, 1500, 7),)),
        Exchange("gap", quality=record_pb2.CAPTURE_QUALITY_RESPONSE_GAP),
        Exchange("unseeded", seed=None),
        Exchange("greedy-unseeded", seed=None, temperature=0.0),
        Exchange("other-model", model="unknown"),
        Exchange("http-error", status=500, outputs=()),
        Exchange("json-mode", extra_params={"response_format": {"type": "json_object"}}),
        Exchange(
            "structural-tag",
            extra_params={"response_format": {"type": "structural_tag", "format": {}}},
        ),
        Exchange("two-choices", outputs=((5, 6), (1200, 6))),
        Exchange("long-honest", outputs=(tuple(range(10, 200)),)),
    ]
    ingest(rig.store, "edge", exchanges)
    ingest(rig.store, "edge-reject", [Exchange("refused")])
    rig.drain()
    got = {
        v.verdict.record_id: v.verdict for v in rig.verdicts("edge") + rig.verdicts("edge-reject")
    }
    expected = {
        "honest": (PASS, ""),
        "dishonest": (FAIL, "score_over_threshold"),
        "gap": (UNVERIFIABLE, "capture_gap"),
        "unseeded": (UNVERIFIABLE, "no_seed"),
        "greedy-unseeded": (PASS, ""),
        "other-model": (UNVERIFIABLE, "unknown_commitment"),
        "http-error": (UNVERIFIABLE, "no_output"),
        "json-mode": (PASS, ""),
        "structural-tag": (UNVERIFIABLE, "sampler_not_reproducible"),
        "two-choices": (FAIL, "score_over_threshold"),
        "long-honest": (PASS, ""),
        "refused": (UNVERIFIABLE, "tokens_unavailable"),
    }
    assert {k: (v.status, v.reason) for k, v in got.items()} == expected
    # Sampled requests need a seed, whatever became of them; greedy ones and records
    # whose sampling was never worked out (or was refused) are not counted.
    sampled = {"honest", "dishonest", "unseeded", "json-mode", "two-choices", "long-honest"}
    assert {k for k, v in got.items() if v.needs_seed} == sampled | {"refused"}
    logged_fails = {
        r.__dict__["record_id"]
        for r in caplog.records
        if r.__dict__.get("message_id") == MessageId.FAIL_VERDICT
    }
    assert logged_fails == {"dishonest", "two-choices"}
    dishonest = got["dishonest"]
    assert dishonest.score == pytest.approx(1.0 / 3)
    assert (dishonest.token_count, dishonest.exact_matches, dishonest.attempts) == (3, 2, 1)
    assert dishonest.commitment_id == rig.commitment.commitment_id
    assert dishonest.engine_version == "fake 1.0"
    assert dishonest.settings.threshold == 0.05
    assert len(dishonest.margins_f16) == 6
    assert got["two-choices"].choice_index == 1
    assert got["gap"].detail.startswith("CAPTURE_QUALITY_RESPONSE_GAP")
    assert rig.store.counts().verdicts == len(expected)
    assert sum(rig.store.verdict_counts().values()) == len(expected)
    # Seven records went to the engine: the six scored (JSON mode's grammar is replayed)
    # and "refused", which it rejected.
    batched = rig.metrics.registry.get_sample_value(
        "veritap_verifier_batch_records_sum", {"commitment": rig.commitment.commitment_id}
    )
    assert batched == 7


def test_engine_failures_retry_then_give_up(rig: Rig) -> None:
    ingest(rig.store, "crash-edge", [Exchange("a"), Exchange("b")])
    rig.drain()
    for stored in rig.verdicts("crash-edge"):
        v = stored.verdict
        assert (v.status, v.reason, v.attempts) == (UNVERIFIABLE, "engine_error", 2)
        assert "died while scoring" in v.detail


def test_changed_weights_make_pending_records_unverifiable(rig: Rig) -> None:
    ingest(rig.store, "edge", [Exchange("a"), Exchange("b")])
    rig.pipeline.classify_some()
    assert rig.store.counts().pending == 2
    shard = rig.weights.path_for(rig.commitment) / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:-1] + b"\x00")
    rig.drain()
    reasons = {(v.verdict.status, v.verdict.reason) for v in rig.verdicts("edge")}
    assert reasons == {(UNVERIFIABLE, "weights_mismatch")}
    assert rig.pool.status() == []


def test_sample_rate_override_skips(rig: Rig) -> None:
    settings = verifier_pb2.DifrSettings(threshold=0.05, delta_max=5, sample_rate=0.0)
    rig.store.set_difr_override(rig.commitment.commitment_id, settings, actor="test")
    ingest(rig.store, "edge", [Exchange(f"r{i}") for i in range(12)])
    rig.drain()
    verdicts = rig.verdicts("edge")
    assert {(v.verdict.status, v.verdict.reason) for v in verdicts} == {(SKIPPED, "not_sampled")}
    assert rig.pool.status() == []


def test_a_failure_on_one_record_closes_it_and_goes_on(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = pipeline_module.choice_evidence

    def flaky(record: record_pb2.InferenceRecord, serving: ServingFlags) -> object:
        if record.record_id == "poison":
            raise RuntimeError("bug")
        return real(record, serving)

    monkeypatch.setattr(pipeline_module, "choice_evidence", flaky)
    ingest(rig.store, "edge", [Exchange("poison"), Exchange("fine")])
    rig.drain()
    poison, fine = (v.verdict for v in rig.verdicts("edge"))
    assert (poison.status, poison.reason, poison.detail) == (
        UNVERIFIABLE,
        "internal_error",
        "RuntimeError: bug",
    )
    assert fine.status == PASS


def test_reverify_hashes_everything_at_the_first_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rigs = make_rig(tmp_path, reverify=True)
    rig = next(rigs)
    hashed: list[int] = []
    verify = rig.weights.verify

    def counting(commitment: Commitment, *, reverify: bool = False) -> VerifiedWeights:
        checked = verify(commitment, reverify=reverify)
        hashed.append(checked.files_hashed)
        return checked

    monkeypatch.setattr(rig.weights, "verify", counting)
    ingest(rig.store, "edge", [Exchange("a")])
    rig.drain()
    ingest(rig.store, "edge", [Exchange("b")])
    rig.drain()
    assert hashed == [len(rig.commitment.files)]
    next(rigs, None)

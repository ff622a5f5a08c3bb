"""The collector's amendment records through the pipeline and the store.

An amendment names records whose bytes later arrived in another version: each gets an
UNVERIFIABLE(record_amended) verdict, superseding a verdict it had (kept in the history),
whatever the order in which the record and its amendment are judged, across restarts.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from veritap.v1 import record_pb2, verifier_pb2

from tests.verifierd.amendment_records import ORIGIN, amendment
from tests.verifierd.engine_doubles import FACTORY
from tests.verifierd.pipeline_rig import Rig, make_rig
from tests.verifierd.record_fixtures import Exchange, ingest, pinned
from verifierd.commitments import CommitmentRegistry
from verifierd.config import parse_config
from verifierd.pipeline import Pipeline
from verifierd.store import AmendmentNote, AmendmentWrite, Store, Supersede, VerdictWrite
from verifierd.verdicts import check_signed_verdict, sign_verdict

PASS = verifier_pb2.VERDICT_STATUS_PASS
FAIL = verifier_pb2.VERDICT_STATUS_FAIL
UNVERIFIABLE = verifier_pb2.VERDICT_STATUS_UNVERIFIABLE


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    yield from make_rig(tmp_path)


def restarted(rig: Rig, tmp_path: Path) -> Rig:
    """The rig's state directory under a new store and pipeline (a restarted verifierd)."""
    rig.store.close()
    config = parse_config(
        {
            "engines": {"backend": FACTORY, "max_batch_requests": 4},
            "scheduler": {"backoff_initial_s": 0.0, "max_attempts": 2, "classify_batch": 5},
        },
        tmp_path,
    )
    store = Store.open(config.store_dir)
    pipeline = Pipeline(
        config=config,
        store=store,
        registry=CommitmentRegistry.from_dir(config.commitments_dir),
        weights=rig.weights,
        pool=rig.pool,
        signer=rig.signer,
        secret=b"s" * 32,
        metrics=rig.metrics,
        collector_keys=pinned(ORIGIN),
    )
    return replace(rig, store=store, pipeline=pipeline)


def verdict_of(rig: Rig, record_id: str) -> verifier_pb2.Verdict:
    (stored,) = rig.store.verdicts_for_record(record_id)
    assert check_signed_verdict(stored.signed, rig.signer.verifier()) == stored.verdict
    return stored.verdict


def test_an_amendment_supersedes_the_verdicts_of_the_records_it_names(rig: Rig) -> None:
    ingest(rig.store, ORIGIN, [Exchange("honest"), Exchange("cheat", outputs=((5, 1500, 7),))])
    rig.drain()
    before = {s.verdict.record_id: s for s in rig.verdicts(ORIGIN)}
    assert (before["honest"].verdict.status, before["cheat"].verdict.status) == (PASS, FAIL)

    ingest(rig.store, ORIGIN, [amendment("amend-1", "honest", "cheat"), Exchange("later")])
    rig.drain()
    for record_id in ("honest", "cheat"):
        old = before[record_id]
        now = verdict_of(rig, record_id)
        assert (now.status, now.reason) == (UNVERIFIABLE, "record_amended")
        assert now.amended_by_record_id == "amend-1"
        assert (now.origin, now.seq, now.entry_hash) == (
            old.origin,
            old.seq,
            old.verdict.entry_hash,
        )
        assert now.supersedes.status == old.verdict.status
        assert now.supersedes.reason == old.verdict.reason
        assert now.supersedes.decided_at_ns == old.verdict.decided_at_ns
        digest = hashlib.sha256(old.signed.SerializeToString(deterministic=True)).digest()
        assert now.supersedes.signed_sha256 == digest
        assert not now.margins_f16 and now.token_count == 0
        assert "amendment amend-1: late ambiguity" in now.detail
        assert "supersedes" in now.detail
        (kept,) = rig.store.verdict_history(old.origin, old.seq)
        assert kept.signed == old.signed
    assert "supersedes PASS" in verdict_of(rig, "honest").detail
    assert "supersedes FAIL (score_over_threshold)" in verdict_of(rig, "cheat").detail
    own = verdict_of(rig, "amend-1")
    assert (own.status, own.reason) == (UNVERIFIABLE, "amendment")
    assert own.detail.startswith("late ambiguity")
    assert (verdict_of(rig, "later").status, verdict_of(rig, "later").amended_by_record_id) == (
        PASS,
        "",
    )
    # One verdict per record, wherever they are listed and counted.
    listed, _ = rig.store.list_verdicts(limit=100)
    assert sorted(s.verdict.record_id for s in listed) == ["amend-1", "cheat", "honest", "later"]
    assert rig.store.counts().verdicts == 4
    assert rig.store.verdict_counts() == {
        "VERDICT_STATUS_PASS": 1,
        "VERDICT_STATUS_UNVERIFIABLE": 3,
    }

    # A second amendment of the same record leaves its record_amended verdict as it is.
    first = rig.store.verdicts_for_record("honest")[0].signed
    ingest(rig.store, ORIGIN, [amendment("amend-2", "honest")])
    rig.drain()
    assert rig.store.verdicts_for_record("honest")[0].signed == first
    assert len(rig.store.verdict_history(ORIGIN, before["honest"].seq)) == 1


def test_a_record_amended_before_its_verdict_is_judged_amended_after_a_restart(
    rig: Rig, tmp_path: Path
) -> None:
    # "queued" waits for the engine when its amendment is classified; "together" comes
    # in the amendment's own batch; "unseen" is named before the verifier has it.
    ingest(rig.store, ORIGIN, [Exchange("queued")])
    assert rig.pipeline.classify_some() == 1
    ingest(
        rig.store,
        ORIGIN,
        [Exchange("together"), amendment("amend-1", "queued", "together", "unseen")],
    )
    assert rig.pipeline.classify_some() == 2
    assert rig.store.counts().pending == 1
    rig = restarted(rig, tmp_path)
    ingest(rig.store, ORIGIN, [Exchange("unseen"), Exchange("other")])
    rig.drain()
    for record_id in ("queued", "together", "unseen"):
        v = verdict_of(rig, record_id)
        assert (v.status, v.reason, v.amended_by_record_id) == (
            UNVERIFIABLE,
            "record_amended",
            "amend-1",
        )
        assert not v.HasField("supersedes")
        assert not rig.store.verdict_history(v.origin, v.seq)
    assert verdict_of(rig, "other").status == PASS
    # Only "other" went to the engine.
    batched = rig.metrics.registry.get_sample_value(
        "veritap_verifier_batch_records_sum", {"commitment": rig.commitment.commitment_id}
    )
    assert batched == 1
    rig.store.close()


def test_each_batch_reads_its_records_amendments_once(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[list[tuple[str, str]]] = []
    read = rig.store.amendments_of

    def counted(records: Iterable[tuple[str, str]]) -> dict[tuple[str, str], AmendmentNote]:
        asked.append(list(records))
        return read(asked[-1])

    monkeypatch.setattr(rig.store, "amendments_of", counted)
    gap = record_pb2.CAPTURE_QUALITY_RESPONSE_GAP
    ingest(
        rig.store, ORIGIN, [Exchange("scored"), Exchange("gap", quality=gap), Exchange("queued")]
    )
    assert rig.pipeline.classify_some() == 3
    ingest(rig.store, ORIGIN, [amendment("amend-1", "queued"), Exchange("later")])
    assert rig.pipeline.classify_some() == 2
    assert rig.pipeline.score_some() == 3
    key = {record_id: (ORIGIN, record_id) for record_id in ("scored", "gap", "queued", "later")}
    assert asked == [
        [key["scored"], key["gap"], key["queued"]],
        [(ORIGIN, "amend-1"), key["later"]],
        [key["scored"], key["queued"], key["later"]],
    ]
    said = {r: (verdict_of(rig, r).status, verdict_of(rig, r).reason) for r in key}
    assert said == {
        "scored": (PASS, ""),
        "gap": (UNVERIFIABLE, "capture_gap"),
        "queued": (UNVERIFIABLE, "record_amended"),
        "later": (PASS, ""),
    }


def test_a_superseding_verdict_built_from_a_verdict_no_longer_current_is_refused(
    rig: Rig,
) -> None:
    ingest(rig.store, ORIGIN, [Exchange("honest")])
    rig.drain()
    (passed,) = rig.store.verdicts_for_record("honest")
    ingest(rig.store, ORIGIN, [amendment("amend-1", "honest")])
    rig.drain()
    (current,) = rig.store.verdicts_for_record("honest")
    ingest(rig.store, ORIGIN, [amendment("amend-2", "honest")])
    (entry,) = rig.store.inbox(10)
    stale = AmendmentWrite(
        verdict=signed_write(rig, entry.seq, "amend-2", "amendment"),
        amends_record_ids=("honest",),
        reason="late ambiguity",
        superseding=(Supersede(passed, signed_write(rig, passed.seq, "honest", "record_amended")),),
    )
    rig.store.classify([stale])
    assert rig.store.verdicts_for_record("honest") == [current]
    assert [s.signed for s in rig.store.verdict_history(ORIGIN, passed.seq)] == [passed.signed]
    assert rig.store.verdicts_for_record("amend-2")[0].verdict.reason == "amendment"


def signed_write(rig: Rig, seq: int, record_id: str, reason: str) -> VerdictWrite:
    v = verifier_pb2.Verdict(
        record_id=record_id,
        origin=ORIGIN,
        seq=seq,
        status=UNVERIFIABLE,
        reason=reason,
        decided_at_ns=time.time_ns(),
    )
    return VerdictWrite(ORIGIN, seq, record_id, sign_verdict(v, rig.signer), v)

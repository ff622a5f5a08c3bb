"""The console's line for the verdict a record_amended verdict superseded."""

from __future__ import annotations

from veritap.v1 import verifier_pb2

from tui import formats


def test_the_superseded_verdict_is_named_with_its_score_time_and_signed_hash() -> None:
    verdict = verifier_pb2.Verdict(
        reason="record_amended",
        supersedes=verifier_pb2.SupersededVerdict(
            status=verifier_pb2.VERDICT_STATUS_FAIL,
            reason="score_over_threshold",
            score=0.25,
            decided_at_ns=1_740_819_600_000_000_000,
            signed_sha256=bytes(range(32)),
        ),
    )
    assert formats.superseded_line(verdict) == (
        "FAIL (score_over_threshold) 0.250, decided 03-01 09:00:00 UTC, signed verdict sha256 "
        "0001020304050607"
    )
    verdict.supersedes.status = verifier_pb2.VERDICT_STATUS_UNVERIFIABLE
    verdict.supersedes.reason = "no_seed"
    assert formats.superseded_line(verdict).startswith("UNVERIFIABLE (no_seed), decided")

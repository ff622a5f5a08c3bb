"""The demo's judgement of the verdicts it reads back from verifierd (no daemons)."""

from __future__ import annotations

from dataclasses import replace

from verifierd.commitments import DifrSettings
from verifierd.demo.verdicts import (
    Calibration,
    DemoResult,
    VerdictRow,
    check_outcome,
    describe_margins,
    margins,
)

COMMITTED = DifrSettings(threshold=0.05, delta_max=10.0, sample_rate=1.0)
CALIBRATED = DifrSettings(threshold=1e-5, delta_max=1.0, sample_rate=1.0)


def _row(
    seq: int, prover: str, status: str, score: float, threshold: float, *, changed: int = 0
) -> VerdictRow:
    return VerdictRow(
        record_id=f"r{seq}",
        seq=seq,
        prover=prover,
        tokens=48,
        changed=changed,
        score=score,
        status=status,
        reason="",
        threshold=threshold,
    )


def _result(rows: tuple[VerdictRow, ...], in_force: DifrSettings = CALIBRATED) -> DemoResult:
    return DemoResult(
        calibration=Calibration(report="", last_seq=2, committed=COMMITTED, in_force=in_force),
        calibration_rows=(
            _row(1, "honest", "PASS", 0.0, COMMITTED.threshold),
            _row(2, "honest", "PASS", 0.0, COMMITTED.threshold),
        ),
        rows=rows,
    )


GOOD = (
    _row(3, "honest", "PASS", 0.0, CALIBRATED.threshold),
    _row(4, "dishonest", "FAIL", 0.02, CALIBRATED.threshold, changed=3),
    replace(
        _row(5, "dishonest", "UNVERIFIABLE", 0.0, CALIBRATED.threshold), reason="no_seed", tokens=0
    ),
)


def test_a_right_run_has_no_problems() -> None:
    assert check_outcome(_result(GOOD)) == []


def test_a_dishonest_pass_and_an_honest_fail_are_problems() -> None:
    rows = (
        _row(3, "honest", "FAIL", 0.1, CALIBRATED.threshold),
        _row(4, "dishonest", "PASS", 0.0, CALIBRATED.threshold),
    )
    assert check_outcome(_result(rows)) == [
        "r3 from the honest prover: FAIL",
        "r4 from the dishonest prover: PASS",
    ]


def test_calibration_that_did_not_take_effect_is_a_problem() -> None:
    stale = tuple(replace(r, threshold=COMMITTED.threshold) for r in GOOD)
    assert check_outcome(_result(stale, in_force=COMMITTED)) == [
        "verifierd still runs with the committed settings: calibration not applied"
    ]


def test_a_verdict_decided_with_other_settings_is_a_problem() -> None:
    rows = (*GOOD, _row(6, "dishonest", "FAIL", 0.3, COMMITTED.threshold))
    assert check_outcome(_result(rows)) == [
        "r6 was judged with threshold 0.05, not the calibrated 1e-05"
    ]


def test_margins_are_the_closest_scores_on_each_side() -> None:
    rows = (*GOOD, _row(6, "dishonest", "FAIL", 0.3, CALIBRATED.threshold, changed=2))
    m = margins(rows, CALIBRATED.threshold)
    assert (m.max_honest, m.min_dishonest) == (0.0, 0.02)
    # The unseeded dishonest request (no tokens scored) does not count as unchanged.
    assert (m.fewest_changed, m.fewest_changed_of) == (2, 48)
    assert describe_margins(m) == (
        "closest dishonest score 0.02 = 2e+03x the threshold 1e-05\n"
        "fewest changed tokens in a dishonest response: 2 of 48\n"
        "largest honest score 0 (threshold 1e-05)"
    )

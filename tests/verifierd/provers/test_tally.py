"""Tally: the seed-needing count and its share, stored and withdrawn."""

from __future__ import annotations

import json

import pytest
from veritap.v1 import verifier_pb2

from verifierd.provers.tally import Tally

UNVERIFIABLE = verifier_pb2.VERDICT_STATUS_UNVERIFIABLE
PASS = verifier_pb2.VERDICT_STATUS_PASS


def verdict(status: int, reason: str = "", *, needs_seed: bool) -> Tally:
    v = verifier_pb2.Verdict(status=status, reason=reason, needs_seed=needs_seed)  # type: ignore[arg-type]
    return Tally.of_verdict(v)


def test_greedy_verdicts_are_not_in_the_unseeded_share() -> None:
    tally = Tally.total(
        [
            verdict(PASS, needs_seed=False),
            verdict(PASS, needs_seed=True),
            verdict(UNVERIFIABLE, "no_seed", needs_seed=True),
            verdict(UNVERIFIABLE, "capture_gap", needs_seed=False),
        ]
    )
    assert (tally.verdicts, tally.needs_seed) == (4, 2)
    assert tally.unseeded_share() == pytest.approx(0.5)
    window = tally.to_window(60)
    assert (window.needs_seed_verdicts, window.unseeded_share) == (2, pytest.approx(0.5))
    assert Tally.from_json(tally.to_json()) == tally
    assert Tally().unseeded_share() == 0.0


def test_a_withdrawn_verdict_takes_its_seed_need_with_it() -> None:
    seeded = verdict(PASS, needs_seed=True)
    tally = seeded + verdict(UNVERIFIABLE, "no_seed", needs_seed=True)
    left = tally.without(seeded)
    assert left is not None and (left.needs_seed, left.unseeded_share()) == (1, 1.0)
    assert verdict(PASS, needs_seed=False).without(seeded) is None


def test_a_tally_stored_before_the_count_reads_as_none_needed() -> None:
    old = json.dumps({"c": [[UNVERIFIABLE, "no_seed", 3]], "t": 0, "m": 0.0, "x": 0}).encode()
    tally = Tally.from_json(old)
    assert tally.needs_seed == 0 and tally.unseeded_share() == 0.0
    # Added to newer verdicts, the share stays a share.
    assert (tally + verdict(UNVERIFIABLE, "no_seed", needs_seed=True)).unseeded_share() == 1.0

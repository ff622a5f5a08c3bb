"""Honest tails are stored with an audit event, and read back as they were measured."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from verifierd.provers.honest_tails import decode_tails, encode_tails, store_honest_tails
from verifierd.provers.sequential import HonestTails, SequentialTest, SequentialTestError, Unit
from verifierd.store import Store


def test_tails_round_trip_and_are_audited(tmp_path: Path) -> None:
    margins = [np.array([0.0, 0.0, 3e-3, np.inf]), np.array([0.0, 2e-5])]
    tails = HonestTails.from_margins(margins, 5.0)
    assert decode_tails(encode_tails(tails)) == tails
    store = Store.open(tmp_path / "store")
    try:
        store_honest_tails(store, "ab" * 32, tails, actor="verifierd calibrate")
        with store.read_transaction() as txn:
            raw = txn.get(("ab" * 32).encode(), db=store.open_db("honest_tails"))
        assert raw is not None and decode_tails(bytes(raw)) == tails
        [event] = store.audit_log()
        assert (event.actor, event.action) == ("verifierd calibrate", "set_honest_tails")
        detail = json.loads(event.detail)
        assert detail["exceedances"] == list(tails.exceedances) and detail["tokens"] == 6
        assert detail["clusters"] == list(tails.clusters or ())
    finally:
        store.close()


def previous_format(clustered: int) -> bytes:
    """Tails as the previous format (2) stored them: clusters at the lowest level only."""
    return json.dumps(
        {
            "format": 2,
            "delta_max": 5.0,
            "tokens": 2000,
            "levels": [0.0, 0.1],
            "exceedances": [9, 2],
            "responses": 20,
            "response_exceedances": [4, 2],
            "clustered": clustered,
        }
    ).encode()


def test_tails_of_the_previous_format_keep_their_test() -> None:
    """Without a cluster at the lowest level there is none at any: every level per
    token, as before; with one, the levels' clusters are unknown and every level stays
    per response."""
    unclustered = decode_tails(previous_format(0))
    assert unclustered.clusters == (0, 0)
    assert SequentialTest.from_honest(unclustered).units == (Unit.TOKEN, Unit.TOKEN)
    clustered = decode_tails(previous_format(3))
    assert clustered.clusters is None
    test = SequentialTest.from_honest(clustered)
    assert test.units == (Unit.RESPONSE, Unit.RESPONSE)
    assert (test.calibration_units, test.calibration_counts) == ((20, 20), (4, 2))
    assert decode_tails(encode_tails(clustered)) == clustered


def test_tails_of_the_former_format_ask_for_a_new_calibration() -> None:
    """Tails stored before the per-response counts existed hold no unit to test in."""
    former = {"delta_max": 5.0, "tokens": 6, "levels": [0.0], "exceedances": [1]}
    with pytest.raises(SequentialTestError, match="calibrate --apply"):
        decode_tails(json.dumps(former).encode())

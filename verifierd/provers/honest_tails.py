"""Each commitment's honest tails: what calibration measured of its honest margins.

They are the null hypothesis of the sequential test of every prover serving the
commitment (verifierd.provers.sequential). `verifierd calibrate --apply` stores them
beside the settings it applies, audited; a prover's test starts from the tails stored
when it starts (at first sight, or after an admin cleared its alarm). Without tails no
test runs: nothing accuses a prover before calibration says what honest looks like.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import lmdb

from verifierd.provers.sequential import HonestTails, SequentialTestError
from verifierd.store import Store

#: The named database: commitment id (hex) -> HonestTails JSON.
DB_NAME = "honest_tails"
#: Version of the JSON form: the first had no per-response counts, the second counted
#: clusters at the lowest level only.
TAILS_FORMAT = 3


def encode_tails(tails: HonestTails) -> bytes:
    return json.dumps({"format": TAILS_FORMAT, **asdict(tails)}, sort_keys=True).encode()


def decode_tails(raw: bytes) -> HonestTails:
    """The stored tails. Tails of the second format keep the test they had: with no
    cluster at the lowest level there is none at any (every level per token), with one
    the clusters per level are unknown (every level per response, `HonestTails.clusters`
    None); tails stored before the per-response counts existed are an error that says
    to calibrate again (no test runs on them)."""
    data = json.loads(raw)
    form = data.get("format")
    if form not in (2, TAILS_FORMAT):
        raise SequentialTestError(
            "honest tails of an earlier format (no per-response counts): run "
            "`verifierd calibrate --apply` again"
        )
    levels = tuple(float(c) for c in data["levels"])
    if form == 2:
        clusters = None if int(data["clustered"]) else (0,) * len(levels)
    else:
        clusters = None if data["clusters"] is None else tuple(int(n) for n in data["clusters"])
    return HonestTails(
        delta_max=float(data["delta_max"]),
        tokens=int(data["tokens"]),
        levels=levels,
        exceedances=tuple(int(n) for n in data["exceedances"]),
        responses=int(data["responses"]),
        response_exceedances=tuple(int(n) for n in data["response_exceedances"]),
        clusters=clusters,
    )


def store_honest_tails(
    store: Store, commitment_id: str, tails: HonestTails, *, actor: str, db: Any = None
) -> None:
    """Store a commitment's tails and the audit event in one transaction (``db``: the
    database handle when the caller opened it already)."""
    handle = store.open_db(DB_NAME) if db is None else db
    raw = encode_tails(tails)

    def body(txn: lmdb.Transaction) -> None:
        txn.put(commitment_id.encode(), raw, db=handle)
        store.audit_in(
            txn,
            actor,
            "set_honest_tails",
            {
                "commitment_id": commitment_id,
                "tokens": tails.tokens,
                "delta_max": tails.delta_max,
                "levels": list(tails.levels),
                "exceedances": list(tails.exceedances),
                "responses": tails.responses,
                "response_exceedances": list(tails.response_exceedances),
                "clusters": None if tails.clusters is None else list(tails.clusters),
            },
        )

    store.write_transaction(body)

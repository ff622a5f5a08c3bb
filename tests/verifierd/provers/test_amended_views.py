"""A superseded verdict in what verifierd reports: a record has one current verdict.

GetStats counts each record's current verdict (the superseded one no more), the verdicts
superseded, and records judged per second; /metrics counts the superseded verdict out of
the current ones; a WatchVerdicts watcher that was sent a verdict is sent the one that
supersedes it, whatever that one's status, and `verifierd verdicts watch` prints what it
supersedes.
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest
from veritap.v1 import verifier_pb2

from tests.verifierd.provers.conftest import Provers, Served
from tests.verifierd.provers.prover_fixtures import CID, HONEST, amend, dishonest, honest
from verifierd.commands.verdicts import json_line
from verifierd.commitments import CommitmentRegistry
from verifierd.metrics import VerifierMetrics, status_label
from verifierd.services.metrics import MetricsService

PASS = verifier_pb2.VERDICT_STATUS_PASS
FAIL = verifier_pb2.VERDICT_STATUS_FAIL
UNVERIFIABLE = verifier_pb2.VERDICT_STATUS_UNVERIFIABLE
#: How long a watcher waits for a verdict before the test fails (it hangs no longer).
READ_BOUND_S = 30


async def next_verdict(call: Any) -> verifier_pb2.Verdict:
    response = await asyncio.wait_for(call.read(), READ_BOUND_S)
    assert isinstance(response, verifier_pb2.WatchVerdictsResponse), response
    return response.verdict


async def test_stats_count_each_records_current_verdict(served: Served) -> None:
    ids = await asyncio.to_thread(served.traffic.send, HONEST, [honest(), dishonest(), honest()])
    stub = served.stub()
    before = await stub.GetStats(verifier_pb2.GetStatsRequest())
    assert dict(before.verdicts_by_status) == {"VERDICT_STATUS_PASS": 2, "VERDICT_STATUS_FAIL": 1}
    assert before.verdicts_superseded == 0

    await asyncio.to_thread(amend, served.store, served.signer, HONEST, ids[1], served.clock.now)
    after = await stub.GetStats(verifier_pb2.GetStatsRequest())
    # The amended record and the amendment record itself.
    assert dict(after.verdicts_by_status) == {
        "VERDICT_STATUS_PASS": 2,
        "VERDICT_STATUS_UNVERIFIABLE": 2,
    }
    assert after.verdicts_superseded == 1
    # Four records judged in the last minute, five verdicts signed.
    assert after.verdicts_per_second == pytest.approx(4 / 60)


async def test_a_watcher_is_sent_the_verdict_that_withdraws_one_it_was_sent(
    served: Served,
) -> None:
    stub = served.stub()
    watches = {
        status: stub.WatchVerdicts(verifier_pb2.WatchVerdictsRequest(statuses=[status]))
        for status in (FAIL, PASS, UNVERIFIABLE)
    }
    everything = stub.WatchVerdicts(verifier_pb2.WatchVerdictsRequest(commitment_id=CID))
    for call in (*watches.values(), everything):
        await call.initial_metadata()
    ids = await asyncio.to_thread(served.traffic.send, HONEST, [dishonest(), honest()])
    failed = await next_verdict(watches[FAIL])
    assert (failed.record_id, failed.status) == (ids[0], FAIL)

    await asyncio.to_thread(amend, served.store, served.signer, HONEST, ids[0], served.clock.now)
    later = await asyncio.to_thread(served.traffic.send, HONEST, [honest()])
    withdrawn = await next_verdict(watches[FAIL])
    assert (withdrawn.origin, withdrawn.seq, withdrawn.record_id) == (
        failed.origin,
        failed.seq,
        failed.record_id,
    )
    assert (withdrawn.status, withdrawn.reason) == (UNVERIFIABLE, "record_amended")
    assert withdrawn.supersedes.status == FAIL
    assert withdrawn.supersedes.decided_at_ns == failed.decided_at_ns
    # `verifierd verdicts watch` prints it saying what it supersedes.
    line = json.loads(json_line(withdrawn))
    assert (line["record_id"], line["supersedes"]["status"]) == (ids[0], "VERDICT_STATUS_FAIL")
    assert "supersedes FAIL (score_over_threshold)" in line["detail"]
    # A watcher that was never sent the FAIL verdict is not sent its withdrawal either.
    passed = [(await next_verdict(watches[PASS])).record_id for _ in range(2)]
    assert passed == [ids[1], later[0]]
    amended = [await next_verdict(watches[UNVERIFIABLE]) for _ in range(2)]
    assert [(v.record_id, v.reason) for v in amended] == [
        (f"amend-{ids[0]}", "amendment"),
        (ids[0], "record_amended"),
    ]
    streamed = [(await next_verdict(everything)).record_id for _ in range(4)]
    assert streamed == [ids[0], ids[1], ids[0], later[0]]
    for call in (*watches.values(), everything):
        call.cancel()


async def test_metrics_count_a_superseded_verdict_out_of_the_current_ones(
    provers: Provers,
) -> None:
    metrics = VerifierMetrics()
    context = SimpleNamespace(
        store=provers.store,
        pool=SimpleNamespace(status=list),
        registry=CommitmentRegistry.of([]),
        provers=provers.tables,
    )
    service = MetricsService(context, metrics, listen="")  # type: ignore[arg-type]
    await service.start()
    try:
        ids = provers.traffic.send(HONEST, [dishonest(), honest()])
        amend(provers.store, provers.signer, HONEST, ids[0], provers.clock.now)
    finally:
        await service.stop()

    def sample(name: str, status: int, reason: str, commitment: str = CID) -> float:
        labels = {"commitment": commitment, "status": status_label(status), "reason": reason}
        found = metrics.registry.get_sample_value(f"veritap_verifier_{name}_total", labels)
        return 0.0 if found is None else found

    assert sample("verdicts", FAIL, "score_over_threshold") == 1
    assert sample("verdicts_superseded", FAIL, "score_over_threshold") == 1
    assert sample("verdicts", UNVERIFIABLE, "record_amended") == 1
    assert sample("verdicts_superseded", UNVERIFIABLE, "record_amended") == 0
    assert sample("verdicts", UNVERIFIABLE, "amendment", commitment="") == 1
    # Signed minus superseded: each record's current verdict, as the store counts them.
    current: dict[str, float] = {}
    for family in metrics.registry.collect():
        for s in family.samples:
            if s.name == "veritap_verifier_verdicts_total":
                key = "VERDICT_STATUS_" + s.labels["status"].upper()
                current[key] = current.get(key, 0.0) + s.value
            elif s.name == "veritap_verifier_verdicts_superseded_total":
                key = "VERDICT_STATUS_" + s.labels["status"].upper()
                current[key] -= s.value
    assert {k: v for k, v in current.items() if v} == provers.store.verdict_counts()

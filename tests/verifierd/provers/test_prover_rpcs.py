"""ListProvers, GetProver, WatchAlarms and ClearAlarm over a real gRPC server with mTLS."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from veritap.v1 import verifier_pb2

from tests.service_pki import ADMIN_SUBJECT
from tests.verifierd.provers.conftest import Served
from tests.verifierd.provers.prover_fixtures import CHEAT, HONEST, Outcome, dishonest, honest
from verifierd.provers.alarms import check_signed_alarm
from verifierd.provers.identity import ProverKey


async def send(served: Served, prover: ProverKey, outcomes: list[Outcome]) -> list[str]:
    return await asyncio.to_thread(served.traffic.send, prover, outcomes)


async def test_list_and_get_provers(served: Served) -> None:
    await send(served, HONEST, [honest(100) for _ in range(5)])
    await send(served, CHEAT, [dishonest(50) for _ in range(10)])
    stub = served.stub()
    listed = await stub.ListProvers(verifier_pb2.ListProversRequest())
    assert {ProverKey.of_proto(p.id) for p in listed.provers} == {HONEST, CHEAT}
    alarmed = await stub.ListProvers(verifier_pb2.ListProversRequest(alarmed_only=True))
    assert [ProverKey.of_proto(p.id) for p in alarmed.provers] == [CHEAT]
    got = await stub.GetProver(verifier_pb2.GetProverRequest(id=CHEAT.to_proto()))
    assert got.prover.alarms[0].alarm.kind == verifier_pb2.ALARM_KIND_DISHONEST
    assert [w.window_s for w in got.prover.windows] == [3600, 86400, 0]
    assert len(got.evidence_history) == 10 and len(got.alarms) == 1
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await stub.GetProver(verifier_pb2.GetProverRequest(id=ProverKey("x", "", 1).to_proto()))
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND


async def test_watch_alarms_lists_those_in_force_then_streams_raised_and_cleared(
    served: Served,
) -> None:
    await send(served, CHEAT, [dishonest(50) for _ in range(10)])
    stream = served.stub().WatchAlarms(verifier_pb2.WatchAlarmsRequest())
    first = await stream.read()
    assert isinstance(first, verifier_pb2.WatchAlarmsResponse)
    assert ProverKey.of_proto(first.alarm.alarm.prover) == CHEAT
    other = ProverKey("edge", "10.0.0.9", 9000)
    await send(served, other, [dishonest(50) for _ in range(10)])
    raised = await stream.read()
    assert isinstance(raised, verifier_pb2.WatchAlarmsResponse)
    assert ProverKey.of_proto(raised.alarm.alarm.prover) == other
    check_signed_alarm(raised.alarm.signed, served.signer.verifier())
    request = verifier_pb2.ClearAlarmRequest(alarm_id=first.alarm.alarm.alarm_id, reason="ok")
    await served.admin().ClearAlarm(request)
    cleared = await stream.read()
    assert isinstance(cleared, verifier_pb2.WatchAlarmsResponse)
    assert cleared.alarm.alarm.alarm_id == first.alarm.alarm.alarm_id
    assert cleared.alarm.cleared_by == ADMIN_SUBJECT
    stream.cancel()


async def test_clearing_needs_the_admin_role_and_a_reason_and_is_audited(served: Served) -> None:
    await send(served, CHEAT, [dishonest(50) for _ in range(10)])
    [state] = served.tables.alarms()
    alarm_id = state.alarm.alarm_id
    request = verifier_pb2.ClearAlarmRequest(alarm_id=alarm_id, reason="fixed the deployment")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await served.stub().ClearAlarm(request)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert served.tables.alarms() == [state]
    with pytest.raises(grpc.aio.AioRpcError) as no_reason:
        await served.admin().ClearAlarm(verifier_pb2.ClearAlarmRequest(alarm_id=alarm_id))
    assert no_reason.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    response = await served.admin().ClearAlarm(request)
    assert response.cleared.clear_reason == "fixed the deployment"
    assert response.cleared.cleared_by == ADMIN_SUBJECT
    assert served.tables.alarms() == []
    [event] = [e for e in served.store.audit_log() if e.action == "clear_prover_alarm"]
    assert (event.actor, json.loads(event.detail)["alarm_id"]) == (ADMIN_SUBJECT, alarm_id)
    with pytest.raises(grpc.aio.AioRpcError) as again:
        await served.admin().ClearAlarm(request)
    assert again.value.code() == grpc.StatusCode.NOT_FOUND


async def test_watch_streams_end_when_the_service_stops(served: Served) -> None:
    stream = served.stub().WatchAlarms(verifier_pb2.WatchAlarmsRequest())
    await stream.initial_metadata()  # subscribed
    await served.server.stop(grace_s=30)
    assert await stream.read() is grpc.aio.EOF

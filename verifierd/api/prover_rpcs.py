"""ListProvers, GetProver, WatchAlarms and ClearAlarm over the prover tables.

Reads run in worker threads, like the other RPCs. ClearAlarm is an admin action: the
caller must hold the admin role (the servicer's check), give a reason, and the clear is
written to the audit log in the same transaction.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from veritap.v1 import verifier_pb2

from verifierd.api.alarm_hub import AlarmHub
from verifierd.api.identity import Principal
from verifierd.provers.identity import ProverKey, ProverKeyError
from verifierd.provers.store import NoSuchAlarmError, ProverTables

_Context = grpc.aio.ServicerContext[Any, Any]
#: The servicer's admin check: aborts with PERMISSION_DENIED unless the caller is admin.
RequireAdmin = Callable[[str, _Context], Awaitable[Principal]]


@dataclass(frozen=True)
class ProverSource:
    """What the daemon lends the service: its prover tables and the hub their alarm
    listener publishes to."""

    tables: ProverTables
    hub: AlarmHub


class ProverRpcs:
    def __init__(self, source: ProverSource, require_admin: RequireAdmin) -> None:
        self._tables = source.tables
        self._hub = source.hub
        self._require_admin = require_admin

    async def list_provers(
        self, request: verifier_pb2.ListProversRequest, context: _Context
    ) -> verifier_pb2.ListProversResponse:
        found = await asyncio.to_thread(self._tables.provers, alarmed_only=request.alarmed_only)
        return verifier_pb2.ListProversResponse(provers=found)

    async def get_prover(
        self, request: verifier_pb2.GetProverRequest, context: _Context
    ) -> verifier_pb2.GetProverResponse:
        try:
            prover = ProverKey.of_proto(request.id)
        except ProverKeyError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        found = await asyncio.to_thread(self._tables.prover, prover)
        if found is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no prover {prover.label}")
        return found

    async def watch_alarms(
        self, request: verifier_pb2.WatchAlarmsRequest, context: _Context
    ) -> AsyncIterator[verifier_pb2.WatchAlarmsResponse]:
        subscription = self._hub.subscribe()
        try:
            # Subscribed before listing, so nothing raised in between is missed (it may
            # come twice: once listed, once as news). Headers go out once subscribed.
            await context.send_initial_metadata(())
            for state in await asyncio.to_thread(self._tables.alarms):
                yield verifier_pb2.WatchAlarmsResponse(alarm=state)
            async for state in subscription.alarms():
                yield verifier_pb2.WatchAlarmsResponse(alarm=state)
        finally:
            subscription.close()

    async def clear_alarm(
        self, request: verifier_pb2.ClearAlarmRequest, context: _Context
    ) -> verifier_pb2.ClearAlarmResponse:
        principal = await self._require_admin("ClearAlarm", context)
        if not request.alarm_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "alarm_id is required")
        why = request.reason.strip()
        if not why:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "a reason is required (it goes to the audit log)"
            )
        try:
            cleared = await asyncio.to_thread(
                self._tables.clear_alarm, request.alarm_id, actor=principal.name, why=why
            )
        except NoSuchAlarmError as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        return verifier_pb2.ClearAlarmResponse(cleared=cleared)

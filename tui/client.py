"""The console's only door to the daemons: verifierd's VerifierService and the collectors'
LedgerService.GetStatus, over gRPC with (mutual) TLS.

Screens call these coroutines and get protobuf messages or the small values below; they
never see a channel. Every call has a deadline and fails fast while a daemon is away
(channels retry connecting every ≤ 2 s in the background), so the interface stays
responsive. Health listeners hear when a daemon stops or starts answering.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import grpc
from veritap.tls import ClientTls, channel_credentials, channel_options, require_tls_off_loopback
from veritap.v1 import (
    ledger_pb2,
    ledger_pb2_grpc,
    record_pb2,
    verifier_pb2,
    verifier_pb2_grpc,
)

from tui.verdict_filter import VerdictFilterSpec

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Codes that mean "the daemon is not answering" rather than "it refused".
_AWAY = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
_RECONNECT_OPTIONS: list[tuple[str, str | int]] = [
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.enable_retries", 0),
]


#: ClearIntakeAlert waits for verifierd's questions to the collector (5 s each at most).
_CLEAR_TIMEOUT_S = 30.0


class ConsoleClientError(Exception):
    """A call to a daemon did not give an answer."""


class DaemonUnavailableError(ConsoleClientError):
    def __init__(self, name: str, code: str) -> None:
        super().__init__(f"{name} unreachable ({code})")
        self.name = name
        self.code = code


class CallRefusedError(ConsoleClientError):
    """The daemon answered with an error (PERMISSION_DENIED, INVALID_ARGUMENT, ...)."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details


@dataclass(frozen=True)
class Endpoint:
    #: How the console names the daemon ("verifierd", "edge-1").
    name: str
    #: host:port.
    address: str


@dataclass(frozen=True)
class Health:
    name: str
    reachable: bool
    #: The gRPC status code name when unreachable.
    code: str = ""


@dataclass(frozen=True)
class CollectorReading:
    endpoint: Endpoint
    #: None when the collector did not answer (see ``code``).
    status: ledger_pb2.GetStatusResponse | None
    code: str = ""


@dataclass(frozen=True)
class RecordDetail:
    record: record_pb2.InferenceRecord
    verdict: verifier_pb2.Verdict
    token_ids: tuple[int, ...]
    token_texts: tuple[str, ...]
    #: Per-token DiFR margins, aligned with token_ids.
    margins: tuple[float, ...]
    tokens_note: str
    #: Key id of the verifier key that signed the verdict (b"" while pending).
    key_id: bytes


HealthListener = Callable[[Health], None]


class ConsoleClient:
    def __init__(
        self,
        verifier: Endpoint,
        collectors: Sequence[Endpoint] = (),
        *,
        tls: ClientTls | None = None,
        timeout_s: float = 3.0,
    ) -> None:
        for endpoint in (verifier, *collectors):
            require_tls_off_loopback(endpoint.address, tls)
        self.verifier = verifier
        self.collectors = tuple(collectors)
        self._tls = tls
        self._credentials = None if tls is None else channel_credentials(tls)
        self._timeout_s = timeout_s
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._reachable: dict[str, bool] = {}
        self._listeners: list[HealthListener] = []

    def add_health_listener(self, listener: HealthListener) -> None:
        self._listeners.append(listener)

    def _note(self, name: str, reachable: bool, code: str = "") -> None:
        if self._reachable.get(name) == reachable:
            return
        self._reachable[name] = reachable
        for listener in self._listeners:
            listener(Health(name, reachable, code))

    def _channel(self, endpoint: Endpoint) -> grpc.aio.Channel:
        channel = self._channels.get(endpoint.name)
        if channel is None:
            options = channel_options(self._tls) + _RECONNECT_OPTIONS
            if self._credentials is None:
                channel = grpc.aio.insecure_channel(endpoint.address, options=options)
            else:
                channel = grpc.aio.secure_channel(
                    endpoint.address, self._credentials, options=options
                )
            self._channels[endpoint.name] = channel
        return channel

    def _verifier(self) -> verifier_pb2_grpc.VerifierServiceAsyncStub:
        return verifier_pb2_grpc.VerifierServiceStub(self._channel(self.verifier))

    def _failure(self, endpoint: Endpoint, exc: grpc.aio.AioRpcError) -> ConsoleClientError:
        if exc.code() in _AWAY:
            self._note(endpoint.name, False, exc.code().name)
            return DaemonUnavailableError(endpoint.name, exc.code().name)
        self._note(endpoint.name, True)
        return CallRefusedError(exc.code().name, exc.details() or "")

    async def _call(self, endpoint: Endpoint, call: Awaitable[T]) -> T:
        try:
            answer = await call
        except grpc.aio.AioRpcError as exc:
            raise self._failure(endpoint, exc) from None
        self._note(endpoint.name, True)
        return answer

    async def aclose(self) -> None:
        channels = list(self._channels.values())
        self._channels.clear()
        for channel in channels:
            await channel.close(None)

    # -- verifierd ----------------------------------------------------------------------

    async def stats(self) -> verifier_pb2.GetStatsResponse:
        stub = self._verifier()
        return await self._call(
            self.verifier,
            stub.GetStats(verifier_pb2.GetStatsRequest(), timeout=self._timeout_s),
        )

    async def verdicts(self, spec: VerdictFilterSpec, limit: int) -> list[verifier_pb2.Verdict]:
        """The newest ``limit`` (at most 1000) verdicts matching ``spec``, newest first."""
        stub = self._verifier()
        request = spec.request(limit)
        request.newest_first = True
        response = await self._call(
            self.verifier, stub.ListVerdicts(request, timeout=self._timeout_s)
        )
        return list(response.verdicts)

    async def watch(self, on_ready: Callable[[], None]) -> AsyncIterator[verifier_pb2.Verdict]:
        """New verdicts as verifierd stores them; ``on_ready`` runs once subscribed.
        Raises DaemonUnavailableError or CallRefusedError when the stream breaks."""
        call = self._verifier().WatchVerdicts(verifier_pb2.WatchVerdictsRequest())
        try:
            await self._call(self.verifier, call.initial_metadata())
            on_ready()
            async for response in call:
                yield response.verdict
        except grpc.aio.AioRpcError as exc:
            raise self._failure(self.verifier, exc) from None
        finally:
            call.cancel()
        raise DaemonUnavailableError(self.verifier.name, "stream ended")

    async def watch_alarms(
        self, on_ready: Callable[[], None]
    ) -> AsyncIterator[verifier_pb2.AlarmState]:
        """The prover alarms in force, then each one raised or cleared as it happens;
        ``on_ready`` runs once subscribed. Raises as :meth:`watch` does."""
        call = self._verifier().WatchAlarms(verifier_pb2.WatchAlarmsRequest())
        try:
            await self._call(self.verifier, call.initial_metadata())
            on_ready()
            async for response in call:
                yield response.alarm
        except grpc.aio.AioRpcError as exc:
            raise self._failure(self.verifier, exc) from None
        finally:
            call.cancel()
        raise DaemonUnavailableError(self.verifier.name, "stream ended")

    async def provers(self, *, alarmed_only: bool = False) -> list[verifier_pb2.Prover]:
        stub = self._verifier()
        response = await self._call(
            self.verifier,
            stub.ListProvers(
                verifier_pb2.ListProversRequest(alarmed_only=alarmed_only),
                timeout=self._timeout_s,
            ),
        )
        return list(response.provers)

    async def prover(self, prover: verifier_pb2.ProverId) -> verifier_pb2.GetProverResponse:
        """One prover in full: its windows, the test statistic over time, every alarm."""
        stub = self._verifier()
        return await self._call(
            self.verifier,
            stub.GetProver(verifier_pb2.GetProverRequest(id=prover), timeout=self._timeout_s),
        )

    async def clear_alarm(self, alarm_id: str, reason: str) -> verifier_pb2.AlarmState:
        """Clear a prover alarm in force (admin): it is kept, marked cleared, and audited."""
        stub = self._verifier()
        response = await self._call(
            self.verifier,
            stub.ClearAlarm(
                verifier_pb2.ClearAlarmRequest(alarm_id=alarm_id, reason=reason),
                timeout=self._timeout_s,
            ),
        )
        return response.cleared

    async def record(self, record_id: str, origin: str) -> RecordDetail:
        stub = self._verifier()
        found = await self._call(
            self.verifier,
            stub.GetRecord(
                verifier_pb2.GetRecordRequest(record_id=record_id, origin=origin),
                timeout=self._timeout_s,
            ),
        )
        signed = await self._call(
            self.verifier,
            stub.GetVerdict(
                verifier_pb2.GetVerdictRequest(record_id=record_id, origin=origin),
                timeout=self._timeout_s,
            ),
        )
        return RecordDetail(
            record=found.record,
            verdict=found.verdict,
            token_ids=tuple(found.token_ids),
            token_texts=tuple(found.token_texts),
            margins=tuple(found.margins),
            tokens_note=found.tokens_note,
            key_id=signed.signed.key_id,
        )

    async def pending(self, limit: int) -> list[verifier_pb2.PendingRecord]:
        stub = self._verifier()
        response = await self._call(
            self.verifier,
            stub.ListPending(
                verifier_pb2.ListPendingRequest(page_size=limit), timeout=self._timeout_s
            ),
        )
        return list(response.pending)

    async def commitments(self) -> list[verifier_pb2.Commitment]:
        stub = self._verifier()
        response = await self._call(
            self.verifier,
            stub.ListCommitments(verifier_pb2.ListCommitmentsRequest(), timeout=self._timeout_s),
        )
        return list(response.commitments)

    async def engines(self) -> list[verifier_pb2.EngineInfo]:
        stub = self._verifier()
        response = await self._call(
            self.verifier,
            stub.GetEngines(verifier_pb2.GetEnginesRequest(), timeout=self._timeout_s),
        )
        return list(response.engines)

    async def audit(self, limit: int) -> list[verifier_pb2.AuditEvent]:
        stub = self._verifier()
        response = await self._call(
            self.verifier,
            stub.ListAuditEvents(
                verifier_pb2.ListAuditEventsRequest(page_size=limit), timeout=self._timeout_s
            ),
        )
        return list(response.events)

    async def set_difr_settings(
        self, commitment_id: str, settings: verifier_pb2.DifrSettings
    ) -> verifier_pb2.SetDifrSettingsResponse:
        stub = self._verifier()
        return await self._call(
            self.verifier,
            stub.SetDifrSettings(
                verifier_pb2.SetDifrSettingsRequest(commitment_id=commitment_id, settings=settings),
                timeout=self._timeout_s,
            ),
        )

    async def intake_alerts(self) -> list[verifier_pb2.IntakeAlert]:
        """The intake alerts in force, with their evidence."""
        stub = self._verifier()
        response = await self._call(
            self.verifier,
            stub.ListIntakeAlerts(verifier_pb2.ListIntakeAlertsRequest(), timeout=self._timeout_s),
        )
        return list(response.alerts)

    async def clear_intake_alert(self, origin: str, reason: str) -> verifier_pb2.IntakeAlert:
        """Resume intake from ``origin`` (admin; refused while the collector still
        disagrees). verifierd asks the collector first, so this may take a few seconds."""
        stub = self._verifier()
        response = await self._call(
            self.verifier,
            stub.ClearIntakeAlert(
                verifier_pb2.ClearIntakeAlertRequest(origin=origin, reason=reason),
                timeout=max(self._timeout_s, _CLEAR_TIMEOUT_S),
            ),
        )
        return response.cleared

    # -- collectors ---------------------------------------------------------------------

    async def collector_readings(self) -> list[CollectorReading]:
        """Every collector's GetStatus, asked together; one that does not answer is
        reported as such, not raised."""

        async def read(endpoint: Endpoint) -> CollectorReading:
            stub = ledger_pb2_grpc.LedgerServiceStub(self._channel(endpoint))
            try:
                status = await self._call(
                    endpoint, stub.GetStatus(ledger_pb2.GetStatusRequest(), timeout=self._timeout_s)
                )
            except DaemonUnavailableError as exc:
                return CollectorReading(endpoint, None, exc.code)
            except CallRefusedError as exc:
                return CollectorReading(endpoint, None, exc.code)
            return CollectorReading(endpoint, status)

        return list(await asyncio.gather(*(read(e) for e in self.collectors)))

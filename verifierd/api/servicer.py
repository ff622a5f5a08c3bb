"""The VerifierService RPCs over verifierd's store, commitments and daemon state.

Store reads run in worker threads (``asyncio.to_thread``) so a long page scan never
stalls the daemon's event loop. The admin actions, SetDifrSettings,
ClearIntakeAlert and ClearAlarm, are refused with PERMISSION_DENIED unless the caller's client
certificate holds the admin role; an accepted change is written with the caller's
subject to the store's audit log in the same transaction as the change itself.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import numpy as np
from google.protobuf.message import DecodeError
from veritap.v1 import ledger_pb2, log_pb2, record_pb2, verifier_pb2, verifier_pb2_grpc

from verifierd.api.errors import PageTokenError
from verifierd.api.identity import AdminPolicy, Principal, principal_of
from verifierd.api.prover_rpcs import ProverRpcs, ProverSource
from verifierd.api.rate_window import RateWindow
from verifierd.api.record_tokens import scored_tokens
from verifierd.api.sources import ServiceSources, VcaFigure
from verifierd.api.tokenizer_cache import TokenizerCache
from verifierd.api.verdict_hub import SubscriberOverflowError, VerdictHub
from verifierd.api.verdict_query import (
    DEFAULT_PAGE_SIZE,
    MAX_PAGE_SIZE,
    QueryError,
    VerdictFilter,
    VerdictQuery,
)
from verifierd.commitments import Commitment, CommitmentError, CommitmentRegistry, DifrSettings
from verifierd.intake.resume_check import NothingToClearError, ResumeRefusedError
from verifierd.store import Alert, ClearedAlert, PendingItem, Store, StoredVerdict

log = logging.getLogger(__name__)

_Context = grpc.aio.ServicerContext[Any, Any]
_U64_MAX = (1 << 64) - 1
_COMMITMENT_ID = re.compile(r"^[0-9a-f]{64}$")
#: An origin's intake state when this process lends no link for it (intake not running
#: here, or the origin was removed from the configuration).
_NO_LINK = "no intake link"
#: ListVerdicts(newest_first) looks at the last minute first, then eight times as far back.
_FIRST_WINDOW_NS = 60 * 1_000_000_000
#: GetStats does not wait longer than this for the VCA figure.
_VCA_TIMEOUT_S = 2.0


def _page_size(requested: int) -> int:
    return min(requested or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)


class VerifierServicer(verifier_pb2_grpc.VerifierServiceServicer):
    def __init__(
        self,
        store: Store,
        registry: CommitmentRegistry,
        *,
        admin: AdminPolicy,
        tokenizers: TokenizerCache,
        hub: VerdictHub,
        rate: RateWindow,
        sources: ServiceSources,
        clock: Callable[[], int] = time.time_ns,
        provers: ProverSource | None = None,
    ) -> None:
        self._store = store
        self._registry = registry
        self._admin = admin
        self._tokenizers = tokenizers
        self._hub = hub
        self._rate = rate
        self._sources = sources
        self._clock = clock
        self._provers = None if provers is None else ProverRpcs(provers, self._require_admin)

    # -- verdicts -----------------------------------------------------------------------

    async def _stored_verdict(
        self, record_id: str, origin: str, context: _Context
    ) -> StoredVerdict | None:
        if not record_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "record_id is required")
        found = await asyncio.to_thread(self._store.verdicts_for_record, record_id)
        matching = [s for s in found if not origin or s.origin == origin]
        return matching[0] if matching else None

    async def _pending_location(
        self, record_id: str, origin: str, context: _Context
    ) -> tuple[str, int]:
        location = await asyncio.to_thread(self._store.record_location, record_id)
        if location is None or (origin and location[0] != origin):
            where = f" from {origin}" if origin else ""
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no record {record_id!r}{where}")
        return location

    async def GetVerdict(  # noqa: N802 (the gRPC method name)
        self, request: verifier_pb2.GetVerdictRequest, context: _Context
    ) -> verifier_pb2.GetVerdictResponse:
        stored = await self._stored_verdict(request.record_id, request.origin, context)
        if stored is not None:
            history = await asyncio.to_thread(
                self._store.verdict_history, stored.origin, stored.seq
            )
            return verifier_pb2.GetVerdictResponse(
                signed=stored.signed,
                verdict=stored.verdict,
                superseded=[earlier.signed for earlier in history],
            )
        origin, seq = await self._pending_location(request.record_id, request.origin, context)
        return verifier_pb2.GetVerdictResponse(
            verdict=_pending_verdict(request.record_id, origin, seq)
        )

    async def ListVerdicts(  # noqa: N802
        self, request: verifier_pb2.ListVerdictsRequest, context: _Context
    ) -> verifier_pb2.ListVerdictsResponse:
        try:
            query = VerdictQuery.of(request)
        except (QueryError, PageTokenError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if query.newest_first:
            newest = await asyncio.to_thread(self._newest, query)
            return verifier_pb2.ListVerdictsResponse(verdicts=[s.verdict for s in newest])
        found, after = await asyncio.to_thread(
            self._store.list_verdicts,
            from_ns=query.from_ns,
            to_ns=query.to_ns,
            after=query.after,
            limit=query.page_size,
            accept=query.filter.accept,
        )
        return verifier_pb2.ListVerdictsResponse(
            verdicts=[s.verdict for s in found], next_page_token=query.next_token(after)
        )

    def _newest(self, query: VerdictQuery) -> list[StoredVerdict]:
        """The newest ``page_size`` matches, newest first.

        The store scans forward in decision order only, so this scans a window ending at
        ``to_ns`` that starts a minute before now and grows eightfold until it holds
        enough matches or reaches ``from_ns``: the cost stays near the matches in the
        last window rather than the whole store."""
        anchor = min(query.to_ns, self._clock())
        window = _FIRST_WINDOW_NS
        while True:
            start = max(query.from_ns, anchor - window)
            kept: deque[StoredVerdict] = deque(maxlen=query.page_size)
            after = b""
            while True:
                page, after = self._store.list_verdicts(
                    from_ns=start,
                    to_ns=query.to_ns,
                    after=after,
                    limit=MAX_PAGE_SIZE,
                    accept=query.filter.accept,
                )
                kept.extend(page)
                if not after:
                    break
            if len(kept) >= query.page_size or start <= query.from_ns:
                return list(reversed(kept))
            window *= 8

    async def WatchVerdicts(  # noqa: N802
        self, request: verifier_pb2.WatchVerdictsRequest, context: _Context
    ) -> AsyncIterator[verifier_pb2.WatchVerdictsResponse]:
        try:
            verdict_filter = VerdictFilter.of_watch(request)
        except QueryError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        subscription = self._hub.subscribe()
        try:
            # Headers go out once subscribed: a client that waits for them and then lists
            # verdicts misses none between the two.
            await context.send_initial_metadata(())
            async for verdict in subscription.verdicts():
                if verdict_filter.watches(verdict):
                    yield verifier_pb2.WatchVerdictsResponse(verdict=verdict)
        except SubscriberOverflowError as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"watch fell behind: {exc}")
        finally:
            subscription.close()

    # -- records ------------------------------------------------------------------------

    async def GetRecord(  # noqa: N802
        self, request: verifier_pb2.GetRecordRequest, context: _Context
    ) -> verifier_pb2.GetRecordResponse:
        stored = await self._stored_verdict(request.record_id, request.origin, context)
        if stored is not None:
            origin, seq, verdict = stored.origin, stored.seq, stored.verdict
        else:
            origin, seq = await self._pending_location(request.record_id, request.origin, context)
            verdict = _pending_verdict(request.record_id, origin, seq)
        entry = await asyncio.to_thread(self._store.entry, origin, seq)
        if entry is None or not entry.envelope:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"{origin}/{seq}: entry not stored")
        try:
            record = record_pb2.InferenceRecord.FromString(
                log_pb2.Entry.FromString(entry.envelope).record
            )
        except DecodeError:
            await context.abort(
                grpc.StatusCode.DATA_LOSS, f"{origin}/{seq}: record does not decode"
            )
        return await asyncio.to_thread(self._record_response, record, verdict)

    def _record_response(
        self, record: record_pb2.InferenceRecord, verdict: verifier_pb2.Verdict
    ) -> verifier_pb2.GetRecordResponse:
        commitment = self._registry.by_id.get(verdict.commitment_id) or self._registry.by_model.get(
            record.api.model
        )
        if commitment is None:
            codec, note = None, f"no commitment serves model {record.api.model!r}"
        else:
            lookup = self._tokenizers.lookup(commitment)
            codec, note = lookup.codec, lookup.note
        tokens = scored_tokens(record, verdict, codec, note)
        return verifier_pb2.GetRecordResponse(
            record=record,
            verdict=verdict,
            token_ids=tokens.ids,
            token_texts=tokens.texts,
            tokens_note=tokens.note,
            margins=np.frombuffer(verdict.margins_f16, dtype="<f2").astype(np.float32).tolist(),
        )

    async def ListPending(  # noqa: N802
        self, request: verifier_pb2.ListPendingRequest, context: _Context
    ) -> verifier_pb2.ListPendingResponse:
        if request.commitment_id and not _COMMITMENT_ID.match(request.commitment_id):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "commitment_id must be 64 lowercase hex digits"
            )
        return await asyncio.to_thread(
            self._pending, request.commitment_id, _page_size(request.page_size)
        )

    def _pending(self, commitment_id: str, limit: int) -> verifier_pb2.ListPendingResponse:
        ids = [commitment_id] if commitment_id else [b.commitment_id for b in self._store.backlog()]
        items: list[PendingItem] = []
        for cid in ids:
            items += self._store.take_pending(cid, limit, _U64_MAX)
        items.sort(key=lambda item: (item.enqueued_ns, item.commitment_id, item.key))
        response = verifier_pb2.ListPendingResponse()
        for item in items[:limit]:
            record_id, model = self._record_names(item.origin, item.seq)
            response.pending.add(
                commitment_id=item.commitment_id,
                origin=item.origin,
                seq=item.seq,
                record_id=record_id,
                model=model,
                attempts=item.attempts,
                enqueued_at_ns=item.enqueued_ns,
                not_before_ns=item.not_before_ns,
                last_error=item.last_error,
            )
        return response

    def _record_names(self, origin: str, seq: int) -> tuple[str, str]:
        entry = self._store.entry(origin, seq)
        if entry is None or not entry.envelope:
            return "", ""
        try:
            record = record_pb2.InferenceRecord.FromString(
                log_pb2.Entry.FromString(entry.envelope).record
            )
        except DecodeError:
            return "", ""
        return record.record_id, record.api.model

    # -- commitments and engines --------------------------------------------------------

    def _commitments(self) -> list[Commitment]:
        return sorted(
            self._registry.by_id.values(), key=lambda c: (c.served_model_names, c.commitment_id)
        )

    async def ListCommitments(  # noqa: N802
        self, request: verifier_pb2.ListCommitmentsRequest, context: _Context
    ) -> verifier_pb2.ListCommitmentsResponse:
        return await asyncio.to_thread(self._list_commitments)

    def _list_commitments(self) -> verifier_pb2.ListCommitmentsResponse:
        response = verifier_pb2.ListCommitmentsResponse()
        for commitment in self._commitments():
            message = commitment.to_proto()
            message.committed_settings.CopyFrom(commitment.difr.to_proto())
            override = self._store.difr_override(commitment.commitment_id)
            if override is not None:
                message.settings.CopyFrom(override)
            response.commitments.append(message)
        return response

    async def GetEngines(  # noqa: N802
        self, request: verifier_pb2.GetEnginesRequest, context: _Context
    ) -> verifier_pb2.GetEnginesResponse:
        backlog = {b.commitment_id: b.pending for b in await asyncio.to_thread(self._store.backlog)}
        engines = self._sources.engines
        statuses = {s.commitment_id: s for s in engines.status()} if engines is not None else {}
        response = verifier_pb2.GetEnginesResponse()
        ordered = [c.commitment_id for c in self._commitments()]
        ordered += sorted(set(statuses) - set(ordered))
        for cid in ordered:
            info = response.engines.add(commitment_id=cid, queue_depth=backlog.get(cid, 0))
            status = statuses.get(cid)
            if status is None:
                info.state = verifier_pb2.ENGINE_STATE_UNLOADED
                info.detail = "" if engines is not None else "no engine pool"
                continue
            info.state = verifier_pb2.EngineState.ValueType(status.state)
            info.memory_bytes = status.memory_bytes
            info.gpu_indices.extend(status.gpus)
            info.loaded_at_ns = status.loaded_at_ns
            info.detail = status.detail
        return response

    # -- statistics ---------------------------------------------------------------------

    async def GetStats(  # noqa: N802
        self, request: verifier_pb2.GetStatsRequest, context: _Context
    ) -> verifier_pb2.GetStatsResponse:
        response = await asyncio.to_thread(self._store_stats)
        figure = await self._vca()
        if figure is not None:
            response.vca = figure.value
            response.vca_method = figure.method
        return response

    def _store_stats(self) -> verifier_pb2.GetStatsResponse:
        now = self._clock()
        counts = self._store.counts()
        response = verifier_pb2.GetStatsResponse(
            verdicts_by_status=self._store.verdict_counts(),
            verdicts_per_second=self._rate.per_second(now),
            inbox=counts.inbox,
            awaiting_checkpoint=counts.awaiting_checkpoint,
            pending=counts.pending,
            entries=counts.entries,
            verdicts_superseded=counts.superseded,
        )
        for backlog in self._store.backlog():
            response.backlog.add(
                commitment_id=backlog.commitment_id,
                pending=backlog.pending,
                oldest_pending_age_ns=max(0, now - backlog.oldest_enqueued_ns),
            )
        alerts = {a.origin: a.reason for a in self._store.alerts()}
        links = {}
        if self._sources.intake is not None:
            links = {link.origin: link for link in self._sources.intake.status()}
        for origin in sorted(set(links) | set(self._store.origins())):
            link = links.get(origin)
            state = link.state if link is not None else _NO_LINK
            if origin in alerts and not state.startswith("alert"):
                state = f"alert: {alerts[origin]}"
            response.intake.add(
                origin=origin,
                stored_seq=self._store.cursor(origin).seq,
                remote_head_seq=link.remote_head_seq if link is not None else 0,
                state=state,
                last_contact_ns=link.last_contact_ns if link is not None else 0,
            )
        return response

    async def _vca(self) -> VcaFigure | None:
        if self._sources.vca is None:
            return None
        try:
            return await asyncio.wait_for(self._sources.vca(), _VCA_TIMEOUT_S)
        except Exception:  # an unknown figure, never a failed GetStats
            log.warning("VCA figure unavailable", exc_info=True)
            return None

    # -- intake alerts ------------------------------------------------------------------

    async def ListIntakeAlerts(  # noqa: N802
        self, request: verifier_pb2.ListIntakeAlertsRequest, context: _Context
    ) -> verifier_pb2.ListIntakeAlertsResponse:
        alerts = await asyncio.to_thread(self._store.alerts)
        response = verifier_pb2.ListIntakeAlertsResponse(alerts=[_alert_message(a) for a in alerts])
        if request.include_cleared:
            cleared = await asyncio.to_thread(self._store.cleared_alerts)
            response.alerts.extend(_cleared_message(c) for c in cleared)
        return response

    async def ClearIntakeAlert(  # noqa: N802
        self, request: verifier_pb2.ClearIntakeAlertRequest, context: _Context
    ) -> verifier_pb2.ClearIntakeAlertResponse:
        principal = await self._require_admin("ClearIntakeAlert", context)
        if not request.origin:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "origin is required")
        if not request.reason.strip():
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "a reason is required (it goes to the audit log)"
            )
        intake = self._sources.intake
        if intake is None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, "this verifierd runs no intake to resume"
            )
        try:
            cleared = await intake.clear(
                request.origin, actor=principal.name, why=request.reason.strip()
            )
        except NothingToClearError as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except ResumeRefusedError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"not cleared: {exc}")
        return verifier_pb2.ClearIntakeAlertResponse(cleared=_cleared_message(cleared))

    # -- provers and their alarms (verifierd.api.prover_rpcs) ----------------------------

    async def _prover_rpcs(self, context: _Context) -> ProverRpcs:
        if self._provers is None:
            await context.abort(
                grpc.StatusCode.UNIMPLEMENTED, "this verifierd keeps no prover tables"
            )
        return self._provers

    async def ListProvers(  # noqa: N802
        self, request: verifier_pb2.ListProversRequest, context: _Context
    ) -> verifier_pb2.ListProversResponse:
        return await (await self._prover_rpcs(context)).list_provers(request, context)

    async def GetProver(  # noqa: N802
        self, request: verifier_pb2.GetProverRequest, context: _Context
    ) -> verifier_pb2.GetProverResponse:
        return await (await self._prover_rpcs(context)).get_prover(request, context)

    async def WatchAlarms(  # noqa: N802
        self, request: verifier_pb2.WatchAlarmsRequest, context: _Context
    ) -> AsyncIterator[verifier_pb2.WatchAlarmsResponse]:
        rpcs = await self._prover_rpcs(context)
        async for response in rpcs.watch_alarms(request, context):
            yield response

    async def ClearAlarm(  # noqa: N802
        self, request: verifier_pb2.ClearAlarmRequest, context: _Context
    ) -> verifier_pb2.ClearAlarmResponse:
        return await (await self._prover_rpcs(context)).clear_alarm(request, context)

    # -- administration -----------------------------------------------------------------

    async def _require_admin(self, rpc: str, context: _Context) -> Principal:
        principal = principal_of(context.auth_context())
        if not self._admin.allows(principal):
            log.warning("admin action refused", extra={"actor": principal.name, "rpc": rpc})
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{principal.name} does not hold the admin role",
            )
        return principal

    async def SetDifrSettings(  # noqa: N802
        self, request: verifier_pb2.SetDifrSettingsRequest, context: _Context
    ) -> verifier_pb2.SetDifrSettingsResponse:
        principal = await self._require_admin("SetDifrSettings", context)
        commitment = self._registry.by_id.get(request.commitment_id)
        if commitment is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"no commitment {request.commitment_id!r}"
            )
        if not request.HasField("settings"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "settings are required")
        # A change that does not name a logprobs tolerance keeps the one in force (a
        # calibrated one is never loosened to the default by an unrelated edit).
        requested = verifier_pb2.DifrSettings()
        requested.CopyFrom(request.settings)
        if not requested.HasField("logprobs_tolerance"):
            in_force = await asyncio.to_thread(self._store.difr_override, commitment.commitment_id)
            requested.logprobs_tolerance = (
                in_force if in_force is not None else commitment.difr.to_proto()
            ).logprobs_tolerance
        try:
            current = DifrSettings.from_proto(requested).to_proto()
        except CommitmentError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        previous = await asyncio.to_thread(
            self._store.set_difr_override,
            commitment.commitment_id,
            current,
            actor=principal.name,
        )
        log.info(
            "difr settings changed",
            extra={
                "actor": principal.name,
                "commitment_id": commitment.commitment_id,
                "threshold": current.threshold,
                "delta_max": current.delta_max,
                "sample_rate": current.sample_rate,
                "logprobs_tolerance": current.logprobs_tolerance,
            },
        )
        return verifier_pb2.SetDifrSettingsResponse(
            previous=previous if previous is not None else commitment.difr.to_proto(),
            current=current,
        )

    async def ListAuditEvents(  # noqa: N802
        self, request: verifier_pb2.ListAuditEventsRequest, context: _Context
    ) -> verifier_pb2.ListAuditEventsResponse:
        events = await asyncio.to_thread(self._store.audit_log)
        newest = sorted(events, key=lambda e: e.at_ns, reverse=True)[
            : _page_size(request.page_size)
        ]
        return verifier_pb2.ListAuditEventsResponse(
            events=[
                verifier_pb2.AuditEvent(
                    at_ns=e.at_ns, actor=e.actor, action=e.action, detail_json=e.detail
                )
                for e in newest
            ]
        )


def _alert_message(alert: Alert) -> verifier_pb2.IntakeAlert:
    message = verifier_pb2.IntakeAlert(
        origin=alert.origin, reason=alert.reason, detected_at_ns=alert.at_ns
    )
    try:
        message.evidence.CopyFrom(ledger_pb2.IntakeEvidence.FromString(alert.evidence))
    except DecodeError:
        log.error("an alert's evidence does not decode", extra={"origin": alert.origin})
    return message


def _cleared_message(cleared: ClearedAlert) -> verifier_pb2.IntakeAlert:
    message = _alert_message(cleared.alert)
    message.cleared_at_ns = cleared.cleared_at_ns
    message.cleared_by = cleared.actor
    message.clear_reason = cleared.why
    message.clear_check = cleared.check
    return message


def _pending_verdict(record_id: str, origin: str, seq: int) -> verifier_pb2.Verdict:
    """What GetVerdict answers for a record still waiting for its engine."""
    return verifier_pb2.Verdict(
        record_id=record_id, origin=origin, seq=seq, status=verifier_pb2.VERDICT_STATUS_PENDING
    )

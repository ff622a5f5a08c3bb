"""Exactly once across crashes: kill -9 the serving collector and the verifier's intake, again
and again, while records flow; the verifier's store ends with exactly the collector's entries.

Four real processes on loopback with mutual TLS (certificates made by the test): a writer
appending to the collector's log, `collector serve` streaming it, `verifierd intake` storing
it, and this test, which kills the server and the intake with SIGKILL at random moments
(each after it has made progress since its restart) and starts them again.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from veritap.signing import Signer

from collector.log import Log
from tests.ledger_fixtures import ORIGIN
from tests.tls import write_test_pki
from verifierd.intake.frontier_file import FrontierFile
from verifierd.store import Store

pytestmark = pytest.mark.timeout(300)

KILLS_EACH = 20
ROOT = Path(__file__).resolve().parents[2]

_WRITER = """
import sys, time
from pathlib import Path
from veritap.signing import Signer
from tests.ledger_fixtures import ORIGIN, make_record
from collector.log import Log

log_dir, key, stop = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
log = Log.open(log_dir, origin=ORIGIN, signer=Signer.load(key),
               checkpoint_every=40, checkpoint_interval_s=0.2)
n = 0
while not stop.exists() and n < 500_000:  # bounded; the test stops it far earlier
    log.append_many([make_record(i) for i in range(n, n + 5)])
    n += 5
    time.sleep(0.01)
log.close()
"""

_INTAKE = """
import argparse, sys
from pathlib import Path
from verifierd.commands import intake
sys.exit(intake.run(argparse.Namespace(config=Path(sys.argv[1]))))
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _wait(predicate: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


class Processes:
    def __init__(self, root: Path, port: int) -> None:
        self.root = root
        self.port = port
        self.env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'protos'}"}
        self.serve: subprocess.Popen[bytes] | None = None
        self.intake: subprocess.Popen[bytes] | None = None

    def _spawn(self, args: list[str], name: str) -> subprocess.Popen[bytes]:
        log = (self.root / f"{name}.stderr").open("ab")
        return subprocess.Popen(
            [sys.executable, *args],
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=log,
        )

    def start_serve(self) -> None:
        self.serve = self._spawn(
            [
                "-m", "collector.cli", "serve",
                "--config", str(self.root / "collector.toml"),
                "--log", str(self.root / "log"),
                "--origin", ORIGIN,
                "--listen", f"127.0.0.1:{self.port}",
            ],
            "serve",
        )  # fmt: skip
        assert self.serve.stdout is not None
        line = self.serve.stdout.readline()
        assert line.startswith(b"ledger listening on"), line

    def start_intake(self) -> None:
        self.intake = self._spawn(["-c", _INTAKE, str(self.root / "verifierd.toml")], "intake")

    @staticmethod
    def kill(process: subprocess.Popen[bytes] | None) -> None:
        assert process is not None and process.poll() is None, "it died on its own"
        process.send_signal(signal.SIGKILL)
        process.wait()

    def stop(self) -> None:
        for process in (self.serve, self.intake):
            if process is not None and process.poll() is None:
                process.terminate()
                process.wait(timeout=30)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    pki = write_test_pki(tmp_path / "pki")
    signer = Signer.generate(ORIGIN)
    signer.save(tmp_path / "collector.key")
    port = _free_port()
    (tmp_path / "collector.toml").write_text(
        f'[ledger]\ntls_cert = "{pki.server_cert}"\ntls_key = "{pki.server_key}"\n'
        f'tls_client_ca = "{pki.ca}"\nverifiers = ["verifier-a"]\n'
        "poll_s = 0.005\nheartbeat_s = 0.2\n"
    )
    (tmp_path / "verifierd.toml").write_text(
        f'[verifierd]\nstate_dir = "{tmp_path / "verifier"}"\nverifier_id = "verifier-a"\n'
        "[store]\nmap_size_gib = 0.5\n"
        f'[[collectors]]\norigin = "{ORIGIN}"\naddress = "localhost:{port}"\n'
        f'public_key = "{signer.verifier().key_string()}"\nca_file = "{pki.ca}"\n'
        f'cert_file = "{pki.client_cert}"\nkey_file = "{pki.client_key}"\nwindow = 200\n'
    )
    procs = Processes(tmp_path, port)
    try:
        yield procs
    finally:
        procs.stop()


def test_kill_9_of_server_and_intake_loses_and_duplicates_nothing(
    processes: Processes, tmp_path: Path
) -> None:
    rng = random.Random(os.environ.get("KILL_TEST_SEED", "veritap"))
    stop_writer = tmp_path / "stop-writer"
    writer = processes._spawn(
        ["-c", _WRITER, str(tmp_path / "log"), str(tmp_path / "collector.key"), str(stop_writer)],
        "writer",
    )
    _wait((tmp_path / "log" / "data.mdb").exists, "the log")
    processes.start_serve()
    processes.start_intake()
    # Written after the first ingest, so the store's databases exist by then.
    _wait(FrontierFile(tmp_path / "verifier" / "intake", ORIGIN).path.exists, "the first ingest")
    store = Store.open(tmp_path / "verifier" / "store", readonly=True)

    def stored() -> int:
        return store.cursor(ORIGIN).seq

    def progress_then_kill(kill: Callable[[], None]) -> None:
        mark = stored()
        _wait(lambda: stored() > mark, "progress before the kill")
        time.sleep(rng.uniform(0.0, 0.15))
        kill()

    try:
        for _ in range(KILLS_EACH):
            progress_then_kill(lambda: processes.kill(processes.serve))
            processes.start_serve()
            progress_then_kill(lambda: processes.kill(processes.intake))
            processes.start_intake()
        stop_writer.touch()
        assert writer.wait(timeout=60) == 0
        with Log.open(tmp_path / "log", origin=ORIGIN, readonly=True) as log:
            head = log.head()
            _wait(lambda: stored() == head.seq, "the intake to catch up", timeout=60)
            processes.stop()
            assert store.alerts() == []
            cursor = store.cursor(ORIGIN)
            assert (cursor.seq, cursor.hash) == (head.seq, head.hash)
            assert store.counts().entries == head.seq
            for seq, envelope in log.iter_entries(1):
                entry = store.entry(ORIGIN, seq)
                assert entry is not None and entry.envelope == envelope, f"seq {seq}"
    finally:
        stop_writer.touch()
        writer.wait(timeout=60)
        store.close()

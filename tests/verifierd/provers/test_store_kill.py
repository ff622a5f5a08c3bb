"""Killed mid-work, the provers' tables agree with the verdicts stored: none lost, none
counted twice, because both are written in one transaction."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from veritap.signing import Signer

from verifierd.config import ProversConfig
from verifierd.provers.store import ProverTables
from verifierd.store import Store

_WRITER = """
import sys
from pathlib import Path

from veritap.signing import Signer

from tests.verifierd.provers.prover_fixtures import ProverTraffic, dishonest, honest, unverifiable
from verifierd.config import ProversConfig
from verifierd.provers.identity import ProverKey
from verifierd.provers.store import ProverTables
from verifierd.store import Store

store = Store.open(Path(sys.argv[1]))
signer = Signer.generate("verifier-test")
ProverTables(store, ProversConfig(), signer)
traffic = ProverTraffic(store, signer)
provers = [ProverKey("edge", f"10.0.0.{i}", 8000) for i in range(3)]
n = 0
while True:
    prover = provers[n % 3]
    traffic.send(prover, [honest(20), dishonest(20), unverifiable("no_seed")] * 5)
    n += 1
    print(n, flush=True)
"""


def test_killed_writer_neither_loses_nor_double_counts(tmp_path: Path) -> None:
    path = tmp_path / "store"
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[3],
    )
    assert writer.stdout is not None
    for _ in range(20):  # batches committed; the writer goes on with the next ones
        assert writer.stdout.readline(), "the writer stopped on its own"
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    assert writer.returncode == -signal.SIGKILL

    store = Store.open(path)
    try:
        tables = ProverTables(store, ProversConfig(), Signer.generate("restarted"))
        stored = store.counts().verdicts
        counted = [next(w for w in p.windows if w.window_s == 0) for p in tables.provers()]
        assert stored >= 20 * 15
        assert sum(w.verdicts for w in counted) == stored
        assert sum(w.tokens_scored for w in counted) == stored // 15 * 10 * 20
    finally:
        store.close()

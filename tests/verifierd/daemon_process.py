"""`verifierd run` as a child process of a test, on a store the test prepared."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from veritap.signing import Signer

from verifierd.commitments import Commitment, write_commitment
from verifierd.config import load_config
from verifierd.store import Store
from verifierd.weights_cache import WeightsCache


def write_config(
    tmp_path: Path,
    commitment: Commitment,
    model: Path,
    sections: str,
    *,
    origin: str,
    collector: Signer,
) -> Path:
    """tmp_path/verifierd.toml: ``sections`` (TOML text) and ``origin``'s collector pinned
    to ``collector``'s key (no collector listens there); ``commitment`` is written to
    tmp_path/commitments and ``model`` installed as its weights. Returns the file."""
    (tmp_path / "commitments").mkdir()
    write_commitment(commitment, tmp_path / "commitments" / "model.json")
    config_path = tmp_path / "verifierd.toml"
    config_path.write_text(
        f"""{sections}
[[collectors]]
origin = "{origin}"
address = "127.0.0.1:9"
public_key = "{collector.verifier().key_string()}"
"""
    )
    WeightsCache(load_config(config_path).weights_dir).install(commitment, model)
    return config_path


def start_daemon(config_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """`verifierd run --config config_path`, ``env`` added to ours. Its stderr goes to
    `daemon_log` (a pipe nobody reads while the test waits would fill and stop the
    daemon at its next log line)."""
    with daemon_log(config_path).open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "verifierd.cli", "run", "--config", str(config_path)],
            env={
                **os.environ,
                "PYTHONPATH": os.pathsep.join([os.getcwd(), "protos"]),
                **(env or {}),
            },
            stdout=subprocess.DEVNULL,
            stderr=log,
        )


def daemon_log(config_path: Path) -> Path:
    """Where every daemon started on ``config_path`` writes its stderr (appended)."""
    return config_path.with_name("verifierd-stderr.log")


def stop_daemon(daemon: subprocess.Popen[bytes], config_path: Path) -> None:
    """SIGTERM, and a clean exit within a minute (else the log's tail says why)."""
    daemon.terminate()
    daemon.wait(timeout=60)
    assert daemon.returncode == 0, daemon_log(config_path).read_text(errors="replace")[-2000:]


def stored_verdicts(store_dir: Path) -> int:
    """How many verdicts the store holds (read while the daemon may be writing)."""
    store = Store.open(store_dir, readonly=True)
    try:
        return store.counts().verdicts
    finally:
        store.close()


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)

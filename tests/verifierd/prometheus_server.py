"""A real Prometheus server (Debian's `prometheus`) on loopback, for tests.

Started with a generated config that scrapes the given targets every 200 ms, a temporary
storage directory and a free port; every wait is bounded; `stop()` terminates it (and kills it
if it does not exit in time).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
SCRAPE_INTERVAL_S = 0.2


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class PrometheusServer:
    def __init__(self, workdir: Path, targets: Sequence[str]) -> None:
        """`targets`: host:port of /metrics endpoints to scrape."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._workdir = workdir
        quoted = ", ".join(f'"{t}"' for t in targets)
        config = workdir / "prometheus.yml"
        config.write_text(
            "global:\n"
            f"  scrape_interval: {int(SCRAPE_INTERVAL_S * 1000)}ms\n"
            f"  scrape_timeout: {int(SCRAPE_INTERVAL_S * 750)}ms\n"
            "scrape_configs:\n"
            "  - job_name: veritap\n"
            "    static_configs:\n"
            f"      - targets: [{quoted}]\n"
        )
        self._log = (workdir / "prometheus.log").open("w")
        self._proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def _get(self, path: str) -> bytes:
        with urllib.request.urlopen(self.url + path, timeout=5) as response:
            body: bytes = response.read()
            return body

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.log_tail()}")
            try:
                self._get("/-/ready")
                return
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
        raise TimeoutError(f"prometheus not ready after {timeout_s}s: {self.log_tail()}")

    def wait_targets_up(self, count: int, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        health: list[str] = []
        while time.monotonic() < deadline:
            body = json.loads(self._get("/api/v1/targets"))
            health = [t["health"] for t in body["data"]["activeTargets"]]
            if len(health) == count and all(h == "up" for h in health):
                return
            time.sleep(SCRAPE_INTERVAL_S)
        raise TimeoutError(f"targets not up after {timeout_s}s: {health}")

    def log_tail(self) -> str:
        self._log.flush()
        return (self._workdir / "prometheus.log").read_text()[-2000:]

    def stop(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=15)
        self._log.close()

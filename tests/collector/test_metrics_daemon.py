"""The daemons' /metrics over HTTP: a real `collector run` capturing API calls on loopback, and
a real `collector serve` reading an existing log, scraped while they run."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from veritap.signing import Signer

from tests.ledger_fixtures import ORIGIN, append, open_log

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
ENV = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'protos'}"}
P = "veritap_collector_"

pytestmark = pytest.mark.timeout(120)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int) -> None:
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"nothing listens on port {port}")


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape_until(
    url: str, ready: Callable[[Samples], bool], proc: subprocess.Popen[str]
) -> Samples:
    """Scrape every 0.1 s (at most 30 s) until `ready` holds."""
    samples: Samples = {}
    for _ in range(300):
        assert proc.poll() is None, "the daemon exited"
        try:
            samples = scrape(url)
        except (urllib.error.URLError, ConnectionError):
            samples = {}
        if samples and ready(samples):
            return samples
        time.sleep(0.1)
    raise AssertionError(f"metrics never got there: {samples}")


def stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return err


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="live capture needs root (AF_PACKET)")
def test_collector_run_counts_packets_and_records_on_metrics(tmp_path: Path) -> None:
    api_port, metrics_port = free_port(), free_port()
    Signer.generate("metrics.test/collector").save(tmp_path / "collector.key")
    config = tmp_path / "collector.toml"
    config.write_text(
        '[collector]\norigin = "metrics.test/collector"\n'
        f'[capture]\ninterface = "lo"\nfilter = "tcp port {api_port}"\nchecksums = "ignore"\n'
        f"server_ports = [{api_port}]\nring_blocks = 8\nstats_interval_s = 0.2\n"
        '[log]\npath = "log"\nkey = "collector.key"\nbatch_delay_s = 0.01\n'
        '[ledger]\nlisten = "127.0.0.1:0"\n'
        f'[metrics]\nlisten = "127.0.0.1:{metrics_port}"\n'
    )
    server = subprocess.Popen(
        [sys.executable, str(HERE / "capture" / "openai_server.py"), "127.0.0.1", str(api_port)],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    collector = subprocess.Popen(
        [sys.executable, "-m", "collector.cli", "run", "--config", str(config)],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    try:
        scrape_until(url, lambda s: (f"{P}log_head_seq", ()) in s, collector)
        wait_for_port(api_port)
        done = subprocess.run(
            [sys.executable, str(HERE / "capture" / "live_client.py"), "127.0.0.1", str(api_port)],
            env=ENV,
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr

        def counted(s: Samples) -> bool:
            # Capture counters are published every stats_interval_s, records as they land:
            # wait for both rather than race the next stats tick.
            records = s.get((f"{P}records_total", (("quality", "complete"),)), 0)
            packets = s.get((f"{P}packets_total", (("source", "lo"),)), 0)
            captured = s.get((f"{P}captured_bytes_total", (("source", "lo"),)), 0)
            return (
                records >= 3
                and packets >= 10
                and captured > 1000
                and s.get((f"{P}flows_closed_total", (("reason", "fin"),)), 0) >= 1
            )

        samples = scrape_until(url, counted, collector)
    finally:
        err = stop(collector)
        server.terminate()
        server.wait(timeout=30)
    assert f"metrics at {url}" in err
    lo = (("source", "lo"),)
    assert samples[(f"{P}packets_total", lo)] >= 10
    assert samples[(f"{P}captured_bytes_total", lo)] > 1000
    assert samples[(f"{P}kernel_drops_total", lo)] == 0
    assert samples[(f"{P}flows_opened_total", ())] >= 1
    assert (
        samples[(f"{P}log_head_seq", ())]
        == samples[(f"{P}records_total", (("quality", "complete"),))]
    )
    assert samples[(f"{P}log_head_timestamp_seconds", ())] > time.time() - 600


def test_collector_serve_exports_the_log_head(tmp_path: Path) -> None:
    log = open_log(tmp_path / "log", Signer.generate(ORIGIN), checkpoint_every=10)
    append(log, 0, 25)
    log.close()  # last checkpoint: 25
    metrics_port = free_port()
    config = tmp_path / "collector.toml"
    config.write_text(
        f'[collector]\norigin = "{ORIGIN}"\n[log]\npath = "log"\n'
        f'[ledger]\nlisten = "127.0.0.1:0"\n[metrics]\nlisten = "127.0.0.1:{metrics_port}"\n'
    )
    serve = subprocess.Popen(
        [sys.executable, "-m", "collector.cli", "serve", "--config", str(config)],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        samples = scrape_until(
            f"http://127.0.0.1:{metrics_port}/metrics",
            lambda s: s.get((f"{P}log_head_seq", ()), 0) == 25,
            serve,
        )
    finally:
        stop(serve)
    assert samples[(f"{P}checkpoint_tree_size", ())] == 25
    assert samples[(f"{P}subscribers", ())] == 0

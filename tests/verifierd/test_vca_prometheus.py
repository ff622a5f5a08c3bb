"""A real Prometheus scrapes our /metrics endpoints; VCA reads the prover's activity back
through Prometheus' HTTP API.

Scraped: verifierd's metrics (prometheus-client, served by veritap.metrics_http), a collector's
metrics (fed the way `collector run` feeds them), a stand-in for DCGM's exporter (a
prometheus-client gauge with DCGM's metric name and labels: the exporter itself needs a
data-center GPU), and `verifierd prover-meter` metering a process that burns a known amount of
CPU. verifierd's vca gauge is computed from a cost log and the DCGM stand-in read back through
Prometheus, and Prometheus then scrapes it.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, Gauge
from veritap.metrics_http import serve_metrics
from veritap.v1 import record_pb2

from collector.metrics import CaptureFeed, CaptureTotals, CollectorMetrics
from tests.verifierd.prometheus_server import PROMETHEUS, SCRAPE_INTERVAL_S, PrometheusServer
from tests.verifierd.prover_meter_process import prover_meter
from verifierd.api.sources import VcaFigure
from verifierd.config import MetricsConfig
from verifierd.cost_log import BatchCost, CostLog
from verifierd.meter.readings import Method
from verifierd.metrics import VerifierMetrics
from verifierd.services.compute_meter import VcaGauge
from verifierd.vca import (
    DCGM_TENSOR_ACTIVE,
    PRESETS,
    Measure,
    PrometheusClient,
    ProverQuery,
    SeriesKind,
    measure_prover,
)

pytestmark = pytest.mark.skipif(
    not Path(PROMETHEUS).is_file(), reason="Debian's prometheus is not installed"
)

S = 1_000_000_000
BURN_S = 0.8
BURNER = """
import sys, time
for line in sys.stdin:
    end = time.process_time() + float(line)
    while time.process_time() < end:
        pass
    print("burnt", flush=True)
"""


@pytest.fixture
def burner() -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", BURNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    yield proc
    if proc.stdin:
        proc.stdin.close()
    proc.wait(timeout=30)


@pytest.fixture
def meter_address(burner: subprocess.Popen[str]) -> Iterator[str]:
    """host:port of a prover meter following `burner`."""
    with prover_meter(["--pid", str(burner.pid)]) as url:
        yield url.removeprefix("http://")


def hostport(url: str) -> str:
    return url.removeprefix("http://").removesuffix("/metrics")


async def test_prometheus_scrapes_and_vca_reads_back(
    tmp_path: Path, burner: subprocess.Popen[str], meter_address: str
) -> None:
    verifier = VerifierMetrics()
    verifier.verdict_decided("c1", 1)
    verifier.verdict_decided("c1", 1)
    verifier.verdict_decided("c1", 2)
    dcgm_registry = CollectorRegistry()
    tensor = Gauge(DCGM_TENSOR_ACTIVE, "Ratio of cycles the tensor pipes are active.",
                   ["gpu", "UUID", "modelName"], registry=dcgm_registry)  # fmt: skip
    gpu0 = tensor.labels(gpu="0", UUID="GPU-0000", modelName="NVIDIA H200")
    gpu0.set(0.0)
    collector = CollectorMetrics()
    CaptureFeed(collector, "eth1").update(CaptureTotals(1200, 900_000, 3, 4, {"fin": 4}, 0))
    collector.records_appended([record_pb2.CAPTURE_QUALITY_COMPLETE] * 7)
    verifier_server = verifier.serve("127.0.0.1:0")
    collector_server = collector.serve("127.0.0.1:0")
    dcgm_server = serve_metrics(dcgm_registry, "127.0.0.1:0")
    targets = [verifier_server.url, collector_server.url, dcgm_server.url]
    prometheus = PrometheusServer(tmp_path, [*map(hostport, targets), meter_address])
    costs = CostLog.open(tmp_path / "costs")
    try:
        prometheus.wait_ready()
        prometheus.wait_targets_up(4)

        # Tensor pipes 50 % busy for a while, then idle again.
        start = time.time_ns()
        gpu0.set(0.5)
        time.sleep(2.0)
        gpu0.set(0.0)
        end = time.time_ns()
        # CPU: the prover burns BURN_S of CPU.
        cpu_start = time.time_ns()
        assert burner.stdin is not None and burner.stdout is not None
        burner.stdin.write(f"{BURN_S}\n")
        burner.stdin.flush()
        assert burner.stdout.readline().strip() == "burnt"
        cpu_end = time.time_ns()
        time.sleep(5 * SCRAPE_INTERVAL_S)

        async with aiohttp.ClientSession() as session:
            client = PrometheusClient(prometheus.url, session)
            step = ProverQuery(
                DCGM_TENSOR_ACTIVE, SeriesKind.GAUGE, Measure.GPU_TENSOR_ACTIVE, SCRAPE_INTERVAL_S
            )
            dcgm = await measure_prover(client, step, start, end)
            assert dcgm.series == 1
            # 0.5 x the window, give or take a scrape interval of lag at each edge.
            expected = 0.5 * (end - start) / S
            assert dcgm.activity_seconds == pytest.approx(expected, abs=0.5 * 3 * SCRAPE_INTERVAL_S)
            assert dcgm.coverage > 0.9

            cpu_query = ProverQuery(
                PRESETS["cpu"].query, SeriesKind.COUNTER, Measure.CPU_SECONDS, SCRAPE_INTERVAL_S
            )
            pad = 2 * round(SCRAPE_INTERVAL_S * S)
            cpu = await measure_prover(client, cpu_query, cpu_start - pad, cpu_end + pad)
            assert cpu.series == 1
            assert cpu.activity_seconds == pytest.approx(BURN_S, abs=0.25)

            verdicts = await client.query_range(
                'veritap_verifier_verdicts_total{status="pass"}', end, end + S, 1.0
            )
            assert [p.value for p in verdicts[0].points][-1] == 2.0
            now = time.time_ns()
            packets = await client.query_range("veritap_collector_packets_total", now, now, 1.0)
            [series] = packets
            labels = {k: v for k, v in series.labels if k != "instance"}  # instance: a port
            assert labels == {"__name__": "veritap_collector_packets_total", "job": "veritap",
                              "source": "eth1"}  # fmt: skip
            assert series.points[-1].value == 1200.0
            records = await client.query_range(
                'veritap_collector_records_total{quality="complete"}', now, now, 1.0
            )
            assert records[0].points[-1].value == 7.0

            # verifierd's vca gauge: one batch verified the 2 s of tensor activity above at a
            # quarter of the prover's cost per token; Prometheus reads the gauge back.
            costs.append(
                verified_batch(start, end, activity_seconds=0.25 * 0.5 * (end - start) / S)
            )
            config = MetricsConfig(prover_url=prometheus.url, prover="dcgm")
            gauge = VcaGauge(costs.between, client, config, verifier)
            assert gauge.figure() is None
            report = await gauge.refresh()
            [row] = report.rows
            assert row.vca == pytest.approx(4.0, rel=0.5)
            # GetStats' figure is the report's total over all commitments.
            assert report.total is not None
            assert gauge.figure() == VcaFigure(report.total.vca or 0.0, "nvml-gpm")
            time.sleep(5 * SCRAPE_INTERVAL_S)
            now = time.time_ns()
            scraped = await client.query_range(
                'veritap_verifier_vca{commitment="c1"}', now, now, 1.0
            )
            assert scraped[0].points[-1].value == pytest.approx(row.vca)
    finally:
        costs.close()
        prometheus.stop()
        verifier_server.close()
        collector_server.close()
        dcgm_server.close()


def verified_batch(start_ns: int, end_ns: int, *, activity_seconds: float) -> BatchCost:
    return BatchCost(
        batch_id="b1",
        commitment_id="c1",
        method=Method.NVML_GPM,
        start_ns=end_ns,
        end_ns=end_ns + S,
        targets=("gpu0",),
        activity_seconds=activity_seconds,
        sm_seconds=None,
        dram_seconds=None,
        covered_seconds=1.0,
        records=1,
        prompt_tokens=10,
        completion_tokens=100,
        sample_rate=1.0,
        traffic_start_ns=start_ns,
        traffic_end_ns=end_ns,
    )

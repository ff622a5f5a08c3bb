"""The vca gauge: the recent window's VCA per commitment, from the cost log and the prover's
activity read through the Prometheus HTTP API (here a stand-in answering query_range)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import ClientSession, web

from verifierd.config import MetricsConfig
from verifierd.cost_log import BatchCost, CostLog
from verifierd.meter.readings import Method
from verifierd.metrics import VerifierMetrics
from verifierd.services.compute_meter import VcaGauge
from verifierd.vca import PrometheusClient

S = 1_000_000_000
NOW = 1_763_000_000 * S
PROVER_RATE = 4.0  # the prover's activity-seconds per second


@dataclass
class FakePrometheus:
    """query_range answers: a counter growing PROVER_RATE per second, or an error."""

    url: str = ""
    queries: list[str] = field(default_factory=list)
    failing: bool = False

    async def query_range(self, request: web.Request) -> web.Response:
        self.queries.append(request.query["query"])
        if self.failing:
            return web.json_response(
                {"status": "error", "errorType": "bad_data", "error": "nope"}, status=400
            )
        start, end = float(request.query["start"]), float(request.query["end"])
        step = float(request.query["step"])
        values = []
        t = start
        while t <= end + 1e-9:
            values.append([t, str(PROVER_RATE * (t - start))])
            t += step
        series = {"metric": {"__name__": "veritap_prover_activity_seconds_total"}, "values": values}
        data = {"resultType": "matrix", "result": [series]}
        return web.json_response({"status": "success", "data": data})


@pytest.fixture
async def prometheus() -> AsyncIterator[FakePrometheus]:
    fake = FakePrometheus()
    app = web.Application()
    app.router.add_get("/api/v1/query_range", fake.query_range)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    fake.url = f"http://127.0.0.1:{port}"
    yield fake
    await runner.cleanup()


def batch(commitment: str, traffic_end_s: float, *, activity: float, n: int) -> BatchCost:
    end = NOW - round(traffic_end_s * S)
    return BatchCost(
        batch_id=f"{commitment}-{n}",
        commitment_id=commitment,
        method=Method.CPU_SECONDS,
        start_ns=end + S,
        end_ns=end + 2 * S,
        targets=("pid1",),
        activity_seconds=activity,
        sm_seconds=None,
        dram_seconds=None,
        covered_seconds=1.0,
        records=4,
        prompt_tokens=100,
        completion_tokens=1000,
        sample_rate=1.0,
        traffic_start_ns=end - 10 * S,
        traffic_end_ns=end,
    )


async def test_the_gauge_follows_the_recent_window(
    tmp_path: Path, prometheus: FakePrometheus, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = VerifierMetrics()

    def vca(commitment: str) -> float | None:
        labels = {"commitment": commitment, "method": "cpu-seconds"}
        return metrics.registry.get_sample_value("veritap_verifier_vca", labels)

    config = MetricsConfig(prover_url=prometheus.url, vca_window_s=600)
    with CostLog.open(tmp_path / "costs") as costs:
        costs.append(batch("c1", 100, activity=2.0, n=1))  # in the window
        costs.append(batch("c2", 900, activity=2.0, n=2))  # ended before it
        async with ClientSession() as session:
            gauge = VcaGauge(
                costs.between, PrometheusClient(prometheus.url, session), config, metrics
            )
            report = await gauge.refresh(NOW)
            # One commitment in the window: the prover's 10 s of traffic at 4 activity-s/s for
            # 1000 tokens, against 2 CPU-seconds of verification for the same 1000 tokens.
            assert [row.commitment_id for row in report.rows] == ["c1"]
            assert vca("c1") == pytest.approx((PROVER_RATE * 10 / 1000) / (2.0 / 1000), rel=0.05)
            assert vca("c2") is None
            assert prometheus.queries == [
                'veritap_prover_activity_seconds_total{method="cpu-seconds"}'
            ]
            assert gauge.latest is report

            # The prover cannot be read: the gauge is unknown, not stale; said once in the log.
            prometheus.failing = True
            with caplog.at_level(logging.WARNING):
                await gauge.refresh(NOW)
                await gauge.refresh(NOW)
            assert vca("c1") is None
            assert [r.message for r in caplog.records].count("vca gauge: no prover reading") == 1

            # Later, with the batch out of the window, nothing is asked of the prover.
            prometheus.failing = False
            asked = len(prometheus.queries)
            report = await gauge.refresh(NOW + 601 * S)
            assert report.rows == () and vca("c1") is None
            assert len(prometheus.queries) == asked

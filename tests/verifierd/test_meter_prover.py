"""The prover meter: readings exported as Prometheus metrics and answered as range queries."""

from __future__ import annotations

import contextlib

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.verifierd.gpm_simulation import Phase, S, SimulatedGpmGpus, profile_integral
from verifierd.meter.nvml_gpm import GpmSampler
from verifierd.meter.sampling import Meter
from verifierd.prover_meter import (
    ACTIVITY_TOTAL,
    ProverMeter,
    SelectorError,
    parse_selector,
)
from verifierd.vca import (
    PRESETS,
    PrometheusClient,
    ProverQuery,
    SeriesKind,
    VcaError,
    measure_prover,
)

T0 = 1_763_000_000 * S
PROFILE = [
    Phase(1.0, tensor=0.2, sm=0.6, dram=0.8),
    Phase(1.0, tensor=0.9, sm=1.0, dram=0.3),
    Phase(1.0, tensor=0.0, sm=0.0, dram=0.0),
]


def simulated_prover(reads: int = 31) -> ProverMeter:
    """A prover meter over two simulated GPUs that ran PROFILE, sampled at 10 Hz."""
    meter = Meter(GpmSampler(SimulatedGpmGpus(PROFILE, T0, gpus=2)))
    prover = ProverMeter(meter)
    for _ in range(reads):
        meter.tick()
    return prover


def test_metrics_expose_ratios_and_activity_totals() -> None:
    prover = simulated_prover()
    families = {
        f.name: f for f in text_string_to_metric_families(generate_latest(prover.registry).decode())
    }
    total = families["veritap_prover_activity_seconds"]
    assert total.type == "counter"
    by_gpu = {s.labels["target"]: s.value for s in total.samples if s.name == ACTIVITY_TOTAL}
    assert by_gpu == {
        # gpu1 is sampled 20 us after gpu0, so it misses 20 us of the profile's start.
        "gpu0": pytest.approx(profile_integral(PROFILE, 0, 3.0)),
        "gpu1": pytest.approx(profile_integral(PROFILE, 0, 3.0), abs=1e-4),
    }
    assert {s.labels["method"] for s in total.samples} == {"nvml-gpm"}
    ratio = families["veritap_prover_activity_ratio"]
    assert ratio.type == "gauge"
    assert all(s.value == pytest.approx(0.0) for s in ratio.samples)  # the idle last second
    assert "veritap_prover_sm_active_seconds" in families
    assert "veritap_prover_dram_active_ratio" in families
    assert families["veritap_build_info"].samples[0].labels["daemon"] == "prover-meter"


def test_range_queries_follow_prometheus_semantics() -> None:
    prover = simulated_prover()
    series = prover.query_range(ACTIVITY_TOTAL + '{target="gpu0"}', T0, T0 + 3 * S, S)
    assert len(series) == 1
    assert dict(series[0].labels) == {
        "__name__": ACTIVITY_TOTAL,
        "method": "nvml-gpm",
        "target": "gpu0",
    }
    # At T0 no reading has ended yet, so the first point is at T0 + 1 s.
    values = [p.value for p in series[0].points]
    assert values == pytest.approx([0.2, 1.1, 1.1], abs=1e-6)
    assert prover.query_range("veritap_prover_nothing", T0, T0 + S, S) == []
    with pytest.raises(SelectorError):
        prover.query_range("rate(x[1m])", T0, T0 + S, S)
    with pytest.raises(SelectorError, match="points"):
        prover.query_range(ACTIVITY_TOTAL, T0, T0 + 3 * S, 1000)


@given(
    st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,20}", fullmatch=True),
    st.lists(
        st.tuples(
            st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,10}", fullmatch=True),
            st.text(max_size=12),
        ),
        max_size=4,
    ),
)
def test_selectors_round_trip(name: str, matchers: list[tuple[str, str]]) -> None:
    def quote(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"')

    body = ",".join(f'{label}="{quote(value)}"' for label, value in matchers)
    text = f"{name}{{{body}}}" if matchers else name
    assert parse_selector(text) == (name, tuple(matchers))


@given(st.text(max_size=60))
def test_any_text_parses_or_is_refused_cleanly(text: str) -> None:
    with contextlib.suppress(SelectorError):
        parse_selector(text)


async def test_vca_client_reads_the_prover_meter_over_http() -> None:
    prover = simulated_prover()
    async with TestServer(prover.app()) as server, aiohttp.ClientSession() as session:
        client = PrometheusClient(str(server.make_url("")), session)
        start, end = T0 + S, T0 + 3 * S
        counter = await measure_prover(client, PRESETS["nvml-gpm"], start, end)
        assert counter.series == 2
        # Evaluated every second, gpu1's counter (read 20 us after each 100 ms) still shows its
        # 0.9 s value at T0 + 1 s: up to one sampling period of error at a window edge.
        expected = 2 * profile_integral(PROFILE, 1, 3)
        assert counter.activity_seconds == pytest.approx(expected, abs=0.1 * 0.2 + 1e-6)
        assert counter.coverage == pytest.approx(1.0)
        # Fine steps: more points than one request may carry, so the client splits the query.
        gauge = ProverQuery(
            "veritap_prover_activity_ratio", SeriesKind.GAUGE, PRESETS["dcgm"].measure, 0.0001
        )
        sampled = await measure_prover(client, gauge, start, end)
        # A gauge shows each 100 ms mean from the end of its interval on, so integrated it lags
        # by one sampling period: here it takes in 0.1 s of 0.2 activity per GPU before the
        # window instead of its idle last 0.1 s. The counters do not lag.
        assert sampled.activity_seconds == pytest.approx(expected, abs=2 * 0.1 * 0.2 + 1e-3)
        with pytest.raises(VcaError, match="bad_data"):
            await measure_prover(
                client, ProverQuery("sum(x)", SeriesKind.GAUGE, gauge.measure), start, end
            )


async def test_the_http_api_answers_like_prometheus() -> None:
    prover = simulated_prover()
    async with TestClient(TestServer(prover.app())) as http:
        ready = await http.get("/-/ready")
        assert ready.status == 200
        params = {"query": ACTIVITY_TOTAL, "start": T0 / S + 1, "end": T0 / S + 2, "step": "1"}
        body = await (await http.post("/api/v1/query_range", data=params)).json()
        assert body["status"] == "success"
        assert body["data"]["resultType"] == "matrix"
        assert [len(r["values"]) for r in body["data"]["result"]] == [2, 2]
        bad = await http.get("/api/v1/query_range", params={"query": ACTIVITY_TOTAL})
        assert bad.status == 400
        assert (await bad.json())["errorType"] == "bad_data"
        metrics = await http.get("/metrics")
        assert metrics.headers["Content-Type"].startswith("text/plain")
        assert ACTIVITY_TOTAL in await metrics.text()

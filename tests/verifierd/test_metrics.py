"""verifierd's /metrics: every metric exported with its type, labels and values."""

from __future__ import annotations

import os
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from veritap.metrics_http import MetricsAddressError, parse_listen
from veritap.v1 import verifier_pb2

from verifierd.meter.cpu import CpuSampler
from verifierd.meter.readings import Method, Reading
from verifierd.meter.sampling import Meter
from verifierd.metrics import VerifierMetrics, status_label
from verifierd.vca import VcaRow

S = 1_000_000_000


def scrape(url: str) -> dict[str, list[Sample]]:
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    out: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(text):
        if family.name.endswith("_created"):
            continue  # prometheus-client's creation-time companions of counters
        out.setdefault(f"{family.type} {family.name}", []).extend(family.samples)
    return out


def value(samples: list[Sample], name: str, **labels: str) -> float:
    for sample in samples:
        if sample.name == name and sample.labels == labels:
            return float(sample.value)
    raise AssertionError(f"no sample {name}{labels} in {samples}")


def test_every_metric_is_served_with_its_type() -> None:
    metrics = VerifierMetrics()
    metrics.intake_entries.labels(origin="edge-1").inc(5)
    metrics.intake_lag.labels(origin="edge-1").set(3)
    metrics.intake_alerts.labels(origin="edge-1", reason="fork").inc()
    metrics.intake_stopped.labels(origin="edge-1", reason="fork").set(1)
    metrics.backlog.labels(commitment="c1").set(7)
    metrics.backlog_oldest_age.labels(commitment="c1").set(12.5)
    metrics.verdict_decided("c1", verifier_pb2.VERDICT_STATUS_PASS)
    metrics.verdict_decided("c1", verifier_pb2.VERDICT_STATUS_UNVERIFIABLE)
    metrics.engine_loads.labels(commitment="c1", outcome="ok").inc()
    metrics.engine_unloads.labels(commitment="c1", reason="idle").inc()
    metrics.engines_loaded.set(1)
    metrics.engine_load_seconds.labels(commitment="c1").observe(42.0)
    metrics.batch_records.labels(commitment="c1").observe(8)
    metrics.prefill_seconds.labels(commitment="c1").observe(0.3)
    metrics.scoring_seconds.labels(commitment="c1").observe(0.02)
    metrics.batch_activity_seconds.labels(commitment="c1", method="nvml-gpm").inc(1.5)
    metrics.vca.labels(commitment="c1", method="nvml-gpm").set(4.2)
    metrics.record_reading(Reading("gpu0", 0, S // 2, 0.6, sm=0.9, dram=0.4), Method.NVML_GPM)
    metrics.record_reading(Reading("gpu0", S // 2, S, 0.2, sm=0.5, dram=0.1), Method.NVML_GPM)
    server = metrics.serve("127.0.0.1:0")
    try:
        families = scrape(server.url)
    finally:
        server.close()
    p = "veritap_verifier_"
    assert {"gauge veritap_build_info", "counter process_cpu_seconds"} <= set(families)
    assert {family for family in families if p in family} == {
        f"counter {p}intake_entries",
        f"gauge {p}intake_lag_entries",
        f"counter {p}intake_alerts",
        f"gauge {p}intake_stopped",
        f"gauge {p}backlog_records",
        f"gauge {p}backlog_oldest_age_seconds",
        f"gauge {p}awaiting_checkpoint_entries",
        f"counter {p}verdicts",
        f"counter {p}verdicts_superseded",
        f"counter {p}engine_loads",
        f"counter {p}engine_unloads",
        f"gauge {p}engines_loaded",
        f"histogram {p}engine_load_seconds",
        f"histogram {p}batch_records",
        f"histogram {p}prefill_seconds",
        f"histogram {p}scoring_seconds",
        f"gauge {p}meter_method",
        f"gauge {p}activity_ratio",
        f"gauge {p}sm_active_ratio",
        f"gauge {p}dram_active_ratio",
        f"counter {p}activity_seconds",
        f"counter {p}batch_activity_seconds",
        f"gauge {p}vca",
    }
    verdicts = families[f"counter {p}verdicts"]
    labels = {"commitment": "c1", "reason": ""}
    assert value(verdicts, f"{p}verdicts_total", **labels, status="pass") == 1
    assert value(verdicts, f"{p}verdicts_total", **labels, status="unverifiable") == 1
    activity = families[f"counter {p}activity_seconds"]
    # 0.6 for half a second, then 0.2 for half a second.
    assert value(
        activity, f"{p}activity_seconds_total", target="gpu0", method="nvml-gpm"
    ) == pytest.approx(0.4)
    latest = families[f"gauge {p}activity_ratio"]
    assert value(latest, f"{p}activity_ratio", target="gpu0", method="nvml-gpm") == 0.2
    assert value(families[f"gauge {p}sm_active_ratio"], f"{p}sm_active_ratio", target="gpu0") == 0.5
    prefill = families[f"histogram {p}prefill_seconds"]
    assert value(prefill, f"{p}prefill_seconds_count", commitment="c1") == 1
    assert value(families[f"gauge {p}vca"], f"{p}vca", commitment="c1", method="nvml-gpm") == 4.2


def test_the_meter_feeds_the_metrics() -> None:
    metrics = VerifierMetrics()
    meter = Meter(CpuSampler())
    meter.subscribe(metrics.reading_callback(meter))
    meter.targets_for(pids=[os.getpid()])
    meter.tick()
    # Enough CPU to span several of /proc's 10 ms ticks, however busy the machine is.
    start = time.process_time()
    while time.process_time() - start < 0.05:
        sum(i * i for i in range(10_000))
    meter.tick()
    server = metrics.serve("127.0.0.1:0")
    try:
        families = scrape(server.url)
    finally:
        server.close()
    p = "veritap_verifier_"
    method = families[f"gauge {p}meter_method"]
    assert value(method, f"{p}meter_method", method="cpu-seconds") == 1
    target = f"pid{os.getpid()}"
    total = families[f"counter {p}activity_seconds"]
    assert value(total, f"{p}activity_seconds_total", target=target, method="cpu-seconds") > 0


def test_status_labels_and_listen_addresses() -> None:
    assert status_label(verifier_pb2.VERDICT_STATUS_PASS) == "pass"
    assert status_label(verifier_pb2.VERDICT_STATUS_ERROR) == "error"
    assert parse_listen("127.0.0.1:9401") == ("127.0.0.1", 9401)
    assert parse_listen("[::1]:0") == ("::1", 0)
    for bad in ("9401", "::1:9401", "host:http", "host:70000", ":9401"):
        with pytest.raises(MetricsAddressError):
            parse_listen(bad)


def test_serves_on_ipv6_loopback() -> None:
    metrics = VerifierMetrics()
    metrics.engines_loaded.set(2)
    try:
        server = metrics.serve("[::1]:0")
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    try:
        assert server.url.startswith("http://[::1]:")
        families = scrape(server.url)
    finally:
        server.close()
    loaded = families["gauge veritap_verifier_engines_loaded"]
    assert value(loaded, "veritap_verifier_engines_loaded") == 2


def test_only_recomputed_verdicts_have_prefill_and_scoring_time() -> None:
    metrics = VerifierMetrics()
    recomputed = verifier_pb2.Verdict(commitment_id="c1", status=verifier_pb2.VERDICT_STATUS_PASS)
    recomputed.timings.batch_size = 3
    recomputed.timings.prefill_ns = 0  # a share that rounds to nothing is still observed
    recomputed.timings.scoring_ns = 2_000_000
    skipped = verifier_pb2.Verdict(commitment_id="c1", status=verifier_pb2.VERDICT_STATUS_SKIPPED)
    metrics.verdict_stored(recomputed)
    metrics.verdict_stored(skipped)

    def sample(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(f"veritap_verifier_{name}", labels)

    assert sample("verdicts_total", commitment="c1", status="pass", reason="") == 1
    assert sample("verdicts_total", commitment="c1", status="skipped", reason="") == 1
    assert sample("prefill_seconds_count", commitment="c1") == 1
    assert sample("scoring_seconds_count", commitment="c1") == 1
    assert sample("scoring_seconds_sum", commitment="c1") == pytest.approx(0.002)


def test_vca_series_follow_the_report_rows() -> None:
    metrics = VerifierMetrics()

    def row(commitment: str, vca: float | None, method: Method = Method.NVML_GPM) -> VcaRow:
        return VcaRow(commitment, method, 1, 1, 10, 100, 100.0, 1.0, 1.0, 4.0, vca)

    def series() -> dict[tuple[str, str], float]:
        return {
            (s.labels["commitment"], s.labels["method"]): s.value
            for family in metrics.registry.collect()
            if family.name == "veritap_verifier_vca"
            for s in family.samples
        }

    metrics.set_vca([row("c1", 4.0), row("c2", 2.5), row("c3", None)])
    assert series() == {("c1", "nvml-gpm"): 4.0, ("c2", "nvml-gpm"): 2.5}
    metrics.set_vca([row("c1", 5.0), row("c2", None), row("c1", 1.5, Method.CPU_SECONDS)])
    assert series() == {("c1", "nvml-gpm"): 5.0, ("c1", "cpu-seconds"): 1.5}
    metrics.set_vca([])
    assert series() == {}

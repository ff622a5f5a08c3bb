"""The collector's /metrics: every metric exported with its type, labels and values."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families
from veritap.v1 import record_pb2

from collector.metrics import CollectorMetrics, quality_label


def test_every_metric_is_served_with_its_type() -> None:
    metrics = CollectorMetrics()
    metrics.packets.labels(source="eth1").inc(1000)
    metrics.bytes.labels(source="eth1").inc(1_500_000)
    metrics.kernel_drops.labels(source="eth1").inc(3)
    metrics.flows_opened.inc(10)
    metrics.flows_closed.labels(reason="fin").inc(9)
    metrics.flows_active.set(1)
    metrics.record_appended(record_pb2.CAPTURE_QUALITY_COMPLETE, seq=41, appended_at_ns=10**18)
    metrics.record_appended(
        record_pb2.CAPTURE_QUALITY_RESPONSE_GAP, seq=42, appended_at_ns=2 * 10**18
    )
    metrics.checkpoints.inc()
    metrics.checkpoint_size.set(42)
    metrics.subscribers.set(1)
    metrics.streamed_entries.labels(subscriber="verifierd-a").inc(40)
    metrics.stream_lag.labels(subscriber="verifierd-a").set(2)
    server = metrics.serve("127.0.0.1:0")
    try:
        with urllib.request.urlopen(server.url, timeout=5) as response:
            text = response.read().decode()
    finally:
        server.close()
    families = {
        f.name: f
        for f in text_string_to_metric_families(text)
        if not f.name.endswith("_created")  # prometheus-client's creation-time companions
    }
    p = "veritap_collector_"
    assert {name: f.type for name, f in families.items()} == {
        f"{p}packets": "counter",
        f"{p}captured_bytes": "counter",
        f"{p}kernel_drops": "counter",
        f"{p}flows_opened": "counter",
        f"{p}flows_closed": "counter",
        f"{p}flows_active": "gauge",
        f"{p}records": "counter",
        f"{p}log_head_seq": "gauge",
        f"{p}log_head_timestamp_seconds": "gauge",
        f"{p}checkpoints": "counter",
        f"{p}checkpoint_tree_size": "gauge",
        f"{p}subscribers": "gauge",
        f"{p}streamed_entries": "counter",
        f"{p}stream_lag_entries": "gauge",
    }
    records = {
        s.labels["quality"]: s.value
        for s in families[f"{p}records"].samples
        if s.name == f"{p}records_total"
    }
    # Every quality is exported from the start, so rates work before the first gap.
    assert records == {
        "complete": 1,
        "request_gap": 0,
        "response_gap": 1,
        "truncated": 0,
        "midstream": 0,
        "parse_error": 0,
    }
    assert families[f"{p}log_head_seq"].samples[0].value == 42
    assert families[f"{p}log_head_timestamp_seconds"].samples[0].value == 2 * 10**9
    lag = families[f"{p}stream_lag_entries"].samples[0]
    assert (lag.labels, lag.value) == ({"subscriber": "verifierd-a"}, 2)


def test_quality_labels() -> None:
    assert quality_label(record_pb2.CAPTURE_QUALITY_MIDSTREAM) == "midstream"
    assert quality_label(record_pb2.CAPTURE_QUALITY_PARSE_ERROR) == "parse_error"

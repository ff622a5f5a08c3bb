"""The collector's /metrics: every metric exported with its type, labels and values."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from veritap.signing import Signer
from veritap.v1 import record_pb2

from collector.log import Log
from collector.metrics import CaptureFeed, CaptureTotals, CollectorMetrics, quality_label
from collector.pipeline import LogWriter
from tests.collector.log.log_fixtures import ORIGIN, make_record, open_log


def test_every_metric_is_served_with_its_type() -> None:
    metrics = CollectorMetrics()
    metrics.packets.labels(source="eth1").inc(1000)
    metrics.bytes.labels(source="eth1").inc(1_500_000)
    metrics.kernel_drops.labels(source="eth1").inc(3)
    metrics.flows_opened.inc(10)
    metrics.flows_closed.labels(reason="fin").inc(9)
    metrics.flows_active.set(1)
    metrics.records_appended(
        [record_pb2.CAPTURE_QUALITY_COMPLETE, record_pb2.CAPTURE_QUALITY_RESPONSE_GAP]
    )
    metrics.log_committed(42, at_ns=2 * 10**18)
    metrics.checkpoint_written(42)
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
    assert families["veritap_build_info"].samples[0].labels["daemon"] == "collector"
    assert "process_cpu_seconds" in families  # veritap.runtime_metrics, tested there
    assert {name: f.type for name, f in families.items() if name.startswith(p)} == {
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
        "ambiguous": 0,
    }
    assert families[f"{p}log_head_seq"].samples[0].value == 42
    assert families[f"{p}log_head_timestamp_seconds"].samples[0].value == 2 * 10**9
    lag = families[f"{p}stream_lag_entries"].samples[0]
    assert (lag.labels, lag.value) == ({"subscriber": "verifierd-a"}, 2)


def test_quality_labels() -> None:
    assert quality_label(record_pb2.CAPTURE_QUALITY_MIDSTREAM) == "midstream"
    assert quality_label(record_pb2.CAPTURE_QUALITY_PARSE_ERROR) == "parse_error"


def sample(metrics: CollectorMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value("veritap_collector_" + name, labels)


def totals(
    packets: int, drops: int, opened: int, closed: dict[str, int], active: int
) -> CaptureTotals:
    return CaptureTotals(packets, packets * 100, drops, opened, closed, active)


def test_capture_feed_moves_counters_by_the_difference_of_running_totals() -> None:
    metrics = CollectorMetrics()
    feed = CaptureFeed(metrics, "eth1")
    feed.update(totals(10, 2, 3, {"fin": 1}, 2))
    feed.update(totals(25, 2, 5, {"fin": 2, "rst": 1}, 2))
    assert sample(metrics, "packets_total", source="eth1") == 25
    assert sample(metrics, "captured_bytes_total", source="eth1") == 2500
    assert sample(metrics, "kernel_drops_total", source="eth1") == 2
    assert sample(metrics, "flows_opened_total") == 5
    assert sample(metrics, "flows_closed_total", reason="fin") == 2
    assert sample(metrics, "flows_closed_total", reason="rst") == 1
    assert sample(metrics, "flows_active") == 2
    # The kernel's PACKET_STATISTICS total grows: only the new drops are added.
    feed.update(totals(30, 7, 5, {"fin": 2, "rst": 1}, 0))
    assert sample(metrics, "kernel_drops_total", source="eth1") == 7
    assert sample(metrics, "flows_active") == 0
    # A source that starts over counts from zero again; the counters never go down.
    feed.update(totals(4, 1, 1, {}, 1))
    assert sample(metrics, "packets_total", source="eth1") == 34
    assert sample(metrics, "kernel_drops_total", source="eth1") == 8
    other = CaptureFeed(metrics, "eth2")
    other.update(totals(1, 0, 0, {}, 1))
    assert sample(metrics, "packets_total", source="eth2") == 1


def test_the_log_writer_counts_records_by_quality_and_the_log_moves_head_and_checkpoints(
    tmp_path: Path,
) -> None:
    metrics = CollectorMetrics()
    log = open_log(tmp_path / "log", Signer.generate(ORIGIN), checkpoint_every=4)
    metrics.watch_log(log)
    writer = LogWriter(log, batch_records=3, batch_delay_s=0.0, metrics=metrics)
    qualities = [record_pb2.CAPTURE_QUALITY_COMPLETE] * 7 + [record_pb2.CAPTURE_QUALITY_MIDSTREAM]
    for i, quality in enumerate(qualities):
        record = make_record(i)
        record.quality = quality
        writer.put(record)
    writer.close()
    assert (writer.appended, writer.error) == (8, None)
    assert sample(metrics, "records_total", quality="complete") == 7
    assert sample(metrics, "records_total", quality="midstream") == 1
    assert sample(metrics, "records_total", quality="response_gap") == 0
    assert sample(metrics, "log_head_seq") == 8
    stamp = sample(metrics, "log_head_timestamp_seconds")
    assert stamp is not None and abs(stamp - time.time()) < 600
    log.close()  # signs a last checkpoint when the newest is behind the head
    stats = Log.open_readonly(tmp_path / "log").stats()
    assert sample(metrics, "checkpoints_total") == stats.checkpoints >= 2
    assert sample(metrics, "checkpoint_tree_size") == stats.last_checkpoint_size == 8


def test_a_reader_moves_the_head_stamp_only_when_the_head_moves() -> None:
    metrics = CollectorMetrics()
    metrics.log_read(5, 4)
    first = sample(metrics, "log_head_timestamp_seconds")
    metrics.log_head_timestamp.set(1.0)  # as if long ago
    metrics.log_read(5, 5)
    assert sample(metrics, "log_head_timestamp_seconds") == 1.0
    assert (sample(metrics, "log_head_seq"), sample(metrics, "checkpoint_tree_size")) == (5, 5)
    metrics.log_read(6, 5)
    assert sample(metrics, "log_head_timestamp_seconds") == pytest.approx(first, abs=600)
    assert sample(metrics, "checkpoints_total") == 0  # a reader writes none


def test_serve_configured_empty_and_taken() -> None:
    metrics = CollectorMetrics()
    assert metrics.serve_configured("") is None
    holder = metrics.serve("127.0.0.1:0")
    try:
        taken = holder.url.removeprefix("http://").removesuffix("/metrics")
        assert CollectorMetrics().serve_configured(taken) is None
    finally:
        holder.close()

"""The collector's Prometheus metrics: one registry, one object per metric, served at /metrics.

`METRICS` is the daemon's instance: capture, reassembly, the log and the LedgerService
increment its attributes directly (`METRICS.packets.labels(source="eth1").inc(n)`), and the
daemon serves it with `METRICS.serve(address)`. Tests make their own `CollectorMetrics()`.

Counters only go up: where the source is itself a running total (the kernel's
PACKET_STATISTICS drop count), increment by the difference since the last read. Label values
are short lower-case words (`quality="response_gap"`).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge
from veritap.metrics_http import MetricsServer, serve_metrics
from veritap.v1 import record_pb2

_PREFIX = "veritap_collector_"


def quality_label(quality: int) -> str:
    """`CAPTURE_QUALITY_RESPONSE_GAP` (3) -> "response_gap"."""
    name = record_pb2.CaptureQuality.Name(quality)  # type: ignore[arg-type]
    return name.removeprefix("CAPTURE_QUALITY_").lower()


class CollectorMetrics:
    """Every metric the collector exports. Attributes are prometheus-client metric objects."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = CollectorRegistry() if registry is None else registry
        r = self.registry
        self.packets = Counter(
            _PREFIX + "packets",
            "Packets read from a capture source.",
            ["source"],
            registry=r,
        )
        self.bytes = Counter(
            _PREFIX + "captured_bytes",
            "Bytes of the packets read from a capture source (as captured, link layer included).",
            ["source"],
            registry=r,
        )
        self.kernel_drops = Counter(
            _PREFIX + "kernel_drops",
            "Packets the kernel dropped before the collector read them (AF_PACKET tp_drops; "
            "incremented by the difference since the previous read).",
            ["source"],
            registry=r,
        )
        self.flows_opened = Counter(
            _PREFIX + "flows_opened",
            "TCP connections the reassembler started following.",
            registry=r,
        )
        self.flows_closed = Counter(
            _PREFIX + "flows_closed",
            "TCP connections the reassembler stopped following, by why (fin, rst, idle, memory).",
            ["reason"],
            registry=r,
        )
        self.flows_active = Gauge(
            _PREFIX + "flows_active",
            "TCP connections being reassembled now.",
            registry=r,
        )
        self.records = Counter(
            _PREFIX + "records",
            "Inference records appended to the log, by capture quality.",
            ["quality"],
            registry=r,
        )
        self.log_head_seq = Gauge(
            _PREFIX + "log_head_seq",
            "Sequence number of the newest entry in the signed log.",
            registry=r,
        )
        self.log_head_timestamp = Gauge(
            _PREFIX + "log_head_timestamp_seconds",
            "When the newest log entry was appended (Unix time).",
            registry=r,
        )
        self.checkpoints = Counter(
            _PREFIX + "checkpoints",
            "Signed checkpoints of the log written.",
            registry=r,
        )
        self.checkpoint_size = Gauge(
            _PREFIX + "checkpoint_tree_size",
            "Tree size of the newest signed checkpoint.",
            registry=r,
        )
        self.subscribers = Gauge(
            _PREFIX + "subscribers",
            "Verifiers streaming the log now.",
            registry=r,
        )
        self.streamed_entries = Counter(
            _PREFIX + "streamed_entries",
            "Log entries sent to a subscriber.",
            ["subscriber"],
            registry=r,
        )
        self.stream_lag = Gauge(
            _PREFIX + "stream_lag_entries",
            "Entries a subscriber has not acknowledged yet (log head seq - acknowledged seq).",
            ["subscriber"],
            registry=r,
        )
        for quality in record_pb2.CaptureQuality.values():
            if quality != record_pb2.CAPTURE_QUALITY_UNSPECIFIED:
                self.records.labels(quality=quality_label(quality))

    def record_appended(self, quality: int, seq: int, appended_at_ns: int) -> None:
        """Count one appended record and move the log head."""
        self.records.labels(quality=quality_label(quality)).inc()
        self.log_head_seq.set(seq)
        self.log_head_timestamp.set(appended_at_ns / 1e9)

    def serve(self, address: str) -> MetricsServer:
        """Serve this registry at http://ADDRESS/metrics (port 0: any free port)."""
        return serve_metrics(self.registry, address)


#: The daemon's metrics (one registry per process).
METRICS = CollectorMetrics()

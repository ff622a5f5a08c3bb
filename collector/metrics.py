"""The collector's Prometheus metrics: one registry, one object per metric, served at /metrics.

`METRICS` is the daemon's instance, fed by the code that owns each event:

- capture and reassembly: `collector run`'s capture loop hands a `CaptureTotals` (the running
  totals it already reads for its stats log) to a `CaptureFeed` at every
  `capture.stats_interval_s`, which moves the counters by the difference since the last one
  (packets, bytes, kernel drops, flows opened and closed) -- nothing is added per packet;
- the log: `LogWriter` calls `records_appended` after each group commit; the log's commit and
  checkpoint listeners call `log_committed` and `checkpoint_written` (`watch_log`); `collector
  serve`, which only reads the log, sets the head gauges from its polls (`log_read`);
- the LedgerService: subscribers, entries streamed per batch and each subscriber's lag;
- the process: `veritap_build_info`, `process_*` and `python_info` (veritap.runtime_metrics).

The daemon serves it with `METRICS.serve(address)` (`[metrics] listen`). Tests make their own
`CollectorMetrics()`. Label values are short lower-case words (`quality="response_gap"`).
"""

from __future__ import annotations

import logging
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge
from veritap.metrics_http import MetricsServer, serve_metrics
from veritap.runtime_metrics import register_runtime_metrics
from veritap.v1 import record_pb2

log = logging.getLogger(__name__)

_PREFIX = "veritap_collector_"


class WatchedLog(Protocol):
    """What `watch_log` needs of the log (collector.log.Log)."""

    def add_commit_listener(self, callback: Callable[[int], None]) -> None: ...
    def add_checkpoint_listener(self, callback: Callable[[int], None]) -> None: ...


@dataclass(frozen=True)
class CaptureTotals:
    """Running totals of one capture source since it opened, as the capture loop reads them."""

    packets: int
    captured_bytes: int
    #: The kernel's PACKET_STATISTICS drops, accumulated (`LiveCapture.stats()`).
    kernel_drops: int
    flows_opened: int
    #: Flows closed so far, by reason (`ReassemblyStats.close_reasons`).
    flows_closed: Mapping[str, int]
    flows_active: int


class CaptureFeed:
    """Moves the capture counters of one source by the difference between successive totals
    (counters only go up; a total that went down -- a restarted source -- counts from zero)."""

    def __init__(self, metrics: CollectorMetrics, source: str) -> None:
        self.metrics = metrics
        self.source = source
        self._last = CaptureTotals(0, 0, 0, 0, {}, 0)

    def update(self, totals: CaptureTotals) -> None:
        m, last, labels = self.metrics, self._last, {"source": self.source}
        m.packets.labels(**labels).inc(_increase(last.packets, totals.packets))
        m.bytes.labels(**labels).inc(_increase(last.captured_bytes, totals.captured_bytes))
        m.kernel_drops.labels(**labels).inc(_increase(last.kernel_drops, totals.kernel_drops))
        m.flows_opened.inc(_increase(last.flows_opened, totals.flows_opened))
        for reason, count in totals.flows_closed.items():
            closed = _increase(last.flows_closed.get(reason, 0), count)
            if closed:
                m.flows_closed.labels(reason=reason).inc(closed)
        m.flows_active.set(totals.flows_active)
        self._last = CaptureTotals(
            totals.packets,
            totals.captured_bytes,
            totals.kernel_drops,
            totals.flows_opened,
            dict(totals.flows_closed),
            totals.flows_active,
        )


def _increase(before: int, now: int) -> int:
    return now - before if now >= before else now


def quality_label(quality: int) -> str:
    """`CAPTURE_QUALITY_RESPONSE_GAP` (3) -> "response_gap"."""
    name = record_pb2.CaptureQuality.Name(quality)  # type: ignore[arg-type]
    return name.removeprefix("CAPTURE_QUALITY_").lower()


class CollectorMetrics:
    """Every metric the collector exports. Attributes are prometheus-client metric objects."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = CollectorRegistry() if registry is None else registry
        r = self.registry
        register_runtime_metrics(r, "collector")
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
            "TCP connections the reassembler stopped following, by why "
            "(fin, rst, idle, evicted, reused, shutdown).",
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
        self._read_head: int | None = None
        # Every quality is exported from the start, so rates work before the first gap.
        self._records_by_quality: dict[int, Counter] = {
            quality: self.records.labels(quality=quality_label(quality))
            for quality in record_pb2.CaptureQuality.values()
            if quality != record_pb2.CAPTURE_QUALITY_UNSPECIFIED
        }

    def records_appended(self, qualities: Iterable[int]) -> None:
        """Count one group commit's records (their `quality` values), one inc per quality."""
        for quality, n in Tally(qualities).items():
            child = self._records_by_quality.get(quality)
            if child is None:
                child = self._records_by_quality[quality] = self.records.labels(
                    quality=quality_label(quality)
                )
            child.inc(n)

    def log_committed(self, head_seq: int, at_ns: int | None = None) -> None:
        """The log's head moved to `head_seq` (a commit listener: writer thread)."""
        self.log_head_seq.set(head_seq)
        self.log_head_timestamp.set((time.time_ns() if at_ns is None else at_ns) / 1e9)

    def checkpoint_written(self, tree_size: int) -> None:
        """A signed checkpoint of `tree_size` entries was committed."""
        self.checkpoints.inc()
        self.checkpoint_size.set(tree_size)

    def watch_log(self, log: WatchedLog) -> None:
        """Feed the head and checkpoint metrics from a writable log's listeners."""
        log.add_commit_listener(self.log_committed)
        log.add_checkpoint_listener(self.checkpoint_written)

    def log_read(self, head_seq: int, checkpoint_size: int) -> None:
        """A reader's view of the log (`collector serve` polls it): the head gauges move when
        the head does, so the timestamp is when this process first saw that head."""
        if head_seq != self._read_head:
            self._read_head = head_seq
            self.log_committed(head_seq)
        self.checkpoint_size.set(checkpoint_size)

    def serve(self, address: str) -> MetricsServer:
        """Serve this registry at http://ADDRESS/metrics (port 0: any free port)."""
        return serve_metrics(self.registry, address)

    def serve_configured(self, listen: str) -> MetricsServer | None:
        """`[metrics] listen`: "" serves nothing; a taken port is logged and the metrics are
        still kept, so a second daemon on the host runs on without its endpoint."""
        if not listen:
            return None
        try:
            return self.serve(listen)
        except OSError as exc:
            log.warning("metrics kept but not served", extra={"listen": listen, "reason": str(exc)})
            return None


#: The daemon's metrics (one registry per process).
METRICS = CollectorMetrics()

"""Frames in, inference records out: decoder -> reassembler -> HTTP -> dialects -> records.

`CapturePipeline` is the sans-IO glue (the caller reads frames from a file or a
socket and decides what to do with the records); it never dies on a bad
packet: an exception while handling one frame is counted in
`internal_errors`, logged, and the next frame goes on. An exchange whose record
cannot be built is counted there too, and still becomes a (parse_error) record.
A differing copy of bytes whose record was already written becomes an amendment
record (`RecordBuilder.amendment`), logged as a warning with the ids it names.
`LogWriter` is the thin shell that moves records into the log's group commit
from its own thread.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from veritap.v1 import record_pb2

from collector.capture.decode import DecodeStats, FrameDecoder
from collector.config import CollectorConfig
from collector.dialects import DialectRegistry
from collector.http.exchange import Connection, HttpStats
from collector.http.messages import Exchange, LateAmbiguity
from collector.records import RecordBuilder
from collector.tcp_reassembly import FlowInfo, Reassembler, ReassemblyStats

if TYPE_CHECKING:  # the daemon's metrics (prometheus_client): `replay` counts none
    from collector.metrics import CollectorMetrics

logger = logging.getLogger(__name__)

RecordSink = Callable[[record_pb2.InferenceRecord], None]


@dataclass(frozen=True)
class PipelineSummary:
    """Totals of one pipeline run (what `collector replay` prints)."""

    frames: int
    captured_bytes: int
    decode: DecodeStats
    reassembly: ReassemblyStats
    http: HttpStats
    records: int
    records_by_quality: dict[str, int]
    internal_errors: int
    kernel_drops: int = 0

    def report(self, elapsed: float, cpu: float, appended: int, failed: int) -> str:
        """The end-of-run summary the commands print."""
        r = self.reassembly
        d = self.decode
        qualities = ", ".join(f"{k} {v}" for k, v in sorted(self.records_by_quality.items()))
        rate = self.records / elapsed if elapsed else 0.0
        throughput = self.captured_bytes / 1e6 / elapsed if elapsed else 0.0
        lines = [
            f"packets         {self.frames} ({self.captured_bytes / 1e6:.1f} MB)",
            f"tcp segments    {d.segments} (not tcp/ip: {d.non_ip + d.non_tcp}, "
            f"fragments {d.ip_fragments}, malformed {d.malformed})",
            f"flows           {r.flows_opened} (midstream directions {r.midstream_directions})",
            f"records         {self.records} ({qualities or 'none'})",
            f"appended        {appended}" + (f" (failed {failed})" if failed else ""),
            f"not recorded    {self.http.not_recorded} exchanges on unknown paths",
            f"gaps            {r.gaps} ({r.gap_bytes} bytes), "
            f"conflicting overlaps {r.overlap_conflicts} "
            f"({self.http.late_ambiguities} after their record)",
            f"not trusted     bad checksums {d.bad_ip_checksum + d.bad_tcp_checksum}, "
            f"bad IP lengths {d.bad_length}, TTL changes {r.ttl_departures}, ignored "
            f"RST {r.ignored_resets} FIN {r.ignored_fins} SYN {r.ignored_syns}, "
            f"out of window {r.out_of_window_segments}, fragment conflicts "
            f"{d.fragment_conflicts}",
            f"drops           kernel {self.kernel_drops}, late segments {r.late_segments}, "
            f"memory cap hits {r.memory_cap_hits}, internal errors {self.internal_errors}",
            f"rate            {rate:.0f} records/s, {throughput:.1f} MB/s, "
            f"{elapsed:.2f} s ({cpu:.2f} s CPU)",
        ]
        return "\n".join(lines) + "\n"


@dataclass(slots=True)
class _Counts:
    frames: int = 0
    captured_bytes: int = 0
    internal_errors: int = 0
    decoders: dict[int, FrameDecoder] = field(default_factory=dict)


class CapturePipeline:
    """One capture's worth of state; feed frames in capture order."""

    def __init__(self, config: CollectorConfig, sink: RecordSink) -> None:
        self._sink = sink
        self._checksums = config.capture.checksums
        self._fragment_limits = config.capture.fragment_limits()
        self._counts = _Counts()
        self._http_limits = config.http.limits()
        self._dialects = DialectRegistry(config.http.dialects, config.http.dialect_path_prefixes)
        self._builder = RecordBuilder(config.origin, self._dialects)
        self.http_stats = HttpStats()
        self.reassembler = Reassembler(
            self._connection, config.reassembly.limits(config.capture.server_ports)
        )

    def _connection(self, flow: FlowInfo) -> Connection:
        return Connection(
            flow,
            self._http_limits,
            self._dialects.records,
            self._exchange,
            self.http_stats,
            late=self._late_ambiguity,
        )

    def _exchange(self, exchange: Exchange) -> str:
        record = self._builder.build(exchange)
        self._sink(record)
        return record.record_id

    def _late_ambiguity(self, late: LateAmbiguity) -> None:
        record = self._builder.amendment(late)
        logger.warning(
            "bytes already recorded arrived in another version: amendment record written",
            extra={"amendment": record.record_id, "records": ",".join(late.record_ids)},
        )
        self._sink(record)

    def frame(self, ts_ns: int, linktype: int, data: bytes, vlans: tuple[int, ...] = ()) -> None:
        """Handle one captured frame."""
        counts = self._counts
        counts.frames += 1
        counts.captured_bytes += len(data)
        try:
            decoder = counts.decoders.get(linktype)
            if decoder is None:
                decoder = counts.decoders[linktype] = FrameDecoder(
                    linktype, self._checksums, self._fragment_limits
                )
            segment = decoder.decode(ts_ns, data, vlans)
            if segment is not None:
                self.reassembler.receive(segment)
        except Exception:
            counts.internal_errors += 1
            logger.exception(
                "frame dropped after an internal error",
                extra={"frame": counts.frames, "ts_ns": ts_ns, "linktype": linktype},
            )

    def advance(self, now_ns: int) -> None:
        """Apply time-based rules when no frame arrives (live capture's idle ticks)."""
        try:
            self.reassembler.advance(now_ns)
        except Exception:
            self._counts.internal_errors += 1
            logger.exception("timeout sweep failed")

    def finish(self) -> None:
        """End every flow (end of file, shutdown): everything in flight becomes records."""
        try:
            self.reassembler.flush()
        except Exception:
            self._counts.internal_errors += 1
            logger.exception("flush failed")

    def summary(self, kernel_drops: int = 0) -> PipelineSummary:
        counts = self._counts
        decode = DecodeStats()
        for decoder in counts.decoders.values():
            for name in DecodeStats.__slots__:
                setattr(decode, name, getattr(decode, name) + getattr(decoder.stats, name))
        return PipelineSummary(
            frames=counts.frames,
            captured_bytes=counts.captured_bytes,
            decode=decode,
            reassembly=self.reassembler.stats,
            http=self.http_stats,
            records=self._builder.stats.records,
            records_by_quality=dict(self._builder.stats.by_quality),
            internal_errors=counts.internal_errors + self._builder.stats.failed,
            kernel_drops=kernel_drops,
        )


class RecordLog(Protocol):
    """What `LogWriter` needs of the log: a durable group commit."""

    def append_many(self, records: Sequence[record_pb2.InferenceRecord]) -> list[int]: ...


class LogWriter:
    """Moves records into the log in batches from a background thread.

    `put` blocks when `max_pending` records wait (backpressure reaches the
    capture loop, whose kernel ring then absorbs or drops — and counts).
    With `metrics`, each appended batch is counted there by capture quality.
    """

    def __init__(
        self,
        log: RecordLog,
        *,
        batch_records: int = 256,
        batch_delay_s: float = 0.05,
        max_pending: int = 8192,
        metrics: CollectorMetrics | None = None,
    ) -> None:
        self._log = log
        self._metrics = metrics
        self._batch = batch_records
        self._delay = batch_delay_s
        self._queue: queue.Queue[record_pb2.InferenceRecord | None] = queue.Queue(max_pending)
        self.appended = 0
        self.failed = 0
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="log-batcher", daemon=True)
        self._thread.start()

    def put(self, record: record_pb2.InferenceRecord) -> None:
        self._queue.put(record)

    def close(self) -> None:
        """Write what is queued, then stop."""
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        closing = False
        while not closing:
            first = self._queue.get()
            if first is None:
                break
            batch = [first]
            while len(batch) < self._batch:
                try:
                    if self._delay > 0:
                        item = self._queue.get(timeout=self._delay)
                    else:
                        item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    closing = True
                    break
                batch.append(item)
            try:
                self._log.append_many(batch)
                self.appended += len(batch)
                if self._metrics is not None:
                    self._metrics.records_appended(record.quality for record in batch)
            except Exception as exc:
                self.failed += len(batch)
                self.error = exc
                logger.exception("log append failed", extra={"records": len(batch)})

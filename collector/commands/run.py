"""`collector run --config collector.toml`: capture live traffic into the log until SIGTERM.

The LedgerService serves the log as it grows, and Prometheus metrics are served at
`[metrics] listen` (capture counters move every `capture.stats_interval_s`; records, the log
head and checkpoints as they are committed). A taken metrics port is logged, not fatal.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from veritap.config_schema import ConfigError
from veritap.signing import KeyFormatError, Signer
from veritap.v1 import ledger_pb2

from appliance.command_line import EXIT_CONFIG, apply_log_level
from appliance.sd_notify import Notifier
from collector.capture.errors import CaptureError
from collector.capture.gc_tuning import tuned_for_capture
from collector.capture.live import KernelStats, LiveCapture
from collector.config import CollectorConfig, load_config
from collector.ledger.errors import LedgerError
from collector.log import Log, LogError
from collector.log.append_retry import RetryingAppend
from collector.pipeline import CapturePipeline, LogWriter, PipelineSummary

if TYPE_CHECKING:
    from appliance.watchdog import Watchdog
    from collector.metrics import CaptureFeed, CaptureTotals

logger = logging.getLogger(__name__)
READ_TIMEOUT_S = 0.2


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "run",
        help="capture live traffic into the log",
        description=(
            "Capture the API traffic on an interface (AF_PACKET), turn every exchange into a "
            "record and append it to the log; SIGTERM or SIGINT flush and close cleanly."
        ),
    )
    parser.add_argument("--config", type=Path, help="collector TOML file (defaults otherwise)")
    parser.add_argument("--interface", help="override capture.interface")
    parser.add_argument("--log", type=Path, metavar="DIR", help="override log.path")
    parser.add_argument("--key", type=Path, help="override log.key")
    parser.set_defaults(func=run)


def _config(args: argparse.Namespace) -> CollectorConfig:
    config = load_config(args.config)
    if args.interface:
        config = replace(config, capture=replace(config.capture, interface=args.interface))
    if args.log:
        config = replace(config, log=replace(config.log, path=args.log))
    if args.key:
        config = replace(config, log=replace(config.log, key=args.key))
    return config


def run(args: argparse.Namespace) -> int:
    # The daemon's own machinery (gRPC, asyncio, prometheus_client) is imported here: every
    # `collector` command is parsed with this module loaded, and `replay` needs none of it.
    from appliance.watchdog import Watchdog
    from collector.ledger.server import LedgerServiceThread
    from collector.metrics import METRICS, CaptureFeed

    try:
        config = _config(args)
    except ConfigError as exc:
        print(f"collector run: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    apply_log_level(args, config.log.level.number)
    if not config.log.key.exists():
        print(
            f"collector run: no signing key at {config.log.key}; create one with "
            f"`collector keygen --name {config.origin} --out {config.log.key}`",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    try:
        signer = Signer.load(config.log.key)
        log = Log.open(config.log.path, origin=config.origin, signer=signer)
    except (KeyFormatError, LogError, OSError) as exc:
        print(f"collector run: {exc}", file=sys.stderr)
        return 2
    try:
        capture = _open_capture(config)
    except CaptureError as exc:
        log.close()
        print(f"collector run: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        logger.info("stopping", extra={"signal": signum})
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    METRICS.log_read(log.head().seq, log.stats().last_checkpoint_size)
    METRICS.watch_log(log)
    writer = LogWriter(
        RetryingAppend(log),
        batch_records=config.log.batch_records,
        batch_delay_s=config.log.batch_delay_s,
        metrics=METRICS,
    )
    pipeline = CapturePipeline(config, writer.put)
    snapshot = CaptureSnapshot()
    ledger = LedgerServiceThread(
        log, config.ledger, log_dir=config.log.path, stats_provider=snapshot.get
    )
    try:
        port = ledger.start()
    except LedgerError as exc:
        writer.close()
        capture.close()
        log.close()
        print(f"collector run: {exc}", file=sys.stderr)
        return 2
    metrics_server = METRICS.serve_configured(config.metrics.listen)
    feed = CaptureFeed(METRICS, config.capture.interface)
    started, cpu_started = time.perf_counter(), time.process_time()
    notifier = Notifier.from_env()
    status = f"capturing on {config.capture.interface}; ledger on port {port}"
    if metrics_server is not None:
        status += f"; metrics at {metrics_server.url}"
    print(f"collector: {status}", file=sys.stderr, flush=True)
    notifier.ready(status=status)
    try:
        with tuned_for_capture():
            _capture_loop(
                config,
                capture,
                pipeline,
                writer,
                stop,
                watchdog=Watchdog.from_env(notifier),
                snapshot=snapshot,
                feed=feed,
            )
    finally:
        notifier.stopping(status="flushing flows into the log")
        ledger.stop()
        pipeline.finish()
        writer.close()
        drops = capture.stats().drops
        capture.close()
        log.close()
        if metrics_server is not None:
            metrics_server.close()
    if writer.error is not None:
        _fail_loudly(writer)
    summary = pipeline.summary(kernel_drops=drops)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    sys.stdout.write(summary.report(elapsed, cpu, writer.appended, writer.failed))
    return 0 if writer.error is None else 1


def _fail_loudly(writer: LogWriter) -> None:
    """Say why capture stops: the exit status (1) then makes systemd restart the collector."""
    message = f"capture stopped: the log cannot be appended ({writer.error})"
    logger.error(message, extra={"failed_records": writer.failed, "appended": writer.appended})
    print(f"collector run: {message}", file=sys.stderr, flush=True)


def _open_capture(config: CollectorConfig) -> LiveCapture:
    c = config.capture
    return LiveCapture(
        c.interface,
        bpf_filter=c.filter,
        promiscuous=c.promiscuous,
        snaplen=c.snaplen,
        fanout_group=c.fanout_group,
        block_bytes=c.ring_block_bytes,
        blocks=c.ring_blocks,
    )


def _capture_loop(
    config: CollectorConfig,
    capture: LiveCapture,
    pipeline: CapturePipeline,
    writer: LogWriter,
    stop: threading.Event,
    *,
    watchdog: Watchdog,
    snapshot: CaptureSnapshot,
    feed: CaptureFeed,
) -> None:
    """Read, decode and record until `stop` or until the log cannot be appended any more
    (the writer retries a failed append with back-off first; see `RetryingAppend`); pings
    the systemd watchdog from this loop."""
    linktype = capture.linktype
    frame = pipeline.frame
    next_stats = time.monotonic() + config.capture.stats_interval_s
    while not stop.is_set() and writer.error is None:
        frames = capture.read(READ_TIMEOUT_S)
        for ts, data, vlans in frames:
            frame(ts, linktype, data, vlans)
        if not frames:
            pipeline.advance(time.time_ns())
        watchdog.tick()
        if time.monotonic() >= next_stats:
            next_stats = time.monotonic() + config.capture.stats_interval_s
            kernel = capture.stats()
            summary = pipeline.summary(kernel_drops=kernel.drops)
            open_flows = pipeline.reassembler.open_flows
            snapshot.publish(summary, kernel, open_flows=open_flows)
            feed.update(capture_totals(summary, kernel.drops, open_flows))
            logger.info(
                "capture stats",
                extra={
                    "packets": summary.frames,
                    "kernel_packets": kernel.packets,
                    "kernel_drops": kernel.drops,
                    "records": summary.records,
                    "appended": writer.appended,
                    "open_flows": open_flows,
                    "gaps": summary.reassembly.gaps,
                    "internal_errors": summary.internal_errors,
                },
            )


def capture_totals(summary: PipelineSummary, kernel_drops: int, open_flows: int) -> CaptureTotals:
    from collector.metrics import CaptureTotals

    r = summary.reassembly
    return CaptureTotals(
        packets=summary.frames,
        captured_bytes=summary.captured_bytes,
        kernel_drops=kernel_drops,
        flows_opened=r.flows_opened,
        flows_closed=r.close_reasons,
        flows_active=open_flows,
    )


class CaptureSnapshot:
    """Capture counters for GetStatus, published by the capture loop at each stats interval.

    The ledger service answers from its own thread; it reads the last published
    message rather than the pipeline's live state.
    """

    def __init__(self) -> None:
        self._stats = ledger_pb2.CaptureStats()

    def publish(self, summary: PipelineSummary, kernel: KernelStats, *, open_flows: int) -> None:
        r = summary.reassembly
        self._stats = ledger_pb2.CaptureStats(
            packets=summary.frames,
            bytes=summary.captured_bytes,
            kernel_drops=kernel.drops,
            kernel_packets=kernel.packets,
            flows_open=open_flows,
            flows_total=r.flows_opened,
            gaps=r.gaps,
            memory_cap_hits=r.memory_cap_hits,
            records_by_quality=summary.records_by_quality,
            unknown_paths=summary.http.not_recorded,
        )

    def get(self) -> ledger_pb2.CaptureStats:
        return self._stats

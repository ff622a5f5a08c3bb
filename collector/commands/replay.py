"""`collector replay FILE --log DIR`: run a pcap/pcapng file through the capture pipeline.

The file is read the way `collector run` captures: the same BPF filter (`[capture]
filter`, or `--filter`) decides which packets are read and the same server ports
(`[capture] server_ports`, or `--server-port`) say which side of a connection
picked up midway is the server. A damaged or cut file (what a killed tcpdump
leaves) stops the replay where the damage is: everything read before it still
becomes records, the summary says where it stopped, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from veritap.config_schema import ConfigError
from veritap.signing import KeyFormatError, Signer

from collector.capture.errors import CaptureError
from collector.capture.frame_filter import FrameFilter
from collector.capture.gc_tuning import tuned_for_capture
from collector.capture.pcap_file import CaptureReader, open_capture
from collector.config import CollectorConfig, load_config
from collector.log import Log, LogError
from collector.pipeline import CapturePipeline, LogWriter, PipelineSummary

if TYPE_CHECKING:
    from rich.progress import Progress

logger = logging.getLogger(__name__)

PROGRESS_MIN_BYTES = 16 * 1024 * 1024
DEFAULT_KEY_NAME = "collector.key"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "replay",
        help="replay a capture file into the log",
        description=(
            "Read a pcap or pcapng file through reassembly, HTTP and the API dialects, and "
            "append one record per exchange to the log in DIR (created when absent). Packets "
            "are filtered and flows oriented as `collector run` would."
        ),
    )
    parser.add_argument("file", type=Path, help="pcap or pcapng file")
    parser.add_argument("--log", type=Path, required=True, metavar="DIR", help="log directory")
    parser.add_argument("--config", type=Path, help="collector TOML file (defaults otherwise)")
    parser.add_argument("--origin", help="log origin (default: the config's)")
    parser.add_argument(
        "--filter",
        metavar="EXPR",
        help="BPF filter expression (default: the config's [capture] filter; '' for none)",
    )
    parser.add_argument(
        "--server-port",
        type=int,
        action="append",
        metavar="PORT",
        help=(
            "an API port (repeatable; default: the config's [capture] server_ports); the "
            "filter still decides which packets are read"
        ),
    )
    parser.add_argument(
        "--key",
        type=Path,
        help=f"checkpoint signing key (default: DIR/{DEFAULT_KEY_NAME}, created when absent)",
    )
    parser.add_argument(
        "--realtime", action="store_true", help="replay at the pace the file was recorded"
    )
    parser.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    parser.add_argument("--summary-json", type=Path, help="also write the summary as JSON here")
    parser.set_defaults(func=run)


@dataclass(frozen=True)
class ReadOutcome:
    """How far the file was read: where it stopped, and why if it did not reach its end."""

    packets: int
    filtered: int
    offset: int
    size: int
    damage: str = ""


def _config(args: argparse.Namespace) -> CollectorConfig:
    config = load_config(args.config)
    if args.origin:
        config = replace(config, origin=args.origin)
    capture = config.capture
    if args.filter is not None:
        capture = replace(capture, filter=args.filter)
    if args.server_port:
        if not all(0 < port < 65536 for port in args.server_port):
            raise ConfigError("--server-port: expected TCP ports (1..65535)")
        capture = replace(capture, server_ports=tuple(args.server_port))
    return replace(config, capture=capture)


def _signer(args: argparse.Namespace, origin: str) -> Signer:
    if args.key is not None:
        return Signer.load(args.key)
    path = args.log / DEFAULT_KEY_NAME
    if path.exists():
        return Signer.load(path)
    args.log.mkdir(parents=True, exist_ok=True)
    signer = Signer.generate(origin)
    signer.save(path)
    logger.info("created a signing key", extra={"path": str(path)})
    return signer


def _say(message: str) -> None:
    sys.stderr.write(f"collector replay: {message}\n")


def _progress_bar() -> Progress:
    """The terminal's progress bar (rich is imported only when one is shown)."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(
        TextColumn("[bold]replay"),
        BarColumn(),
        DownloadColumn(),
        TextColumn("{task.fields[records]} records"),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    )


def _ticker(
    progress: Progress, reader: CaptureReader, pipeline: CapturePipeline
) -> Callable[[], None]:
    """Moves `progress` to where `reader` is, with the records so far."""
    task = progress.add_task("replay", total=reader.size, records=0)

    def tick() -> None:
        progress.update(task, completed=reader.position, records=pipeline.summary().records)

    return tick


def run(args: argparse.Namespace) -> int:
    try:
        config = _config(args)
        frame_filter = FrameFilter(config.capture.filter) if config.capture.filter else None
        reader = open_capture(args.file)
    except (ConfigError, CaptureError, OSError) as exc:
        _say(str(exc))
        return 2
    try:
        signer = _signer(args, config.origin)
        log = Log.open(args.log, origin=config.origin, signer=signer)
    except (KeyFormatError, LogError, OSError) as exc:
        reader.close()
        _say(str(exc))
        return 2
    try:
        summary, outcome, elapsed, cpu, writer = _replay(
            args, config, reader, log, frame_filter=frame_filter
        )
    finally:
        reader.close()
        log.close()
    sys.stdout.write(summary.report(elapsed, cpu, writer.appended, writer.failed))
    sys.stdout.write(_read_report(outcome, frame_filter))
    if outcome.damage:
        _say(outcome.damage)
    if args.summary_json is not None:
        args.summary_json.write_text(
            json.dumps(
                {
                    **asdict(summary),
                    "seconds": elapsed,
                    "cpu_seconds": cpu,
                    "appended": writer.appended,
                    "read": asdict(outcome),
                },
                default=str,
            )
        )
    clean = writer.error is None and summary.internal_errors == 0 and not outcome.damage
    return 0 if clean else 1


def _read_report(outcome: ReadOutcome, frame_filter: FrameFilter | None) -> str:
    where = "the end" if not outcome.damage else f"byte {outcome.offset} of {outcome.size}"
    lines = [f"read            {outcome.packets} packets, stopped at {where}"]
    if frame_filter is not None:
        lines.append(
            f"filter          {outcome.filtered} packets not matching {frame_filter.expression!r}"
        )
    return "\n".join(lines) + "\n"


def _replay(
    args: argparse.Namespace,
    config: CollectorConfig,
    reader: CaptureReader,
    log: Log,
    *,
    frame_filter: FrameFilter | None,
) -> tuple[PipelineSummary, ReadOutcome, float, float, LogWriter]:
    writer = LogWriter(
        log, batch_records=config.log.batch_records, batch_delay_s=config.log.batch_delay_s
    )
    pipeline = CapturePipeline(config, writer.put)
    show = not args.no_progress and reader.size >= PROGRESS_MIN_BYTES and sys.stderr.isatty()
    progress = _progress_bar() if show else None
    started, cpu_started = time.perf_counter(), time.process_time()
    damage = ""
    try:
        with progress or contextlib.nullcontext(), tuned_for_capture():
            tick = None if progress is None else _ticker(progress, reader, pipeline)
            first_ts: int | None = None
            frame_fn = pipeline.frame
            matches = frame_filter.matches if frame_filter is not None else None
            paced = args.realtime or show
            try:
                for ts, linktype, data, _wire in reader.frames():
                    if paced:
                        if args.realtime:
                            if first_ts is None:
                                first_ts = ts
                            delay = (ts - first_ts) / 1e9 - (time.perf_counter() - started)
                            if delay > 0:
                                time.sleep(delay)
                        if tick is not None and not reader.frames_read & 0x3FFF:
                            tick()
                    if matches is None or matches(linktype, data):
                        frame_fn(ts, linktype, data)
            except CaptureError as exc:
                damage = f"{exc}; stopped after {reader.frames_read} packets"
            pipeline.finish()
    finally:
        writer.close()
    outcome = ReadOutcome(
        packets=reader.frames_read,
        filtered=frame_filter.rejected if frame_filter is not None else 0,
        offset=reader.position,
        size=reader.size,
        damage=damage,
    )
    return (
        pipeline.summary(),
        outcome,
        time.perf_counter() - started,
        time.process_time() - cpu_started,
        writer,
    )

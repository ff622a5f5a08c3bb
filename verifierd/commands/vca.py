"""`verifierd vca --from T --to T`: the verifier compute advantage per commitment.

Reads the engine batches whose records were captured in the window from verifierd's cost log,
integrates the prover's activity from Prometheus (or a `verifierd prover-meter`) over the same
traffic, and prints, per commitment: batches, records, tokens, both activity integrals, the
method and the VCA. Times: "now", a relative time (--from=-10m, -90s, -2h, -1d), Unix seconds,
Unix nanoseconds, or ISO 8601 (no zone: UTC).

GPU prover with DCGM:         verifierd vca --from=-1h --to now --prometheus http://prom:9090
GPU prover with prover-meter: ... --prometheus http://prover:9402 --prover nvml-gpm
CPU prover (e.g. the demo):   verifierd prover-meter --pid PROVER_PID --listen 127.0.0.1:9402
                              ... --prometheus http://127.0.0.1:9402 --prover cpu
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import sys
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

import aiohttp

from verifierd.config import load_config
from verifierd.cost_log import CostLog, cost_log_dir
from verifierd.errors import VerifierdError
from verifierd.vca import (
    PRESETS,
    Measure,
    PrometheusClient,
    ProverQuery,
    ProverWindow,
    SeriesKind,
    VcaReport,
    VcaRow,
    prover_query,
    vca_report,
)

_RELATIVE = re.compile(r"^-(\d+(?:\.\d+)?)(s|m|h|d)$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
AUTO = "auto"


def parse_time(text: str, now_ns: int) -> int:
    """A time as Unix nanoseconds; ValueError with the accepted forms when it is none of them."""
    text = text.strip()
    if text == "now":
        return now_ns
    relative = _RELATIVE.match(text)
    if relative:
        return now_ns - round(float(relative.group(1)) * _UNIT_S[relative.group(2)] * 1e9)
    if text.isdigit() and len(text) >= 16:
        return int(text)
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if math.isfinite(seconds):
            return round(seconds * 1e9)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"{text!r} is not a time: use now, -10m, Unix seconds or ns, or ISO 8601"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return round(moment.timestamp() * 1e9)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "vca",
        help="verifier compute advantage per commitment over a window",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--from", dest="from_", required=True, metavar="T", help="window start")
    parser.add_argument("--to", default="now", metavar="T", help="window end (default now)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--config", type=Path, help="verifierd config (its state_dir)")
    where.add_argument("--state-dir", type=Path, help="verifierd state directory")
    where.add_argument("--cost-log", type=Path, help="the cost log directory itself")
    parser.add_argument(
        "--prometheus", metavar="URL", help="Prometheus (or prover-meter) base URL for the prover"
    )
    parser.add_argument(
        "--prover",
        choices=(AUTO, *PRESETS),
        default=AUTO,
        help="prover series: dcgm (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE), nvml-gpm / "
        "nvml-utilization / cpu (prover-meter counters); auto: cpu for CPU-metered batches, "
        "else dcgm",
    )
    parser.add_argument("--query", help="PromQL for the prover instead of a preset")
    parser.add_argument(
        "--query-kind",
        choices=[k.value for k in SeriesKind],
        default=SeriesKind.GAUGE.value,
        help="--query gives an activity ratio (gauge) or a running activity-seconds total",
    )
    parser.add_argument("--step", type=float, help="query_range step, seconds (default 1)")
    parser.add_argument(
        "--prover-window",
        choices=[w.value for w in ProverWindow],
        default=ProverWindow.TRAFFIC.value,
        help="integrate the prover over the batches' traffic span (default) or the whole window",
    )
    parser.add_argument("--commitment", help="only this commitment id")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)


def _cost_log_path(args: argparse.Namespace) -> Path:
    if args.cost_log is not None:
        return Path(args.cost_log)
    if args.state_dir is not None:
        return cost_log_dir(Path(args.state_dir))
    return cost_log_dir(load_config(args.config).state_dir)


def _prover_query(
    args: argparse.Namespace, cost_log: CostLog, from_ns: int, to_ns: int
) -> ProverQuery:
    if args.query:
        query = ProverQuery(args.query, SeriesKind(args.query_kind), Measure.CUSTOM)
    else:
        batches = cost_log.between(from_ns, to_ns, args.commitment) if args.prover == AUTO else []
        query = prover_query(args.prover, batches)
    if args.step is not None:
        query = ProverQuery(query.query, query.kind, query.measure, args.step)
    return query


async def _report(
    args: argparse.Namespace, cost_log: CostLog, from_ns: int, to_ns: int
) -> VcaReport:
    query = _prover_query(args, cost_log, from_ns, to_ns)
    window = ProverWindow(args.prover_window)
    if not args.prometheus:
        return await vca_report(
            cost_log, None, query, from_ns, to_ns, commitment_id=args.commitment
        )
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        client = PrometheusClient(args.prometheus, session)
        return await vca_report(
            cost_log, client, query, from_ns, to_ns, commitment_id=args.commitment, window=window
        )


def _when(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).isoformat(timespec="milliseconds")


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def format_report(report: VcaReport) -> str:
    """The report as a text table."""
    lines = [
        f"verifier compute advantage, records captured {_when(report.from_ns)} .. "
        f"{_when(report.to_ns)}"
    ]
    prover = report.prover
    if prover is not None:
        span = (prover.end_ns - prover.start_ns) / 1e9
        lines.append(
            f"prover: {prover.source}  {prover.query.query}  ({prover.query.kind}, "
            f"{prover.query.measure})"
        )
        lines.append(
            f"  window {_when(prover.start_ns)} .. {_when(prover.end_ns)} ({span:.1f} s): "
            f"{prover.activity_seconds:.3f} activity-s over {prover.series} series, "
            f"coverage {prover.coverage:.0%}"
        )
    header = (
        f"{'commitment':<14} {'method':<16} {'batches':>7} {'records':>7} {'verified tok':>12} "
        f"{'generated tok':>13} {'verifier s':>11} {'prover s':>11} {'VCA':>9}"
    )
    lines += ["", header, "-" * len(header)]
    rows: list[VcaRow] = list(report.rows)
    if report.total is not None and len(report.rows) > 1:
        rows.append(report.total)
    for row in rows:
        lines.append(
            f"{row.commitment_id[:14]:<14} {row.method:<16} {row.batches:>7} {row.records:>7} "
            f"{row.verified_tokens:>12} {row.generated_tokens:>13.0f} "
            f"{row.verifier_activity_seconds:>11.3f} {row.prover_activity_seconds:>11.3f} "
            f"{_ratio(row.vca):>9}"
        )
    if report.notes:
        lines += ["", "notes:"] + [f"  - {note}" for note in report.notes]
    return "\n".join(lines)


def report_json(report: VcaReport) -> str:
    return json.dumps(asdict(report), default=str, indent=2, sort_keys=True)


def run(args: argparse.Namespace) -> int:
    now = time.time_ns()
    try:
        from_ns = parse_time(args.from_, now)
        to_ns = parse_time(args.to, now)
    except ValueError as exc:
        print(f"verifierd vca: {exc}", file=sys.stderr)
        return 2
    if to_ns < from_ns:
        print("verifierd vca: --to is before --from", file=sys.stderr)
        return 2
    try:
        with CostLog.open(_cost_log_path(args), readonly=True) as cost_log:
            report = asyncio.run(_report(args, cost_log, from_ns, to_ns))
    except VerifierdError as exc:
        print(f"verifierd vca: {exc}", file=sys.stderr)
        return 1
    print(report_json(report) if args.json else format_report(report))
    return 0

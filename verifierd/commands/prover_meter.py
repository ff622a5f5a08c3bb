"""`verifierd prover-meter`: export the prover's GPU or CPU activity for `verifierd vca`.

Runs beside the prover where DCGM's exporter is not deployed. GPUs: NVML GPM (or utilisation on
older GPUs) at 10 Hz. CPU provers: `--pid PID` (the process tree rooted there, e.g. a vLLM
OpenAI server) and/or `--cgroup DIR`. Serves /metrics for Prometheus and a Prometheus-style
/api/v1/query_range over its own history, so `verifierd vca --prometheus URL` can read it
directly. Prints one line `prover-meter: serving http://HOST:PORT (METHOD: TARGETS)` once ready.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from aiohttp import web
from veritap.metrics_http import MetricsAddressError, parse_listen

from verifierd.meter.cpu import CgroupCounter, CpuCounter, CpuSampler, ProcessTreeCounter
from verifierd.meter.errors import MeterError
from verifierd.meter.readings import Method
from verifierd.meter.sampling import Meter, Sampler
from verifierd.meter.selection import AUTO, CHOICES, MeterSettings, open_sampler
from verifierd.prover_meter import ProverMeter

DEFAULT_LISTEN = "127.0.0.1:9402"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "prover-meter",
        help="export the prover's GPU/CPU activity as Prometheus metrics",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--listen", default=DEFAULT_LISTEN, help="host:port (port 0: any free)")
    parser.add_argument(
        "--method", choices=CHOICES, default=AUTO, help="how to meter (default: best available)"
    )
    parser.add_argument("--gpus", default="", help="NVML GPU indices, comma-separated (all)")
    parser.add_argument(
        "--pid", type=int, action="append", default=[], help="meter this process tree's CPU"
    )
    parser.add_argument(
        "--cgroup", type=Path, action="append", default=[], help="meter this cgroup's CPU"
    )
    parser.add_argument("--interval", type=float, default=0.1, help="sampling period, seconds")
    parser.add_argument(
        "--history", type=int, default=36_000, help="samples kept per series for query_range"
    )
    parser.set_defaults(func=run)


def _gpus(text: str) -> tuple[int, ...] | None:
    if not text.strip():
        return None
    return tuple(int(part) for part in text.split(","))


def _sampler(args: argparse.Namespace) -> Sampler:
    if args.pid or args.cgroup:
        if args.method not in (AUTO, Method.CPU_SECONDS):
            raise MeterError(
                "--pid and --cgroup meter CPU-seconds; drop --method or use cpu-seconds"
            )
        counters: list[CpuCounter] = [ProcessTreeCounter(pid) for pid in args.pid]
        counters += [CgroupCounter(path) for path in args.cgroup]
        return CpuSampler(counters)
    sampler, skipped = open_sampler(MeterSettings(method=args.method, gpus=_gpus(args.gpus)))
    if sampler.method is Method.CPU_SECONDS:
        sampler.close()
        reasons = "; ".join(skipped) or "CPU metering needs targets"
        raise MeterError(f"no GPU to meter ({reasons}); give --pid or --cgroup for a CPU prover")
    return sampler


async def _serve(meter: ProverMeter, host: str, port: int) -> None:
    runner = web.AppRunner(meter.app(), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0]
        shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
        targets = ", ".join(meter.meter.targets()) or "none"
        print(
            f"prover-meter: serving http://{shown}:{bound[1]} ({meter.meter.method}: {targets})",
            flush=True,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()


def run(args: argparse.Namespace) -> int:
    try:
        host, port = parse_listen(args.listen)
    except MetricsAddressError as exc:
        print(f"verifierd prover-meter: {exc}", file=sys.stderr)
        return 2
    try:
        sampler = _sampler(args)
        meter = Meter(sampler, interval_s=max(args.interval, sampler.min_interval_s))
    except (MeterError, ValueError) as exc:
        print(f"verifierd prover-meter: {exc}", file=sys.stderr)
        return 2
    prover_meter = ProverMeter(meter, history_capacity=args.history)
    meter.start()
    try:
        asyncio.run(_serve(prover_meter, host, port))
    except OSError as exc:
        print(f"verifierd prover-meter: cannot listen on {args.listen}: {exc}", file=sys.stderr)
        return 1
    finally:
        meter.stop()
    return 0

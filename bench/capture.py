"""Capture benchmark: `collector replay` vs tshark vs a bare dpkt loop, on the same pcap.

The pcap (>= 200 MB of chat traffic over keep-alive connections: half the calls
streamed as SSE with long-tailed lengths, a few percent of segments reordered and
retransmitted) is generated once into .bench/ and reused. Each tool runs as a child process and
is measured by its user CPU seconds (the machine is shared, so CPU is steadier
than wall time):

- collector: `collector replay FILE --log DIR` (records durably appended to the log), with
  IPv4 and TCP checksums verified (the default) and again with `checksums = "ignore"`, to
  show what verification costs
- tshark: `tshark -r FILE -Y http -o tcp.reassemble_out_of_order:TRUE` (Debian's)
- dpkt: a loop that only parses Ethernet/IP/TCP of each packet (the Python floor)

Targets: collector (checksums verified) at least 3x faster than tshark and at least
0.8x the bare dpkt loop. The result line's value is
min(speedup_vs_tshark / 3, speed_vs_dpkt / 0.8): 1.0 or more means both targets are met.

    python bench/capture.py [--size-mb 200] [--skip-tshark]
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "protos")]

import dpkt  # noqa: E402

from tests.openai_traffic import sse_chunk, typical_call  # noqa: E402
from tests.pcapgen import CLIENT, SERVER, Conversation, Packet, frame  # noqa: E402

CACHE = ROOT / ".bench"
# The children run from compiled bytecode, as installed code does (pip compiles it): the
# project's packages are compiled before the first measurement, and an environment's
# PYTHONDONTWRITEBYTECODE is dropped, which would recompile every module on every run.
ENV = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
ENV["PYTHONPATH"] = f"{ROOT}{os.pathsep}{ROOT / 'protos'}"
COMPILED = ["collector", "appliance", "protos/veritap"]
IMPAIR_RATE = 0.02
DPKT_TARGET = 0.8
CONCURRENT = 16
CALLS_PER_CONNECTION = 4

DPKT_LOOP = """
import sys, dpkt
n = 0
with open(sys.argv[1], "rb") as f:
    for ts, buf in dpkt.pcap.Reader(f):
        eth = dpkt.ethernet.Ethernet(buf)
        ip = eth.data
        tcp = ip.data
        n += len(tcp.data)
print(n)
"""


def _connection(rng: random.Random, number: int, start: float, first_call: int) -> list[Packet]:
    conv = Conversation(
        client=_client_of(number),
        server=("10.0.0.2", 8000),
        client_isn=rng.getrandbits(32),
        server_isn=rng.getrandbits(32),
        ts=start,
        step=0.0002,
    ).handshake()
    for k in range(CALLS_PER_CONNECTION):
        call = typical_call(rng, first_call + k)
        conv.send(CLIENT, call.request())
        if not call.stream:
            conv.send(SERVER, call.response())
            continue
        response = call.response()
        head = response[: response.index(b"\r\n\r\n") + 4]
        pieces = [head, *(sse_chunk(e) for e in call.sse_events()), b"0\r\n\r\n"]
        for i, piece in enumerate(pieces):
            conv.send(SERVER, piece, ack=i % 2 == 1)
    conv.close()
    packets = list(conv.packets)
    # Impairments: swap a data segment with its successor; retransmit one a little later.
    i = 3
    while i < len(packets) - 4:
        if packets[i].payload and rng.random() < IMPAIR_RATE:
            packets[i], packets[i + 1] = packets[i + 1], packets[i]
            i += 2
            continue
        if packets[i].payload and rng.random() < IMPAIR_RATE:
            packets.insert(i + 3, packets[i])
            i += 4
            continue
        i += 1
    return [replace(p, ts=start + n * 0.0002) for n, p in enumerate(packets)]


def generate(path: Path, size: int, seed: int = 7) -> None:
    """Write a pcap of at least `size` bytes of impaired chat traffic."""
    rng = random.Random(seed)
    tmp = path.with_suffix(".part")
    written = 0
    number = 0
    start = 1_700_000_000.0
    with tmp.open("wb") as out:
        writer = dpkt.pcap.Writer(out, snaplen=262144, linktype=1)
        while written < size:
            batch = []
            for k in range(CONCURRENT):
                conv_start = start + k * 0.003
                packets = _connection(rng, number, conv_start, number * CALLS_PER_CONNECTION)
                conv = Conversation(client=_client_of(number), server=("10.0.0.2", 8000))
                batch.append([(p.ts, k, frame(conv, p)) for p in packets])
                number += 1
            last = start
            for ts, _k, data in heapq.merge(*batch):
                writer.writepkt(data, ts=ts)
                written += len(data) + 16
                last = ts
            start = last + 0.01
            print(f"\rgenerating {written / 1e6:.0f} MB", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    tmp.rename(path)


def _client_of(number: int) -> tuple[str, int]:
    return (
        f"10.{1 + number // 60000 % 200}.{number // 250 % 250}.{1 + number % 250}",
        30000 + number % 30000,
    )


def _measure(argv: list[str], **kw: object) -> tuple[float, float, str]:
    """(user CPU s, wall s, stdout) of a child process."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, **kw)  # type: ignore[call-overload]
    out = proc.stdout.read()
    _pid, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{argv[0]} failed with {proc.returncode}")
    return usage.ru_utime, time.perf_counter() - started, out.decode(errors="replace")


def _replay(pcap: Path, *, checksums: str) -> tuple[tuple[float, float, str], dict[str, Any]]:
    """Measure `collector replay` of `pcap` with the given checksum policy; its summary."""
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        config = Path(tmp) / "collector.toml"
        config.write_text(f'[capture]\nchecksums = "{checksums}"\n')
        summary_path = Path(tmp) / "summary.json"
        measured = _measure(
            [
                sys.executable,
                "-m",
                "collector.cli",
                "replay",
                str(pcap),
                "--log",
                str(Path(tmp) / "log"),
                "--config",
                str(config),
                "--origin",
                "bench.local/collector",
                "--no-progress",
                "--summary-json",
                str(summary_path),
            ],
            cwd=ROOT,
            env=ENV,
        )
        summary: dict[str, Any] = json.loads(summary_path.read_text())
    return measured, summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-mb", type=int, default=200)
    parser.add_argument("--skip-tshark", action="store_true")
    args = parser.parse_args()
    CACHE.mkdir(exist_ok=True)
    pcap = CACHE / f"chat-{args.size_mb}mb.pcap"
    if not pcap.exists():
        generate(pcap, args.size_mb * 1_000_000)
    size_mb = pcap.stat().st_size / 1e6
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", *COMPILED], cwd=ROOT, env=ENV, check=True
    )
    ours, summary = _replay(pcap, checksums="verify")
    lenient, _ = _replay(pcap, checksums="ignore")
    records = summary["records"]
    packets = summary["frames"]
    floor = _measure([sys.executable, "-c", DPKT_LOOP, str(pcap)], env=ENV)
    rows = [("collector replay", ours[0], ours[1], records)]
    rows.append(("  checksums ignored", lenient[0], lenient[1], records))
    rows.append(("bare dpkt loop", floor[0], floor[1], None))
    tshark_cpu = None
    if not args.skip_tshark and shutil.which("tshark"):
        tshark = _measure(
            [
                "tshark",
                "-r",
                str(pcap),
                "-Y",
                "http",
                "-o",
                "tcp.reassemble_out_of_order:TRUE",
            ]
        )
        tshark_cpu = tshark[0]
        rows.append(("tshark -Y http (ooo on)", tshark[0], tshark[1], len(tshark[2].splitlines())))
    print(
        f"\n{size_mb:.0f} MB, {packets} packets, {records} records "
        f"(qualities {summary['records_by_quality']})\n"
    )
    print(
        f"{'tool':<26}{'user CPU s':>11}{'wall s':>9}{'MB/CPU s':>10}{'pkts/CPU s':>12}"
        f"{'records/CPU s':>15}{'vs collector':>14}"
    )
    for name, cpu, wall, count in rows:
        rate = f"{count / cpu:,.0f}" if count is not None else "-"
        print(
            f"{name:<26}{cpu:>11.1f}{wall:>9.1f}{size_mb / cpu:>10.1f}{packets / cpu:>12,.0f}"
            f"{rate:>15}{cpu / ours[0]:>13.2f}x"
        )
    speed_vs_dpkt = floor[0] / ours[0]
    score = speed_vs_dpkt / DPKT_TARGET
    print(
        f"\ncollector speed vs bare dpkt: {speed_vs_dpkt:.2f}x with checksums verified "
        f"(target >= {DPKT_TARGET}x), {floor[0] / lenient[0]:.2f}x with them ignored; "
        f"verification costs {ours[0] / lenient[0] - 1:+.1%} CPU"
    )
    if tshark_cpu is not None:
        speedup = tshark_cpu / ours[0]
        print(f"collector speedup vs tshark: {speedup:.2f}x (target >= 3x)")
        score = min(score, speedup / 3)
    else:
        print("tshark not measured (--skip-tshark or not installed): the score covers dpkt only")
    print(f"result: capture_replay_score={score:.2f} target=1.00 {'ok' if score >= 1 else 'short'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

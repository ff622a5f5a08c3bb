"""Records/s from a collector's log into a verifier's store over gRPC, vs a minimal gRPC stream.

Same run, same records (4 KB envelopes), server and client in separate processes on loopback:

* ceiling:  a bare grpc.aio server streams the log's envelope bytes, pre-serialized as
            EntryBatch messages of 64 entries; the client only receives the bytes.
* stream:   `collector serve` (the LedgerService, reading the LMDB log) streams to the
            verifier's intake, which checks every entry's chain link and every checkpoint's
            signature and Merkle root, stores entries + cursor durably (LMDB, sync on) in
            group transactions and acknowledges them (window 4096).
* stream mTLS: the same with mutual TLS (informational).
* store only: the verifier's durable store alone taking the same envelopes in-process,
            STORE_BATCH per transaction, no network and no checks (informational: the
            disk's bound on the stream, which the network-only ceiling does not pay).

Rounds alternate the contenders; the median round counts. Target: stream >= 0.5x ceiling.

    python bench/stream.py [--records 20000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "protos")]

import grpc  # noqa: E402
from veritap.envelope import entry_hash  # noqa: E402
from veritap.signing import Signer  # noqa: E402
from veritap.v1 import ledger_pb2, record_pb2  # noqa: E402

from collector.log import Log  # noqa: E402
from tests.tls import write_test_pki  # noqa: E402
from verifierd.config import CollectorConfig, Config, StoreConfig  # noqa: E402
from verifierd.intake import Intake  # noqa: E402
from verifierd.store import Store  # noqa: E402

ORIGIN = "bench.example/stream"
ENVELOPE_SIZE = 4096
BATCH = 64
TARGET = 0.5
STORE_BATCH = 1024
_METHOD = "/bench.Ceiling/Stream"


def build_log(path: Path, signer: Signer, count: int) -> None:
    """A log of `count` records whose envelopes are about ENVELOPE_SIZE bytes."""
    with Log.open(path, origin=ORIGIN, signer=signer) as log:
        for first in range(0, count, 1000):
            records = []
            for i in range(first, min(first + 1000, count)):
                record = record_pb2.InferenceRecord(record_id=f"01JBENCH{i:018d}", origin=ORIGIN)
                record.api.model = f"model-{i % 3}"
                record.request.body = os.urandom(ENVELOPE_SIZE - 140)
                records.append(record)
            log.append_many(records)


# -- the ceiling: a minimal gRPC server streaming pre-serialized batches -------------------


async def _ceiling_server(log_dir: Path, port: int) -> None:
    with Log.open(log_dir, origin=ORIGIN, readonly=True) as log:
        envelopes = [data for _, data in log.iter_entries(1)]
    batches = []
    for first in range(0, len(envelopes), BATCH):
        batch = ledger_pb2.EntryBatch()
        for offset, data in enumerate(envelopes[first : first + BATCH]):
            batch.entries.add(seq=first + offset + 1, envelope=data)
        batches.append(batch.SerializeToString())

    async def stream(request: bytes, context: object) -> AsyncIterator[bytes]:
        for data in batches:
            yield data

    handler = grpc.method_handlers_generic_handler(
        "bench.Ceiling", {"Stream": grpc.unary_stream_rpc_method_handler(stream)}
    )
    server = grpc.aio.server(options=[("grpc.max_send_message_length", 16 << 20)])
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    await server.wait_for_termination()


async def _ceiling_client(port: int, count: int) -> float:
    options = [("grpc.max_receive_message_length", 16 << 20)]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
        call = channel.unary_stream(_METHOD)(b"")
        started = time.perf_counter()
        received = 0
        async for data in call:
            received += len(data)
        elapsed = time.perf_counter() - started
    if received < count * ENVELOPE_SIZE * 0.9:
        raise RuntimeError(f"ceiling stream carried only {received} bytes")
    return count / elapsed


# -- the real thing: collector serve -> verifierd intake -> store -------------------------


async def _intake(state: Path, port: int, signer: Signer, count: int, tls: dict[str, str]) -> float:
    collector = CollectorConfig(
        origin=ORIGIN,
        address=f"localhost:{port}",
        public_key=signer.verifier().key_string(),
        window=4096,
        **tls,
    )
    config = Config(
        state_dir=state, verifier_id="bench", store=StoreConfig(2.0), collectors=(collector,)
    )
    store = Store.open(config.store_dir, map_size=2 << 30)
    try:
        intake = Intake(store, config)
        started = time.perf_counter()
        await intake.start()
        link = intake.links[0]
        while link.stored_seq < count:
            if link.alert_reason or time.perf_counter() - started > 300:
                raise RuntimeError(f"intake stopped at {link.stored_seq}: {link.state}")
            await asyncio.sleep(0.005)
        elapsed = time.perf_counter() - started
        await intake.stop()
    finally:
        store.close()
    if store_count(config.store_dir) != count:
        raise RuntimeError("the store does not hold every record")
    return count / elapsed


def run_store_only(work: Path, log_dir: Path, count: int, round_no: int) -> float:
    """Records/s of `Store.ingest` alone on the log's envelopes (hashes precomputed)."""
    with Log.open(log_dir, origin=ORIGIN, readonly=True) as log:
        entries = [(seq, data, entry_hash(data)) for seq, data in log.iter_entries(1)]
    state = work / f"store-only-{round_no}"
    store = Store.open(state, map_size=2 << 30)
    try:
        started = time.perf_counter()
        for first in range(0, len(entries), STORE_BATCH):
            store.ingest(ORIGIN, entries[first : first + STORE_BATCH])
        elapsed = time.perf_counter() - started
    finally:
        store.close()
        shutil.rmtree(state, ignore_errors=True)
    return count / elapsed


def store_count(path: Path) -> int:
    store = Store.open(path, readonly=True)
    try:
        return store.counts().entries
    finally:
        store.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _spawn(args: list[str]) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        [sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE, env=_env()
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        raise RuntimeError(f"{args[:3]} did not start")
    return process


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'protos'}"}


def run_ceiling(log_dir: Path, count: int) -> float:
    port = _free_port()
    server = _spawn([__file__, "--ceiling-server", str(log_dir), str(port)])
    try:
        return asyncio.run(_ceiling_client(port, count))
    finally:
        server.terminate()
        server.wait()


def run_stream(
    work: Path, log_dir: Path, signer: Signer, count: int, *, mtls: bool, round_no: int
) -> float:
    port = _free_port()
    args = ["-m", "collector.cli", "serve", "--log", str(log_dir), "--origin", ORIGIN]
    args += ["--listen", f"127.0.0.1:{port}"]
    tls: dict[str, str] = {}
    if mtls:
        pki = write_test_pki(work / "pki", client_name="bench")
        config = work / "collector.toml"
        config.write_text(
            f'[ledger]\ntls_cert = "{pki.server_cert}"\ntls_key = "{pki.server_key}"\n'
            f'tls_client_ca = "{pki.ca}"\n'
        )
        args += ["--config", str(config)]
        tls = {"ca_file": str(pki.ca), "cert_file": str(pki.client_cert)}
        tls["key_file"] = str(pki.client_key)
    server = _spawn(args)
    state = work / f"verifier-{'mtls' if mtls else 'plain'}-{round_no}"
    try:
        return asyncio.run(_intake(state, port, signer, count, tls))
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(state, ignore_errors=True)
        (log_dir / "verifier-acks.json").unlink(missing_ok=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--ceiling-server", nargs=2, metavar=("LOG", "PORT"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.ceiling_server:
        asyncio.run(_ceiling_server(Path(args.ceiling_server[0]), int(args.ceiling_server[1])))
        return 0
    base = ROOT / ".bench"
    base.mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="stream-", dir=base))
    try:
        signer = Signer.generate(ORIGIN)
        log_dir = work / "log"
        build_log(log_dir, signer, args.records)
        rates: dict[str, list[float]] = {
            "ceiling": [],
            "stream": [],
            "stream mTLS": [],
            "store only": [],
        }
        for round_no in range(args.rounds):
            rates["ceiling"].append(run_ceiling(log_dir, args.records))
            rates["stream"].append(
                run_stream(work, log_dir, signer, args.records, mtls=False, round_no=round_no)
            )
            rates["stream mTLS"].append(
                run_stream(work, log_dir, signer, args.records, mtls=True, round_no=round_no)
            )
            rates["store only"].append(run_store_only(work, log_dir, args.records, round_no))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ceiling = statistics.median(rates["ceiling"])
    print(f"{args.records} records of {ENVELOPE_SIZE} B, median of {args.rounds} rounds")
    print(f"{'contender':<14}{'records/s':>12}{'MB/s':>9}{'x ceiling':>11}  rounds")
    for name, values in rates.items():
        rate = statistics.median(values)
        shown = " ".join(f"{v:,.0f}" for v in values)
        mb = rate * ENVELOPE_SIZE / 1e6
        print(f"{name:<14}{rate:>12,.0f}{mb:>9.1f}{rate / ceiling:>11.2f}  {shown}")
    stream_vs_store = statistics.median(rates["stream"]) / statistics.median(rates["store only"])
    print(f"stream / store only: {stream_vs_store:.2f} (how close the stream is to the disk)")
    ratio = statistics.median(rates["stream"]) / ceiling
    verdict = "ok" if ratio >= TARGET else "short"
    print(f"result: stream_vs_ceiling={ratio:.2f} target={TARGET} {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Durable appends/s of 4 KB records: the collector's Log vs raw py-lmdb vs file + fdatasync.

Every contender stores the same serialized InferenceRecords (4,096 bytes each)
in durable transactions of the same number of records (--batch):

* file:    os.write of the batch to an append-only file, then os.fdatasync.
* lmdb:    one LMDB write transaction per batch, txn.put(seq, record, append=True),
           LMDB's default sync and metasync on (the setting the Log uses).
* log 1c:  one caller, Log.append_many(batch): envelope, hash chain, Merkle
           frontier, two indexes, signed checkpoints every 1000 records or 1 s.
* log Nc:  N callers (--callers) appending batch // 4 records at a time, the log
           committing at most `batch` per transaction (max_batch): group commit.

Rounds rotate the contenders' order so that machine noise hits them alike;
records/s is the median round and each ratio the median of the per-round
ratios against lmdb. The result line is log Nc / lmdb; target 0.8.

    python bench/ledger.py [--records 20000] [--batch 100] [--rounds 3] [--callers 8]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "protos")]

import lmdb  # noqa: E402
from veritap.signing import Signer  # noqa: E402
from veritap.v1 import record_pb2  # noqa: E402

from collector.log import Log  # noqa: E402

ORIGIN = "bench.example/ledger"
RECORD_SIZE = 4096
TARGET = 0.8


def make_records(count: int) -> list[record_pb2.InferenceRecord]:
    """Records of RECORD_SIZE serialized bytes with distinct ids (body padded to fit)."""
    records = []
    for i in range(count):
        record = record_pb2.InferenceRecord(
            record_id=f"01JBENCH{i:018d}",
            origin=ORIGIN,
            request_first_byte_ns=1_700_000_000_000_000_000 + i * 1000,
            response_first_byte_ns=1_700_000_000_000_000_000 + i * 1000 + 500,
        )
        record.api.model = f"model-{i % 3}"
        record.api.sampling.params_json = '{"max_tokens":64,"seed":7,"temperature":0.7}'
        record.request.method = "POST"
        record.request.target = "/v1/chat/completions"
        record.response.status = 200
        record.request.body = os.urandom(1500)
        record.response.body = b""
        pad = RECORD_SIZE - record.ByteSize() - 3
        record.response.body = os.urandom(pad)
        while record.ByteSize() > RECORD_SIZE:
            record.response.body = record.response.body[:-1]
        records.append(record)
    return records


def bench_file(directory: Path, records: list[record_pb2.InferenceRecord], batch: int) -> float:
    fd = os.open(directory / "records.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        start = time.perf_counter()
        for i in range(0, len(records), batch):
            os.write(fd, b"".join(r.SerializeToString() for r in records[i : i + batch]))
            os.fdatasync(fd)
        return len(records) / (time.perf_counter() - start)
    finally:
        os.close(fd)


def bench_lmdb(directory: Path, records: list[record_pb2.InferenceRecord], batch: int) -> float:
    env = lmdb.open(str(directory), map_size=1 << 30, max_dbs=8, sync=True, metasync=True)
    db = env.open_db(b"records")
    try:
        seq = 0
        start = time.perf_counter()
        for i in range(0, len(records), batch):
            with env.begin(write=True) as txn:
                for record in records[i : i + batch]:
                    seq += 1
                    if not txn.put(
                        seq.to_bytes(8, "big"), record.SerializeToString(), append=True, db=db
                    ):
                        raise RuntimeError("append out of order")
        return len(records) / (time.perf_counter() - start)
    finally:
        env.close()


def bench_log(
    directory: Path, records: list[record_pb2.InferenceRecord], batch: int, signer: Signer
) -> float:
    log = Log.open(directory, origin=ORIGIN, signer=signer, map_size=1 << 30)
    try:
        start = time.perf_counter()
        for i in range(0, len(records), batch):
            log.append_many(records[i : i + batch])
        return len(records) / (time.perf_counter() - start)
    finally:
        log.close()


def bench_log_callers(
    directory: Path,
    records: list[record_pb2.InferenceRecord],
    batch: int,
    signer: Signer,
    callers: int,
) -> tuple[float, float]:
    """Records/s and mean records per commit with `callers` threads appending concurrently.

    Each caller appends slices of batch // 4 records; the log commits at most
    `batch` records per transaction (max_batch), so transactions hold the same
    number of records as the other contenders' while the callers keep it busy.
    """
    log = Log.open(directory, origin=ORIGIN, signer=signer, map_size=1 << 30, max_batch=batch)
    commits = 0

    def count(_: int) -> None:
        nonlocal commits
        commits += 1

    log.add_commit_listener(count)
    step = max(batch // 4, 1)
    chunks = [records[i : i + step] for i in range(0, len(records), step)]
    shares = [chunks[i::callers] for i in range(callers)]

    def work(share: list[list[record_pb2.InferenceRecord]]) -> None:
        for chunk in share:
            log.append_many(chunk)

    workers = [threading.Thread(target=work, args=(share,)) for share in shares]
    try:
        start = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        rate = len(records) / (time.perf_counter() - start)
        return rate, len(records) / max(commits, 1)
    finally:
        log.close()


def run_in_scratch(fn: Callable[[Path], float]) -> float:
    scratch = Path(tempfile.mkdtemp(prefix="veritap-bench-ledger-"))
    try:
        return fn(scratch / "db")
    finally:
        shutil.rmtree(scratch)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--callers", type=int, default=8)
    args = parser.parse_args()
    records = make_records(args.records)
    signer = Signer.generate(ORIGIN)
    size = records[0].ByteSize()
    group = f"log {args.callers}c"
    names = ["file", "lmdb", "log 1c", group]
    results: dict[str, list[float]] = {name: [] for name in names}
    batches: list[float] = []

    def file_run(d: Path) -> float:
        d.mkdir()
        return bench_file(d, records, args.batch)

    def callers_run(d: Path) -> float:
        rate, mean_batch = bench_log_callers(d, records, args.batch, signer, args.callers)
        batches.append(mean_batch)
        return rate

    runs: dict[str, Callable[[Path], float]] = {
        "file": file_run,
        "lmdb": lambda d: bench_lmdb(d, records, args.batch),
        "log 1c": lambda d: bench_log(d, records, args.batch, signer),
        group: callers_run,
    }
    for round_number in range(args.rounds):
        # Rotate the order so that no contender always runs first or last.
        shift = round_number % len(names)
        for name in names[shift:] + names[:shift]:
            results[name].append(run_in_scratch(runs[name]))
    median = {name: statistics.median(values) for name, values in results.items()}
    # Each round's ratio pairs runs made minutes apart at most; their median resists the
    # load other work puts on a shared machine better than a ratio of medians.
    paired = {
        name: statistics.median(
            mine / ref for mine, ref in zip(results[name], results["lmdb"], strict=True)
        )
        for name in names
    }
    print(
        f"{args.records} records of {size} B, batch {args.batch}, durable (sync on), "
        f"{args.rounds} rounds"
    )
    print(f"{'contender':<10} {'records/s':>11} {'MB/s':>8} {'vs lmdb':>8}   per round")
    for name in names:
        rate = median[name]
        rounds = " ".join(f"{v:,.0f}" for v in results[name])
        print(
            f"{name:<10} {rate:>11,.0f} {rate * size / 1e6:>8.1f} {paired[name]:>7.2f}x   {rounds}"
        )
    print("records/s: median of the rounds; vs lmdb: median of the per-round ratios")
    print(f"{group}: {statistics.mean(batches):.1f} records per commit on average")
    ratio = paired[group]
    verdict = "ok" if ratio >= TARGET else "short"
    print(f"result: ledger_vs_lmdb={ratio:.2f} target={TARGET} {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Durable appends/s of 4 KB records: the collector's Log vs raw py-lmdb vs file + fdatasync.

Every contender stores the same serialized InferenceRecords (4,096 bytes each)
in durable transactions of the same number of records (--batch):

* file:    os.write of the batch to an append-only file, then os.fdatasync.
* lmdb:    one LMDB write transaction per batch, txn.put(seq, record, append=True),
           LMDB's default sync and metasync on (the setting the Log uses).
* log 1c:  one caller, Log.append_many(batch): envelope, hash chain, Merkle
           frontier, two indexes, signed checkpoints every 1000 records or 1 s
           (the caller finds the log idle and commits its records itself).
* log Nc:  N callers (--callers) appending batch // 4 records at a time, the log
           committing at most `batch` per transaction (max_batch): group commit.

Rounds rotate the contenders' order so that machine noise hits them alike;
records/s is the median round and each ratio the median of the per-round
ratios against lmdb. The result line judges log 1c / lmdb (issue #18: a single
caller, as `collector run` appends) against the target 0.8, and shows log Nc / lmdb.
The scratch directories are made under $TMPDIR: TMPDIR=/dev/shm takes the disk's
wait out (a tmpfs: fsync costs nothing), so records/s is CPU per record alone.

--cpu adds where the CPU goes per record (process CPU time, all threads, so other
work on the machine shifts it less than wall time): each stage the log adds to raw
LMDB's work, run alone, beside the lmdb and log 1c contenders, as a share of lmdb's.

    python bench/ledger.py [--records 20000] [--batch 100] [--rounds 3] [--callers 8] [--cpu]
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
from veritap import merkle  # noqa: E402
from veritap.envelope import EnvelopeEncoder, entry_hash, record_header  # noqa: E402
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


def bench_lmdb_puts(
    directory: Path, payloads: list[bytes], batch: int, *, indexes: bool, sync: bool
) -> None:
    """The log's row shapes without its envelopes: the record under its seq and, with
    `indexes`, its by-record-id and by-model-time rows."""
    env = lmdb.open(str(directory), map_size=1 << 30, max_dbs=8, sync=sync, metasync=sync)
    records, ids, models = (env.open_db(name) for name in (b"records", b"ids", b"models"))
    try:
        for i in range(0, len(payloads), batch):
            with env.begin(write=True) as txn:
                keys = [(i + n + 1).to_bytes(8, "big") for n in range(len(payloads[i : i + batch]))]
                txn.cursor(db=records).putmulti(
                    list(zip(keys, payloads[i : i + batch], strict=True)), append=True
                )
                if indexes:
                    txn.cursor(db=ids).putmulti([(b"01JBENCH" + k, k) for k in keys])
                    txn.cursor(db=models).putmulti([(b"model-0\0" + k, b"") for k in keys])
    finally:
        env.close()


def envelopes_and_hashes(payloads: list[bytes], headers: list[bytes], signer: Signer) -> None:
    """What the log's sequencer computes per record: envelope, entry hash, Merkle frontier."""
    encoder = EnvelopeEncoder(ORIGIN, signer.key_id)
    tail = encoder.tail(time.time_ns())
    frontier = merkle.Frontier()
    prev = bytes(32)
    for seq, (header, payload) in enumerate(zip(headers, payloads, strict=True), 1):
        prev = entry_hash(encoder.encode_parts(seq, prev, tail, header, payload))
        frontier.append(prev)


def cpu_per_record(fn: Callable[[], object], count: int, rounds: int) -> float:
    """Median over `rounds` of the process CPU time of `fn`, in microseconds per record."""
    samples = []
    for _ in range(rounds):
        start = time.process_time()
        fn()
        samples.append((time.process_time() - start) / count * 1e6)
    return statistics.median(samples)


def cpu_breakdown(
    records: list[record_pb2.InferenceRecord], batch: int, signer: Signer, rounds: int
) -> None:
    payloads = [r.SerializeToString() for r in records]
    headers = [record_header(p) for p in payloads]

    def scratch(fn: Callable[[Path], object]) -> Callable[[], object]:
        return lambda: run_in_scratch(lambda d: (fn(d), 0.0)[1])

    stages: list[tuple[str, Callable[[], object]]] = [
        ("lmdb contender", scratch(lambda d: bench_lmdb(d, records, batch))),
        ("  SerializeToString", lambda: [r.SerializeToString() for r in records]),
        (
            "  puts, 1 row, no sync",
            scratch(lambda d: bench_lmdb_puts(d, payloads, batch, indexes=False, sync=False)),
        ),
        ("log 1c contender", scratch(lambda d: bench_log(d, records, batch, signer))),
        ("  record_header", lambda: [record_header(p) for p in payloads]),
        ("  envelope, entry hash, Merkle", lambda: envelopes_and_hashes(payloads, headers, signer)),
        (
            "  puts, 3 rows, sync",
            scratch(lambda d: bench_lmdb_puts(d, payloads, batch, indexes=True, sync=True)),
        ),
    ]
    cost = {name: cpu_per_record(fn, len(records), rounds) for name, fn in stages}
    reference = cost["lmdb contender"]
    print(f"{'CPU per record':<32} {'us':>7} {'vs lmdb':>8}")
    for name, micros in cost.items():
        print(f"{name:<32} {micros:>7.2f} {micros / reference:>7.2f}x")
    sync = reference - cost["  SerializeToString"] - cost["  puts, 1 row, no sync"]
    print(f"{'  (lmdb: sync and commit)':<32} {sync:>7.2f} {sync / reference:>7.2f}x")
    rest = cost["log 1c contender"] - sum(
        cost[name]
        for name in (
            "  SerializeToString",
            "  record_header",
            "  envelope, entry hash, Merkle",
            "  puts, 3 rows, sync",
        )
    )
    print(f"{'  (log: dedup, bookkeeping, rest)':<32} {rest:>7.2f} {rest / reference:>7.2f}x")


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
    parser.add_argument("--cpu", action="store_true", help="add the CPU-per-record table")
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
    if args.cpu:
        cpu_breakdown(records, args.batch, signer, args.rounds)
    ratio = paired["log 1c"]
    verdict = "ok" if ratio >= TARGET else "short"
    print(
        f"result: ledger_1c_vs_lmdb={ratio:.2f} ledger_{args.callers}c_vs_lmdb={paired[group]:.2f} "
        f"target={TARGET} {verdict}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

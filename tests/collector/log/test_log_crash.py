"""kill -9 a process that is appending, over and over: every acknowledged record survives.

A forked child appends from two threads (batches and single records) and,
only after `append`/`append_many` returned, writes "seq record_id" lines to an
ack file. The parent SIGKILLs it at a random moment, reopens the log, and
checks that every acknowledged record is at its seq, that the log is gapless,
and (with `audit_log`) that the chain, the checkpoints and the meta agree.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import threading
import time
from pathlib import Path

from veritap.signing import Signer

from collector.log.audit import audit_log
from tests.collector.log.log_fixtures import ORIGIN, make_record, open_log

ROUNDS = 22


def _append_until_killed(path: Path, key: str, ack_path: Path, first_index: int) -> None:
    log = open_log(path, Signer.parse(key), checkpoint_every=7, checkpoint_interval_s=0.02)
    ack = os.open(ack_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    lock = threading.Lock()

    def batches(start: int, seed: int, single: bool) -> None:
        rng = random.Random(seed)
        index = start
        while True:
            count = 1 if single else rng.randint(1, 12)
            records = [
                make_record(index + k, body_size=rng.randint(50, 3000)) for k in range(count)
            ]
            # Now and then a retry of the previous batch: it must not be stored twice.
            if rng.random() < 0.1:
                records.append(make_record(index - 1))
            seqs = log.append_many(records)
            lines = "".join(f"{s} {r.record_id}\n" for s, r in zip(seqs, records, strict=True))
            with lock:
                os.write(ack, lines.encode())
            index += count

    threads = [
        threading.Thread(target=batches, args=(first_index, 1, False), daemon=True),
        threading.Thread(target=batches, args=(first_index + 500_000, 2, True), daemon=True),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _drop_torn_line(ack_path: Path) -> None:
    """Cut an ack line the kill tore mid-write, so the next round's lines start on a line
    of their own (its record was acknowledged, but the test no longer knows which)."""
    if ack_path.exists():
        text = ack_path.read_bytes()
        os.truncate(ack_path, text.rfind(b"\n") + 1)


def _acknowledged(ack_path: Path) -> dict[int, str]:
    if not ack_path.exists():
        return {}
    text = ack_path.read_text()
    complete = text[: text.rfind("\n") + 1]
    acked: dict[int, str] = {}
    for line in complete.splitlines():
        seq, record_id = line.split()
        assert acked.setdefault(int(seq), record_id) == record_id, f"seq {seq} acked twice"
    return acked


def test_every_acknowledged_record_survives_sigkill(tmp_path: Path) -> None:
    signer = Signer.generate(ORIGIN)
    path = tmp_path / "log"
    ack_path = tmp_path / "acks"
    context = multiprocessing.get_context("fork")
    rng = random.Random(20240611)
    for round_number in range(ROUNDS):
        before = ack_path.stat().st_size if ack_path.exists() else 0
        child = context.Process(
            target=_append_until_killed,
            args=(path, signer.key_string(), ack_path, round_number * 1_000_000),
        )
        child.start()
        deadline = time.monotonic() + 60
        while (ack_path.stat().st_size if ack_path.exists() else 0) == before:
            assert child.is_alive(), f"round {round_number}: the child died on its own"
            assert time.monotonic() < deadline, f"round {round_number}: no acknowledgement"
            time.sleep(0.005)
        time.sleep(rng.uniform(0, 0.12))
        assert child.pid is not None
        os.kill(child.pid, signal.SIGKILL)
        child.join()
        assert child.exitcode == -signal.SIGKILL
        _drop_torn_line(ack_path)

        acked = _acknowledged(ack_path)
        with open_log(path, signer) as log:
            head = log.head().seq
            assert head >= max(acked)
            stored = {seq: log.record(seq).record_id for seq in acked}
            assert stored == acked
            seqs = [seq for seq, _ in log.iter_entries(1)]
            assert seqs == list(range(1, head + 1))
            ids = [log.record(seq).record_id for seq in seqs]
            assert len(set(ids)) == len(ids), "a record id is stored twice"
        if round_number % 5 == 4 or round_number == ROUNDS - 1:
            report = audit_log(path, signer.verifier())
            assert report.problem is None, f"round {round_number}: {report.problem}"
            assert report.entries == head

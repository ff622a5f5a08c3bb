"""LmdbEnv: writes grow a full map and run again; reads never overlap a resize."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import lmdb
import pytest
from veritap import lmdb_env
from veritap.lmdb_env import LmdbEnv, MapGrowthError

SMALL_MAP = 64 * 1024


@pytest.fixture
def env(tmp_path: Path) -> Iterator[LmdbEnv]:
    wrapped = LmdbEnv(lmdb.open(str(tmp_path), map_size=SMALL_MAP), name="test")
    yield wrapped
    wrapped.close()


def test_a_write_larger_than_the_map_grows_it_and_commits_once(env: LmdbEnv) -> None:
    runs = []

    def put(txn: lmdb.Transaction[bytes]) -> int:
        runs.append(1)
        for i in range(64):
            txn.put(i.to_bytes(4, "big"), bytes(4096))
        return len(runs)

    assert env.write(put) == len(runs) > 1  # a full map aborts the attempt, which runs again
    assert env.env.info()["map_size"] >= 64 * 4096
    with env.read() as txn:
        assert txn.stat()["entries"] == 64


def test_before_growth_runs_before_every_doubling(tmp_path: Path) -> None:
    calls: list[int] = []
    opened = lmdb.open(str(tmp_path), map_size=SMALL_MAP)
    wrapped = LmdbEnv(opened, name="test", before_growth=lambda: calls.append(1))
    try:
        wrapped.write(lambda txn: txn.put(b"k", bytes(256 * 1024)))
        assert len(calls) >= 2 and wrapped.env.info()["map_size"] == SMALL_MAP << len(calls)
    finally:
        wrapped.close()


def test_a_write_that_never_fits_is_refused(env: LmdbEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lmdb_env, "MAX_GROWTHS", 3)

    def full(txn: lmdb.Transaction[bytes]) -> None:
        raise lmdb.MapFullError("full")

    with pytest.raises(MapGrowthError, match="test: the map is still full after 3"):
        env.write(full)
    assert env.env.info()["map_size"] == SMALL_MAP << 3


def test_reads_in_other_threads_run_while_writes_grow_the_map(env: LmdbEnv) -> None:
    stop = threading.Event()
    errors: list[BaseException] = []
    reads = [0]

    def reader() -> None:
        try:
            while not stop.wait(0.0005):
                with env.read() as txn:
                    last = txn.cursor()
                    assert not last.last() or len(last.value()) == 32768
                reads[0] += 1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        for i in range(64):
            env.write(lambda txn, i=i: txn.put(i.to_bytes(4, "big"), bytes(32768)))
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert errors == [] and reads[0] > 0
    assert env.env.info()["map_size"] >= 64 * 32768

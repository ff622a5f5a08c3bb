"""One LMDB environment of this process: gated transactions, and writes that grow the map.

LMDB may change an environment's map size only while the process has no transaction
open on it. `LmdbEnv` owns the environment and a `ReadGate`: every transaction runs
inside the gate (adopting a map another process grew, see `ReadGate.transaction`), writes
are serialised, and a write that fills the map doubles it with no transaction in flight
and runs again. The collector's log, verifierd's store and its cost log all use it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import lmdb

from veritap.read_gate import ReadGate

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Doublings one write may ask for before it is refused (from 64 MiB: past 2^40 bytes).
MAX_GROWTHS = 16


class MapGrowthError(Exception):
    """A write still did not fit after the map was doubled MAX_GROWTHS times."""


class LmdbEnv:
    """`env` behind a ReadGate; `name` says which environment in log lines."""

    def __init__(
        self,
        env: lmdb.Environment,
        *,
        name: str,
        before_growth: Callable[[], None] | None = None,
    ) -> None:
        """`before_growth` runs before each doubling (e.g. to free stale reader slots,
        which pin pages that would otherwise be reused)."""
        self.env = env
        self.name = name
        self.gate = ReadGate()
        self._before_growth = before_growth
        self._write_lock = threading.Lock()

    @contextmanager
    def read(self) -> Iterator[lmdb.Transaction[bytes]]:
        """A read transaction inside the gate."""
        with self.gate.transaction(self.env) as txn:
            yield txn

    def write(self, body: Callable[[lmdb.Transaction[bytes]], T]) -> T:
        """`body` in a write transaction, committed when it returns; when the map is full,
        the transaction is aborted, the map doubled and `body` run again from the start."""
        with self._write_lock:
            for _ in range(MAX_GROWTHS):
                try:
                    with self.gate.transaction(self.env, write=True) as txn:
                        return body(txn)
                except lmdb.MapFullError:
                    self._grow()
        raise MapGrowthError(f"{self.name}: the map is still full after {MAX_GROWTHS} doublings")

    def _grow(self) -> None:
        if self._before_growth is not None:
            self._before_growth()
        with self.gate.exclusive():
            old = self.env.info()["map_size"]
            self.env.set_mapsize(old * 2)
        log.info("grew the LMDB map", extra={"env": self.name, "map_size": old * 2})

    def close(self) -> None:
        """Close the environment once no transaction of this process is open."""
        with self.gate.exclusive():
            self.env.close()

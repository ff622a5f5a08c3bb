"""Many LMDB read transactions at once, or one map resize with none in flight.

LMDB may only change its map size while the process has no transaction
open; `ReadGate` makes readers and the resizer take turns, and `transaction`
adopts a map another process grew. `veritap.lmdb_env.LmdbEnv` puts every
transaction of an environment through one gate and grows the map with it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import lmdb

#: Times in a row one transaction may find the map grown by another process.
MAX_RESIZE_ADOPTIONS = 8


class MapKeepsGrowingError(Exception):
    """Another process grew the map again every time this one adopted its size."""


class ReadGate:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._resizing = False

    @contextmanager
    def reading(self) -> Iterator[None]:
        with self._cond:
            while self._resizing:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            while self._resizing:
                self._cond.wait()
            self._resizing = True
            while self._readers:
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._resizing = False
                self._cond.notify_all()

    @contextmanager
    def transaction(
        self, env: lmdb.Environment, *, write: bool = False
    ) -> Iterator[lmdb.Transaction[bytes]]:
        """A transaction held inside `reading()`, committed when the block ends (aborted on
        an exception). When another process has grown the map, its size is adopted once no
        transaction of this process is open, and the transaction begun again."""
        for _ in range(MAX_RESIZE_ADOPTIONS):
            with self.reading():
                try:
                    txn = env.begin(write=write)
                except lmdb.MapResizedError:
                    pass
                else:
                    with txn:
                        yield txn
                    return
            with self.exclusive():
                env.set_mapsize(0)
        raise MapKeepsGrowingError("the map keeps growing faster than this process can follow")

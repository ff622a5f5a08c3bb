"""The engine child process: load one backend, then answer ScoreBatch messages.

Started by :mod:`verifierd.engine.pool` with multiprocessing's *spawn* method
(a fresh interpreter, no state forked from the daemon), as a non-daemonic
process because vLLM starts processes of its own. It dies with the daemon: the
kernel sends it SIGTERM when its parent exits (PR_SET_PDEATHSIG), SIGTERM
closes the backend (which stops vLLM's own processes), and a closed pipe ends
the loop.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from types import FrameType
from typing import Any, Protocol

import psutil

from verifierd.engine.backend import EngineSpec, ScoreRequest, ScoreResult
from verifierd.engine.protocol import (
    BatchFailed,
    LoadFailed,
    Ready,
    Rejection,
    ScoreBatch,
    Scored,
    Shutdown,
    WorkerArgs,
)

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


class Backend(Protocol):
    """What the worker needs of an engine backend (verifierd.engine.backend.EngineBackend)."""

    @property
    def version(self) -> str: ...

    @property
    def logits_width(self) -> int: ...

    def check_request(self, request: ScoreRequest, profile_name: str) -> str | None: ...

    def score(
        self, requests: list[ScoreRequest], profile_name: str, delta_max: float
    ) -> list[ScoreResult]: ...

    def close(self) -> None: ...


def resolve_factory(path: str) -> Callable[[EngineSpec], Backend]:
    """``"package.module:Attr.attr"`` → the object it names."""
    module_name, _, attr_path = path.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr_path.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{path} is not callable")
    factory: Callable[[EngineSpec], Backend] = obj
    return factory


def _die_with_parent(parent_pid: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def main(conn: Connection, args: WorkerArgs, parent_pid: int) -> None:
    """Entry point of the child process."""
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(parent_pid)
    os.environ.update(dict(args.environment))
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s engine %(levelname)s %(message)s"
    )
    started = time.monotonic_ns()
    try:
        backend = resolve_factory(args.backend_factory)(args.spec)
    except Exception as exc:
        log.exception("engine failed to load")
        conn.send(LoadFailed(f"{type(exc).__name__}: {exc}"))
        return
    try:
        me = psutil.Process()
        pids = (me.pid, *(c.pid for c in me.children(recursive=True)))
        conn.send(Ready(backend.version, backend.logits_width, pids, time.monotonic_ns() - started))
        _serve(conn, backend)
    finally:
        backend.close()


def _serve(conn: Connection, backend: Backend) -> None:
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if isinstance(message, Shutdown):
            return
        if not isinstance(message, ScoreBatch):
            raise TypeError(f"unexpected message {type(message).__name__}")
        start = time.time_ns()
        try:
            accepted, rejected = [], []
            for request in message.requests:
                problem = backend.check_request(request, message.profile)
                if problem is None:
                    accepted.append(request)
                else:
                    rejected.append(Rejection(request.request_id, problem))
            results = backend.score(accepted, message.profile, message.delta_max)
        except Exception as exc:
            log.error("batch failed: %s", traceback.format_exc())
            conn.send(BatchFailed(message.batch_id, f"{type(exc).__name__}: {exc}"))
            continue
        reply = Scored(message.batch_id, tuple(results), tuple(rejected), start, time.time_ns())
        conn.send(reply)

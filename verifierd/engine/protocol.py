"""The messages between verifierd and an engine child process.

The daemon talks to each engine over one duplex pipe with these frozen
dataclasses (pickled by multiprocessing), and nothing else:

daemon → engine: :class:`ScoreBatch`, :class:`Shutdown`
engine → daemon: :class:`Ready` once after the model loaded, then exactly one
:class:`Scored` or :class:`BatchFailed` per ScoreBatch, in order; or a single
:class:`LoadFailed` instead of Ready.
"""

from __future__ import annotations

from dataclasses import dataclass

from verifierd.engine.backend import EngineSpec, ScoreRequest, ScoreResult


@dataclass(frozen=True)
class WorkerArgs:
    """What the child process starts with."""

    spec: EngineSpec
    #: "module:attribute" of a callable EngineSpec -> backend (the real one by default).
    backend_factory: str
    #: Environment set in the child before the backend is imported
    #: (VLLM_CPU_KVCACHE_SPACE, CUDA_VISIBLE_DEVICES, ...).
    environment: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class ScoreBatch:
    batch_id: int
    requests: tuple[ScoreRequest, ...]
    profile: str
    delta_max: float


@dataclass(frozen=True)
class Shutdown:
    pass


@dataclass(frozen=True)
class Ready:
    version: str
    logits_width: int
    #: The engine process and every process it started (for CPU metering).
    pids: tuple[int, ...]
    load_ns: int


@dataclass(frozen=True)
class LoadFailed:
    error: str


@dataclass(frozen=True)
class Rejection:
    """A request the engine refused before running anything (too long, id outside the
    logits, sampling the profile cannot replay); the rest of its batch still runs."""

    request_id: str
    reason: str


@dataclass(frozen=True)
class Scored:
    batch_id: int
    results: tuple[ScoreResult, ...]
    rejected: tuple[Rejection, ...]
    #: Wall-clock span of the engine call (ns since the epoch).
    start_ns: int
    end_ns: int


@dataclass(frozen=True)
class BatchFailed:
    batch_id: int
    error: str


ToEngine = ScoreBatch | Shutdown
FromEngine = Ready | LoadFailed | Scored | BatchFailed

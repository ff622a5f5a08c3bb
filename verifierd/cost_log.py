"""The cost of every engine batch, kept for `verifierd vca`: a small LMDB of its own.

The engine pool appends one `BatchCost` per batch it ran: the meter's WindowCost for the batch's
run (activity-seconds on the engine's GPUs, or CPU-seconds of its processes), the records and
tokens it verified, the commitment's sample rate, and the capture times of those records (the
prover's side of the same work). `verifierd vca` reads them back by capture time.

The log lives in its own LMDB environment (`cost_log_dir(state_dir)` = STATE_DIR/costs), apart
from verifierd's store, so it can be read by the `vca` command while the daemon writes it, and
pruned on its own schedule. One named database, ``costs``:

    key   = traffic_end_ns (8 bytes, big-endian) ‖ batch_id (UTF-8)
    value = the BatchCost as a JSON object (sorted keys, with "v": 1)
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import lmdb
from veritap.lmdb_env import LmdbEnv

from verifierd.errors import VerifierdError
from verifierd.meter.readings import Method, WindowCost

_U64 = struct.Struct(">Q")
_VERSION = 1
_DB = b"costs"


class CostLogError(VerifierdError):
    """The cost log is missing, unreadable, or holds something this version cannot read."""


def cost_log_dir(state_dir: Path) -> Path:
    """Where verifierd keeps its cost log under its state directory."""
    return state_dir / "costs"


@dataclass(frozen=True, slots=True)
class BatchCost:
    """What one engine batch cost and what it verified.

    `activity_seconds` is the meter's integral over [start_ns, end_ns] on `targets`
    (tensor-active GPU-seconds for nvml-gpm, busy GPU-seconds for nvml-utilization,
    CPU-seconds for cpu-seconds). Tokens count the verified choices: `completion_tokens` is
    what the prover generated for them, `prompt_tokens` their prompts. `sample_rate` is the
    fraction of the commitment's records selected for verification when the batch ran, so
    completion_tokens / sample_rate estimates what the prover generated in all.
    `traffic_start_ns`/`traffic_end_ns` are the earliest request_first_byte_ns and the latest
    response_last_byte_ns of the batch's records: when the prover did this work.
    """

    batch_id: str
    commitment_id: str
    method: Method
    start_ns: int
    end_ns: int
    targets: tuple[str, ...]
    activity_seconds: float
    sm_seconds: float | None
    dram_seconds: float | None
    covered_seconds: float
    records: int
    prompt_tokens: int
    completion_tokens: int
    sample_rate: float
    traffic_start_ns: int
    traffic_end_ns: int

    def __post_init__(self) -> None:
        if not self.batch_id:
            raise ValueError("batch_id must not be empty")
        if not 0 < self.sample_rate <= 1:
            raise ValueError(f"sample_rate must be in (0, 1]: {self.sample_rate}")
        if self.traffic_end_ns < self.traffic_start_ns or self.end_ns < self.start_ns:
            raise ValueError("a window ends before it starts")

    @classmethod
    def from_window(
        cls,
        cost: WindowCost,
        *,
        batch_id: str,
        commitment_id: str,
        records: int,
        prompt_tokens: int,
        completion_tokens: int,
        traffic_start_ns: int,
        traffic_end_ns: int,
        sample_rate: float = 1.0,
    ) -> BatchCost:
        """A BatchCost from the meter's answer for the batch's run."""
        return cls(
            batch_id=batch_id,
            commitment_id=commitment_id,
            method=cost.method,
            start_ns=cost.start_ns,
            end_ns=cost.end_ns,
            targets=cost.targets,
            activity_seconds=cost.activity_seconds,
            sm_seconds=cost.sm_seconds,
            dram_seconds=cost.dram_seconds,
            covered_seconds=cost.covered_seconds,
            records=records,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            sample_rate=sample_rate,
            traffic_start_ns=traffic_start_ns,
            traffic_end_ns=traffic_end_ns,
        )

    @property
    def coverage(self) -> float:
        total = (self.end_ns - self.start_ns) / 1e9 * len(self.targets)
        return 1.0 if total <= 0 else min(1.0, self.covered_seconds / total)

    def key(self) -> bytes:
        return _U64.pack(self.traffic_end_ns) + self.batch_id.encode()

    def to_json(self) -> bytes:
        fields: dict[str, Any] = asdict(self)
        fields["method"] = str(self.method)
        fields["targets"] = list(self.targets)
        fields["v"] = _VERSION
        return json.dumps(fields, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> BatchCost:
        try:
            fields = json.loads(raw)
            if not isinstance(fields, dict):
                raise CostLogError("a cost record must be a JSON object")
            version = fields.pop("v")
            if version != _VERSION:
                raise CostLogError(f"cost record version {version!r} is not {_VERSION}")
            fields["method"] = Method(fields["method"])
            fields["targets"] = tuple(fields["targets"])
            return cls(**fields)
        except (KeyError, TypeError, ValueError) as exc:
            raise CostLogError(f"unreadable cost record: {exc}") from exc


class CostLog:
    """Append and query BatchCosts. Thread-safe; one open per process (LMDB's rule)."""

    def __init__(self, env: lmdb.Environment, readonly: bool) -> None:
        self._lmdb = LmdbEnv(env, name="cost log")
        self._readonly = readonly
        self._db = env.open_db(_DB, create=not readonly)

    @classmethod
    def open(cls, path: Path, *, readonly: bool = False, map_size: int = 64 << 20) -> CostLog:
        if readonly and not (path / "data.mdb").is_file():
            raise CostLogError(f"no cost log at {path}")
        if not readonly:
            path.mkdir(parents=True, exist_ok=True)
        try:
            env = lmdb.open(str(path), map_size=map_size, max_dbs=1, readonly=readonly)
        except lmdb.Error as exc:
            raise CostLogError(f"cannot open cost log {path}: {exc}") from exc
        try:
            return cls(env, readonly)
        except lmdb.Error as exc:
            env.close()
            raise CostLogError(f"{path} holds no cost log: {exc}") from exc

    def close(self) -> None:
        self._lmdb.close()

    def __enter__(self) -> CostLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def append(self, cost: BatchCost) -> None:
        """Store `cost` (replacing an earlier record of the same batch and traffic end)."""
        if self._readonly:
            raise CostLogError("cost log opened read-only")
        self._lmdb.write(lambda txn: txn.put(cost.key(), cost.to_json(), db=self._db))

    def between(
        self, from_ns: int, to_ns: int, commitment_id: str | None = None
    ) -> list[BatchCost]:
        """Batches whose records' capture ended in [from_ns, to_ns], by that time."""
        return list(self._scan(from_ns, to_ns, commitment_id))

    def _scan(self, from_ns: int, to_ns: int, commitment_id: str | None) -> Iterator[BatchCost]:
        with self._lmdb.read() as txn:
            cursor = txn.cursor(db=self._db)
            if not cursor.set_range(_U64.pack(from_ns)):
                return
            for key, value in cursor:
                if _U64.unpack(bytes(key[:8]))[0] > to_ns:
                    return
                cost = BatchCost.from_json(bytes(value))
                if commitment_id is None or cost.commitment_id == commitment_id:
                    yield cost

    def prune(self, before_ns: int) -> int:
        """Delete batches whose traffic ended before `before_ns`; how many were deleted."""
        if self._readonly:
            raise CostLogError("cost log opened read-only")
        return self._lmdb.write(partial(self._delete_before, before_ns))

    def _delete_before(self, before_ns: int, txn: lmdb.Transaction[bytes]) -> int:
        deleted = 0
        cursor = txn.cursor(db=self._db)
        if not cursor.first():
            return 0
        while _U64.unpack(bytes(cursor.key()[:8]))[0] < before_ns:
            if not cursor.delete():
                break
            deleted += 1
            if not cursor.key():
                break
        return deleted

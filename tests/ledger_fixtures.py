"""Logs and records for the LedgerService and intake tests, built by code at test time."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from veritap.signing import Signer
from veritap.v1 import record_pb2

from collector.log import Log

ORIGIN = "collector.test/edge-1"


def make_record(
    index: int, *, model: str = "tiny-llama", body_size: int = 600
) -> record_pb2.InferenceRecord:
    record = record_pb2.InferenceRecord(
        record_id=f"rec-{index:010d}",
        origin=ORIGIN,
        request_first_byte_ns=1_700_000_000_000_000_000 + index,
    )
    record.api.model = model
    record.request.body = (f"request {index} ".encode() * (body_size // 8 + 1))[:body_size]
    return record


def open_log(path: Path, signer: Signer, *, checkpoint_every: int = 50) -> Log:
    return Log.open(path, origin=ORIGIN, signer=signer, checkpoint_every=checkpoint_every)


def append(log: Log, first: int, count: int, *, models: Sequence[str] = ("tiny-llama",)) -> None:
    """Append records `first .. first+count-1`, cycling through `models`."""
    log.append_many(
        [make_record(i, model=models[i % len(models)]) for i in range(first, first + count)]
    )

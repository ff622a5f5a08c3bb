"""Records and logs for the log's tests, built by code at test time."""

from __future__ import annotations

from pathlib import Path

from veritap.envelope import encode_envelope
from veritap.signing import Signer
from veritap.v1 import record_pb2

from collector.log import Log

ORIGIN = "collector.test/log"


def make_record(
    index: int, *, model: str = "tiny-llama", body_size: int = 200
) -> record_pb2.InferenceRecord:
    """A record whose id, time and body follow from `index`."""
    record = record_pb2.InferenceRecord(
        record_id=f"01JTEST{index:019d}",
        origin=ORIGIN,
        request_first_byte_ns=1_700_000_000_000_000_000 + 1000 * index,
        response_first_byte_ns=1_700_000_000_000_000_500 + 1000 * index,
        response_last_byte_ns=1_700_000_000_000_000_900 + 1000 * index,
        quality=record_pb2.CAPTURE_QUALITY_COMPLETE,
    )
    record.api.model = model
    record.api.dialect = "openai-completions"
    record.request.method = "POST"
    record.request.target = "/v1/completions"
    record.request.body = (f"request {index} ".encode() * (body_size // 8 + 1))[:body_size]
    record.response.status = 200
    record.response.body = f"response {index}".encode()
    return record


def lone_envelope(record: bytes) -> bytes:
    """The envelope of ``record`` (serialized, or any bytes) as the first entry of ORIGIN's log."""
    return encode_envelope(
        seq=1, prev_hash=bytes(32), captured_at_ns=1, origin=ORIGIN, key_id=b"", record=record
    )


def open_log(
    path: Path,
    signer: Signer | None,
    *,
    checkpoint_every: int = 1000,
    checkpoint_interval_s: float = 1.0,
    map_size: int = 1 << 28,
    max_batch: int = 1024,
) -> Log:
    return Log.open(
        path,
        origin=ORIGIN,
        signer=signer,
        checkpoint_every=checkpoint_every,
        checkpoint_interval_s=checkpoint_interval_s,
        map_size=map_size,
        max_batch=max_batch,
    )

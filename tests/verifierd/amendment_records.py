"""Amendment records as the collector writes them, from the origin the amendment tests use."""

from __future__ import annotations

from veritap.v1 import record_pb2

ORIGIN = "edge"


def amendment(record_id: str, *amended: str) -> record_pb2.InferenceRecord:
    """An amendment record as the collector writes one (no exchange of its own)."""
    return record_pb2.InferenceRecord(
        record_id=record_id,
        origin=ORIGIN,
        quality=record_pb2.CAPTURE_QUALITY_AMBIGUOUS,
        quality_reason=f"late ambiguity: response stream bytes 0..100 of record {amended[0]}",
        amends_record_ids=list(amended),
    )

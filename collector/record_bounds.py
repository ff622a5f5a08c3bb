"""How large a record may grow, and what is cut to keep it within that.

A record reaches verifiers inside one gRPC message of at most
`veritap.tls.MAX_STREAM_MESSAGE_BYTES` (a large entry travels alone), so no
record may exceed `RECORD_BYTES`, whatever the bodies hold:

- Each body is stored once. A request body that the API view holds whole
  (`prompt_json` + `params_json`, see `Extraction.request_in_view`) is not
  stored again; an SSE body is stored and its events are not (each event's
  data is in the body, the record keeps each event's arrival time).
- A stored body is cut at `STORED_BODY_BYTES`, and arrival times are kept for
  the first `STORED_SSE_EVENTS` events. `body_sha256` and `body_length` are
  always the whole body's.
- A record still over `RECORD_BYTES` (a huge API view, thousands of gaps)
  keeps only its skeleton: flow, times, method, target, status, the bodies'
  hashes and lengths, the dialect, the first `SKELETON_AMBIGUITIES` ambiguous
  ranges with their variants' hashes.

Every cut makes the record TRUNCATED (unless a quality that precedes it
applies) with a reason saying what was cut.
"""

from __future__ import annotations

from veritap.tls import MAX_STREAM_MESSAGE_BYTES
from veritap.v1 import record_pb2

STORED_BODY_BYTES = 4 << 20
STORED_SSE_EVENTS = 1 << 16
# What the log entry (seq, hashes, origin, key id) and the stream's framing add to a record.
ENVELOPE_ALLOWANCE = 64 << 10
RECORD_BYTES = MAX_STREAM_MESSAGE_BYTES - ENVELOPE_ALLOWANCE
# Longest text (target, host, reason phrase, quality reason) a skeleton keeps.
SKELETON_TEXT_CHARS = 4096
SKELETON_AMBIGUITIES = 64


def stored_body(body: bytes) -> tuple[bytes, str]:
    """The part of `body` a record stores, and the reason when it is cut ("" when not)."""
    if len(body) <= STORED_BODY_BYTES:
        return body, ""
    return body[:STORED_BODY_BYTES], (
        f"body cut at {STORED_BODY_BYTES} of {len(body)} bytes (its hash is the whole body's)"
    )


def skeleton(record: record_pb2.InferenceRecord, quality: int) -> record_pb2.InferenceRecord:
    """What is kept of a record over `RECORD_BYTES`, with `quality` and the reason."""
    cap = SKELETON_TEXT_CHARS
    out = record_pb2.InferenceRecord(
        record_id=record.record_id,
        origin=record.origin,
        request_first_byte_ns=record.request_first_byte_ns,
        response_first_byte_ns=record.response_first_byte_ns,
        response_last_byte_ns=record.response_last_byte_ns,
        flow=record.flow,
        quality=quality,  # type: ignore[arg-type]
    )
    request, response = record.request, record.response
    if record.HasField("request"):
        out.request.method = request.method[:cap]
        out.request.target = request.target[:cap]
        out.request.host = request.host[:cap]
        out.request.content_encoding = request.content_encoding[:cap]
        out.request.wire_body_length = request.wire_body_length
        out.request.body_sha256 = request.body_sha256
        out.request.body_length = request.body_length
    if record.HasField("response"):
        out.response.status = response.status
        out.response.reason = response.reason[:cap]
        out.response.content_encoding = response.content_encoding[:cap]
        out.response.wire_body_length = response.wire_body_length
        out.response.body_sha256 = response.body_sha256
        out.response.body_length = response.body_length
    if record.HasField("api"):
        out.api.dialect = record.api.dialect
    out.ambiguities.extend(record.ambiguities[:SKELETON_AMBIGUITIES])
    reason = (
        f"record: {record.ByteSize()} bytes, over the {RECORD_BYTES} a record may hold; "
        f"only its skeleton is kept"
    )
    if record.quality_reason:
        reason += "; " + record.quality_reason[:cap]
    out.quality_reason = reason
    return out

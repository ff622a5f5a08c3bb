"""Building an `InferenceRecord` from a captured exchange.

The record's quality is the first that applies of: ambiguous, midstream, request_gap,
response_gap, parse_error, truncated, complete; `quality_reason` lists every
problem found ("request: ...; response: ...; exchange: ..."). A dialect that
cannot read a body adds a parse_error only when the body itself was captured
whole (a JSON error in a truncated body is the truncation's consequence).
Whatever the bodies hold, every exchange becomes exactly one record: an
extractor that fails makes a parse_error record, and so does a record whose
building fails (counted in `RecordStats.failed`), never a lost exchange.
A differing copy of bytes already recorded cannot change their record (the log is
append-only): it becomes an *amendment*, an ambiguous record of its own with the
flow, the range and the hash of each version, whose reason names the records that
hold those bytes ("late ambiguity: ... of record <id> ...").
Credentials (Authorization, Cookie, API-key headers) are never recorded.
How much of the bodies a record stores is decided in `record_bounds`.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
from collections import Counter
from dataclasses import dataclass, field

from google.protobuf.internal.containers import RepeatedCompositeFieldContainer
from ulid import ULID
from veritap.v1 import record_pb2

from collector.dialects import Dialect, DialectRegistry, Extraction
from collector.dialects.json_values import JsonError, load
from collector.http.messages import BodyGap as HttpBodyGap
from collector.http.messages import (
    Exchange,
    Headers,
    LateAmbiguity,
    ProblemKind,
    RequestMessage,
    ResponseMessage,
)
from collector.record_bounds import (
    RECORD_BYTES,
    SKELETON_TEXT_CHARS,
    STORED_SSE_EVENTS,
    skeleton,
    stored_body,
)
from collector.tcp_reassembly import CLIENT_TO_SERVER, FlowInfo, StreamAmbiguity

logger = logging.getLogger(__name__)

Q = record_pb2.CaptureQuality
SECRET_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key", "api-key"}
)
_PRECEDENCE = (
    Q.CAPTURE_QUALITY_AMBIGUOUS,
    Q.CAPTURE_QUALITY_MIDSTREAM,
    Q.CAPTURE_QUALITY_REQUEST_GAP,
    Q.CAPTURE_QUALITY_RESPONSE_GAP,
    Q.CAPTURE_QUALITY_PARSE_ERROR,
    Q.CAPTURE_QUALITY_TRUNCATED,
)
_REQUEST_QUALITY = {
    ProblemKind.GAP: Q.CAPTURE_QUALITY_REQUEST_GAP,
    ProblemKind.TRUNCATED: Q.CAPTURE_QUALITY_TRUNCATED,
    ProblemKind.PARSE_ERROR: Q.CAPTURE_QUALITY_PARSE_ERROR,
    ProblemKind.MIDSTREAM: Q.CAPTURE_QUALITY_MIDSTREAM,
}
_RESPONSE_QUALITY = {**_REQUEST_QUALITY, ProblemKind.GAP: Q.CAPTURE_QUALITY_RESPONSE_GAP}
_EXCHANGE_QUALITY = {
    ProblemKind.MIDSTREAM: Q.CAPTURE_QUALITY_MIDSTREAM,
    ProblemKind.NO_REQUEST: Q.CAPTURE_QUALITY_REQUEST_GAP,
    ProblemKind.NO_RESPONSE: Q.CAPTURE_QUALITY_TRUNCATED,
    ProblemKind.RESPONSE_LOST: Q.CAPTURE_QUALITY_RESPONSE_GAP,
    ProblemKind.REQUEST_UNKNOWN: Q.CAPTURE_QUALITY_REQUEST_GAP,
    ProblemKind.RESPONSE_UNKNOWN: Q.CAPTURE_QUALITY_RESPONSE_GAP,
    ProblemKind.GAP: Q.CAPTURE_QUALITY_REQUEST_GAP,
    ProblemKind.TRUNCATED: Q.CAPTURE_QUALITY_TRUNCATED,
    ProblemKind.PARSE_ERROR: Q.CAPTURE_QUALITY_PARSE_ERROR,
}


@dataclass(slots=True)
class RecordStats:
    records: int = 0
    by_quality: Counter[str] = field(default_factory=Counter)
    by_dialect: Counter[str] = field(default_factory=Counter)
    #: Records whose building failed (an internal error; each still became a record).
    failed: int = 0


def quality_name(quality: int) -> str:
    """`CAPTURE_QUALITY_RESPONSE_GAP` -> `response_gap` (the export's spelling)."""
    return Q.Name(quality).removeprefix("CAPTURE_QUALITY_").lower()  # type: ignore[arg-type]


class RecordBuilder:
    """Turns exchanges into records for one collector origin."""

    def __init__(self, origin: str, dialects: DialectRegistry) -> None:
        self.origin = origin
        self.dialects = dialects
        self.stats = RecordStats()

    def build(self, exchange: Exchange) -> record_pb2.InferenceRecord:
        """The exchange's record: one even when building it fails (then parse_error)."""
        record_id = str(ULID())
        try:
            record = self._build(record_id, exchange)
        except Exception as exc:
            logger.exception("building a record failed", extra={"record_id": record_id})
            self.stats.failed += 1
            record = _unbuilt(record_id, self.origin, exchange, exc)
        self.stats.records += 1
        self.stats.by_quality[quality_name(record.quality)] += 1
        return record

    def amendment(self, late: LateAmbiguity) -> record_pb2.InferenceRecord:
        """The ambiguous record that reports `late` about the records it names."""
        record = record_pb2.InferenceRecord(
            record_id=str(ULID()), origin=self.origin, quality=Q.CAPTURE_QUALITY_AMBIGUOUS
        )
        _fill_flow(record.flow, late.flow)
        ambiguity = late.ambiguity
        _add_ambiguity(record.ambiguities, ambiguity)
        record.amends_record_ids.extend(late.record_ids)
        side = "request" if ambiguity.direction == CLIENT_TO_SERVER else "response"
        held = (
            f"record {', '.join(late.record_ids)}"
            if late.record_ids
            else "a record of this flow written earlier"
        )
        record.quality_reason = (
            f"late ambiguity: {side} stream bytes {ambiguity.start}..{ambiguity.end} of "
            f"{held} arrived in {len(ambiguity.variants)} versions after it was written; "
            "it holds the first"
        )[:SKELETON_TEXT_CHARS]
        self.stats.records += 1
        self.stats.by_quality[quality_name(record.quality)] += 1
        return record

    def _build(self, record_id: str, exchange: Exchange) -> record_pb2.InferenceRecord:
        record = record_pb2.InferenceRecord(record_id=record_id, origin=self.origin)
        _fill_flow(record.flow, exchange.flow)
        found: list[tuple[int, str]] = []
        request, response = exchange.request, exchange.response
        dialect = None
        if request is not None:
            dialect = self.dialects.for_target(request.target)
        elif response is not None:
            dialect = self.dialects.for_object(_object_type(response))
        extraction = None
        if dialect is not None:
            extraction = _extract(dialect, request, response, found)
            record.api.CopyFrom(extraction.view)
            whole = (request is None or not request.problems) and (
                response is None or not response.problems
            )
            if whole:
                found += [(Q.CAPTURE_QUALITY_PARSE_ERROR, f"api: {p}") for p in extraction.problems]
            found += [(Q.CAPTURE_QUALITY_TRUNCATED, f"api: {t}") for t in extraction.truncations]
            self.stats.by_dialect[dialect.name] += 1
        if request is not None:
            in_view = extraction is not None and extraction.request_in_view
            found += _fill_request(record.request, request, in_view=in_view)
            record.request_first_byte_ns = request.first_byte_ns
            found += [(_REQUEST_QUALITY[p.kind], f"request: {p.reason}") for p in request.problems]
        if response is not None:
            found += _fill_response(record.response, response)
            record.response_first_byte_ns = response.first_byte_ns
            record.response_last_byte_ns = response.last_byte_ns
            found += [
                (_RESPONSE_QUALITY[p.kind], f"response: {p.reason}") for p in response.problems
            ]
        found += [(_EXCHANGE_QUALITY[p.kind], f"exchange: {p.reason}") for p in exchange.problems]
        found += _ambiguities(record.ambiguities, request, response)
        record.quality = _quality([q for q, _ in found])
        record.quality_reason = "; ".join(reason for _, reason in found)
        if record.ByteSize() > RECORD_BYTES:
            record = skeleton(record, _quality([record.quality, Q.CAPTURE_QUALITY_TRUNCATED]))
        return record


def _unbuilt(
    record_id: str, origin: str, exchange: Exchange, error: Exception
) -> record_pb2.InferenceRecord:
    """What is kept of an exchange whose record could not be built: where, when and why."""
    reason = f"record: building it failed: {error!r}"[:SKELETON_TEXT_CHARS]
    record = record_pb2.InferenceRecord(
        record_id=record_id,
        origin=origin,
        quality=Q.CAPTURE_QUALITY_PARSE_ERROR,
        quality_reason=reason,
    )
    flow = exchange.flow
    record.flow.ip_version = flow.ip_version
    record.flow.client_port = flow.client_port
    record.flow.server_port = flow.server_port
    if exchange.request is not None:
        record.request_first_byte_ns = exchange.request.first_byte_ns
    if exchange.response is not None:
        record.response_first_byte_ns = exchange.response.first_byte_ns
        record.response_last_byte_ns = exchange.response.last_byte_ns
    return record


def _fill_flow(into: record_pb2.Flow, flow: FlowInfo) -> None:
    into.ip_version = flow.ip_version
    into.client_address = ipaddress.ip_address(flow.client_ip).compressed
    into.client_port = flow.client_port
    into.server_address = ipaddress.ip_address(flow.server_ip).compressed
    into.server_port = flow.server_port
    into.vlan_ids.extend(flow.vlans)


def _add_ambiguity(
    into: RepeatedCompositeFieldContainer[record_pb2.StreamAmbiguity], ambiguity: StreamAmbiguity
) -> None:
    into.add(
        from_client=ambiguity.direction == CLIENT_TO_SERVER,
        stream_offset=ambiguity.start,
        length=ambiguity.end - ambiguity.start,
        variant_sha256=ambiguity.variants,
    )


def _ambiguities(
    into: RepeatedCompositeFieldContainer[record_pb2.StreamAmbiguity],
    request: RequestMessage | None,
    response: ResponseMessage | None,
) -> list[tuple[int, str]]:
    """Each byte range of the exchange seen in more than one version, with its hashes."""
    found: list[tuple[int, str]] = []
    for side, message in (("request", request), ("response", response)):
        for ambiguity in message.ambiguities if message is not None else ():
            _add_ambiguity(into, ambiguity)
            found.append(
                (
                    Q.CAPTURE_QUALITY_AMBIGUOUS,
                    f"{side}: stream bytes {ambiguity.start}..{ambiguity.end} arrived in "
                    f"{len(ambiguity.variants)} versions",
                )
            )
    return found


def _quality(found: list[int]) -> record_pb2.CaptureQuality.ValueType:
    for quality in _PRECEDENCE:
        if quality in found:
            return quality
    return Q.CAPTURE_QUALITY_COMPLETE


def _extract(
    dialect: Dialect,
    request: RequestMessage | None,
    response: ResponseMessage | None,
    found: list[tuple[int, str]],
) -> Extraction:
    """The dialect's extraction; a failing extractor still leaves a (parse_error) record."""
    try:
        return dialect.extract(request.body if request is not None else b"", response)
    except Exception as exc:
        logger.exception("dialect extractor failed", extra={"dialect": dialect.name})
        found.append((Q.CAPTURE_QUALITY_PARSE_ERROR, f"api: the extractor failed: {exc!r}"))
        return Extraction(record_pb2.ApiView(dialect=dialect.name), ())


def _object_type(response: ResponseMessage) -> str:
    """The `object` field of a JSON or SSE response, to guess an orphan's dialect."""
    text = response.sse_events[0].data if response.sse_events else response.body[:65536]
    try:
        document = load(text)
    except JsonError:
        return ""
    value = document.get("object") if isinstance(document, dict) else None
    return value if isinstance(value, str) else ""


def _headers(target: RepeatedCompositeFieldContainer[record_pb2.Header], headers: Headers) -> None:
    for name, value in headers:
        if name.lower() not in SECRET_HEADERS:
            target.add(name=name, value=value)


def _gaps(
    target: RepeatedCompositeFieldContainer[record_pb2.BodyGap], gaps: tuple[HttpBodyGap, ...]
) -> None:
    for gap in gaps:
        target.add(body_offset=gap.body_offset, missing_bytes=gap.missing_bytes)


def _body(
    out: record_pb2.HttpRequest | record_pb2.HttpResponse, body: bytes, *, store: bool = True
) -> str:
    """The whole body's hash and length, and (`store`) the body cut at the cap.

    Returns the cut's reason, or "" when the body is stored whole or not at all.
    """
    out.body_sha256 = hashlib.sha256(body).digest()
    out.body_length = len(body)
    if not store:
        return ""
    out.body, cut = stored_body(body)
    return cut


def _fill_request(
    out: record_pb2.HttpRequest, message: RequestMessage, *, in_view: bool
) -> list[tuple[int, str]]:
    """Fill the request; `in_view`: the API view holds the body whole, so it is not stored."""
    out.method = message.method
    out.target = message.target
    out.host = message.header("host") or ""
    _headers(out.headers, message.headers)
    _headers(out.trailers, message.trailers)
    in_view = in_view and not message.problems and not message.gaps
    cut = _body(out, message.body, store=not in_view)
    out.content_encoding = message.content_encoding
    out.wire_body_length = message.wire_body_length
    _gaps(out.gaps, message.gaps)
    return [(Q.CAPTURE_QUALITY_TRUNCATED, f"request: {cut}")] if cut else []


def _fill_response(out: record_pb2.HttpResponse, message: ResponseMessage) -> list[tuple[int, str]]:
    out.status = message.status
    out.reason = message.reason
    _headers(out.headers, message.headers)
    _headers(out.trailers, message.trailers)
    cuts = [_body(out, message.body)]
    out.content_encoding = message.content_encoding
    out.wire_body_length = message.wire_body_length
    _gaps(out.gaps, message.gaps)
    first = message.first_byte_ns
    events = message.sse_events
    offsets = [event.arrival_ns - first for event in events[:STORED_SSE_EVENTS]]
    if offsets and min(offsets) < 0:  # an event in a segment captured before the first
        offsets = [max(0, offset) for offset in offsets]
    out.sse_arrival_offsets_ns.extend(offsets)
    if len(events) > STORED_SSE_EVENTS:
        cuts.append(f"arrival times kept for {STORED_SSE_EVENTS} of {len(events)} SSE events")
    return [(Q.CAPTURE_QUALITY_TRUNCATED, f"response: {cut}") for cut in cuts if cut]

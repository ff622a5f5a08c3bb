"""JSON Lines export of the log: one object per entry (`collector log export --format jsonl`).

This is a stable interface: keys are only ever added, never renamed or
removed, and appear in this order. Hashes are hex; timestamps are integer ns
since the epoch; a value the record does not have is null. The JSON Schema of
an object is collector/log/export.schema.json.

Every string the prover or a client wrote is kept as written, but the characters
a terminal acts on (C0 and C1 controls, DEL, bidi overrides and marks, lone
surrogates) are written as JSON ``\\uXXXX`` escapes (veritap.control_chars), so
the export can be printed or paged safely and still loads to the captured text.

===========================  =================================================================
key                          value
===========================  =================================================================
seq                          the entry's position in the log (1-based)
record_id                    the record's ULID
origin                       the collector origin that captured it
captured_at_ns               when the entry was appended to the log
entry_hash                   SHA-256(0x00 || envelope), the chain link and Merkle leaf (hex)
request_first_byte_ns        capture time of the request's first byte
response_first_byte_ns       capture time of the response's first byte
response_last_byte_ns        capture time of the response's last byte
flow                         {ip_version, client_address, client_port, server_address,
                             server_port, vlan_ids}
method                       HTTP request method
host                         Host header of the request
path                         the request target's path, without the query string
target                       the request target as sent
http_status                  response status code, or null when no response was seen
dialect                      API dialect ("openai-chat", "openai-completions") or ""
model                        model name the request asked for
stream                       true when the request asked for a streamed (SSE) response
sampling                     the request's parameters exactly as sent (object; every field
                             but the prompt / messages)
prompt_token_ids             list of ints when the response carried them, else null
choices                      list of {index, text, token_ids (list or null), finish_reason,
                             reasoning (text or null), tool_calls (list or null)}: reasoning
                             and tool calls as the record holds them (the dialect reads them
                             as the client's SDK does); each call is {index, id, type,
                             function: {name, arguments}}, index its place in the list; null
                             for records whose dialect keeps none
usage                        {prompt_tokens, completion_tokens, total_tokens} or null
response_id                  the response's id field
error                        the error message of a 4xx/5xx response ("" otherwise)
sse_events                   number of Server-Sent Events in the response
quality                      capture quality: complete, request_gap, response_gap, truncated,
                             midstream, parse_error, ambiguous (unspecified when unset)
quality_reason               why the quality is not complete ("" when it is)
amends_record_ids            for an amendment (bytes of records already written arrived later
                             in another version): the ids of those records, else []
request_body_sha256          SHA-256 of the de-chunked, decompressed request body (hex; the
                             whole body's, also when the record stores it cut or not at all)
response_body_sha256         SHA-256 of the de-chunked, decompressed response body (hex; idem)
events_after_end             SSE events after the one that ended the stream for the client's
                             SDK ([DONE] or an error chunk): counted, never read into the text
prompt                       the request's messages (chat) or prompt (completions) as sent,
                             with any tool calls and tool results in them; null when none
request_body                 only with --with-bodies: the request body as a body object
response_body                only with --with-bodies: the response body (for SSE the event
                             stream) as a body object
===========================  =================================================================

A body object is {encoding, data, whole_length, cut, rebuilt}: ``data`` is the body
as UTF-8 text (``encoding`` "utf-8") or, when it is not UTF-8, base64 (``encoding``
"base64"); ``whole_length`` is the captured body's length in bytes; ``cut`` is true
when the record stores only its start (the record is then truncated); ``rebuilt`` is
true for a request body the record keeps as its API view only, written back as
canonical JSON that loads to the same object as the captured body
(veritap.request_body). A body the record cannot give back is null.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable, Iterator, Sequence
from urllib.parse import urlsplit

from veritap.control_chars import json_text
from veritap.envelope import decode_envelope, decode_record, entry_hash
from veritap.request_body import RequestBodyError, request_body
from veritap.v1 import record_pb2

_QUALITY_PREFIX = "CAPTURE_QUALITY_"


def quality_name(value: int) -> str:
    """`CAPTURE_QUALITY_RESPONSE_GAP` -> "response_gap"."""
    try:
        name = record_pb2.CaptureQuality.Name(value)  # type: ignore[arg-type]
    except ValueError:
        return f"unknown_{value}"
    return name.removeprefix(_QUALITY_PREFIX).lower()


def _sampling(params: record_pb2.SamplingParams) -> object:
    if params.params_json:
        try:
            parsed: object = json.loads(params.params_json)
            return parsed
        except json.JSONDecodeError:
            pass
    # No params_json (an older or partial record): the typed fields that were sent.
    return {
        field.name: list(value)
        if isinstance(value, Sequence) and not isinstance(value, str)
        else value
        for field, value in params.ListFields()
        if field.name != "params_json"
    }


def _token_ids(message: record_pb2.ApiView | record_pb2.Choice, field: str) -> list[int] | None:
    if not message.HasField(field):  # type: ignore[arg-type]
        return None
    ids: record_pb2.TokenIds = getattr(message, field)
    return list(ids.ids)


def _reasoning(choice: record_pb2.Choice) -> str | None:
    return choice.reasoning if choice.HasField("reasoning") else None


def _tool_calls(choice: record_pb2.Choice) -> list[object] | None:
    calls: list[object] = [
        {
            "index": index,
            "id": call.id,
            "type": call.type,
            "function": {"name": call.function_name, "arguments": call.function_arguments},
        }
        for index, call in enumerate(choice.tool_calls)
    ]
    return calls or None


def _body_sha256(message: record_pb2.HttpRequest | record_pb2.HttpResponse) -> str:
    """The whole body's hash: stored with the record (older records: the body's own)."""
    return (message.body_sha256 or hashlib.sha256(message.body).digest()).hex()


def _prompt(api: record_pb2.ApiView) -> object:
    if not api.prompt_json:
        return None
    try:
        prompt: object = json.loads(api.prompt_json)
    except json.JSONDecodeError:
        return api.prompt_json
    return prompt


def _body_object(data: bytes, whole_length: int, *, rebuilt: bool) -> dict[str, object]:
    try:
        encoding, text = "utf-8", data.decode("utf-8")
    except UnicodeDecodeError:
        encoding, text = "base64", base64.b64encode(data).decode("ascii")
    return {
        "encoding": encoding,
        "data": text,
        "whole_length": whole_length,
        "cut": not rebuilt and len(data) < whole_length,
        "rebuilt": rebuilt,
    }


def _request_body(record: record_pb2.InferenceRecord) -> dict[str, object] | None:
    if not record.HasField("request"):
        return None
    request = record.request
    try:
        data = request_body(record)
    except RequestBodyError:
        return None
    rebuilt = not request.body and request.body_length > 0
    return _body_object(data, request.body_length or len(data), rebuilt=rebuilt)


def _response_body(record: record_pb2.InferenceRecord) -> dict[str, object] | None:
    if not record.HasField("response"):
        return None
    response = record.response
    return _body_object(response.body, response.body_length or len(response.body), rebuilt=False)


def record_object(seq: int, envelope: bytes, *, with_bodies: bool = False) -> dict[str, object]:
    """The export object of one entry (keys in the documented order)."""
    entry = decode_envelope(envelope)
    record = decode_record(entry)
    request, response, api, flow = record.request, record.response, record.api, record.flow
    row: dict[str, object] = {
        "seq": seq,
        "record_id": record.record_id,
        "origin": record.origin,
        "captured_at_ns": entry.captured_at_ns,
        "entry_hash": entry_hash(envelope).hex(),
        "request_first_byte_ns": record.request_first_byte_ns,
        "response_first_byte_ns": record.response_first_byte_ns,
        "response_last_byte_ns": record.response_last_byte_ns,
        "flow": {
            "ip_version": flow.ip_version,
            "client_address": flow.client_address,
            "client_port": flow.client_port,
            "server_address": flow.server_address,
            "server_port": flow.server_port,
            "vlan_ids": list(flow.vlan_ids),
        },
        "method": request.method,
        "host": request.host,
        "path": urlsplit(request.target).path,
        "target": request.target,
        "http_status": response.status if record.HasField("response") else None,
        "dialect": api.dialect,
        "model": api.model,
        "stream": api.sampling.HasField("stream") and api.sampling.stream,
        "sampling": _sampling(api.sampling),
        "prompt_token_ids": _token_ids(api, "prompt_token_ids"),
        "choices": [
            {
                "index": choice.index,
                "text": choice.text,
                "token_ids": _token_ids(choice, "token_ids"),
                "finish_reason": choice.finish_reason,
                "reasoning": _reasoning(choice),
                "tool_calls": _tool_calls(choice),
            }
            for choice in api.choices
        ],
        "usage": (
            {
                "prompt_tokens": api.usage.prompt_tokens,
                "completion_tokens": api.usage.completion_tokens,
                "total_tokens": api.usage.total_tokens,
            }
            if api.HasField("usage")
            else None
        ),
        "response_id": api.response_id,
        "error": api.error,
        "sse_events": len(response.sse_arrival_offsets_ns),
        "quality": quality_name(record.quality),
        "quality_reason": record.quality_reason,
        "amends_record_ids": list(record.amends_record_ids),
        "request_body_sha256": _body_sha256(request),
        "response_body_sha256": _body_sha256(response),
        "events_after_end": api.events_after_end,
        "prompt": _prompt(api),
    }
    if with_bodies:
        row["request_body"] = _request_body(record)
        row["response_body"] = _response_body(record)
    return row


def jsonl_lines(
    entries: Iterable[tuple[int, bytes]], *, with_bodies: bool = False
) -> Iterator[str]:
    """One JSON line (with its newline) per (seq, envelope)."""
    for seq, envelope in entries:
        yield json_text(record_object(seq, envelope, with_bodies=with_bodies)) + "\n"

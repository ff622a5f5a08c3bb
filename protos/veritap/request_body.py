"""A record's request body, whether the record stores it or its API view holds it.

The collector stores each body once: when a request body is a JSON object that
the API view holds whole (`prompt_json` for the prompt or messages,
`sampling.params_json` for every other field, both canonical JSON), the record
leaves `request.body` empty and keeps only its `body_sha256` and `body_length`.
`request_body` gives the body back either way: the stored bytes, or canonical
JSON rebuilt from the view, which loads to exactly the object the captured body
loads to (Python's json, as the server parses it). A body the record stores cut
comes back cut (the record is then TRUNCATED).
"""

from __future__ import annotations

import json

from veritap.v1 import record_pb2

# The request field each dialect keeps in `prompt_json` (the rest is in params_json).
PROMPT_KEYS = {
    "openai-chat": "messages",
    "openai-completions": "prompt",
    "openai-responses": "input",
    "anthropic-messages": "messages",
}


class RequestBodyError(ValueError):
    """The record holds neither the body nor a view that can rebuild it."""


def request_body(record: record_pb2.InferenceRecord) -> bytes:
    """The request body of `record` (see the module docstring)."""
    request, api = record.request, record.api
    if request.body or not request.body_length:
        return request.body
    key = PROMPT_KEYS.get(api.dialect)
    if key is None or not api.sampling.params_json:
        raise RequestBodyError(f"no view of the request body in a {api.dialect!r} record")
    try:
        fields = json.loads(api.sampling.params_json)
        if api.prompt_json:
            fields[key] = json.loads(api.prompt_json)
    except (ValueError, TypeError) as exc:
        raise RequestBodyError(f"the record's view of the request is not JSON: {exc}") from exc
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.encode()

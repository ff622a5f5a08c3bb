"""`request_body` gives back the request a collector record was built from, stored or not."""

from __future__ import annotations

import json

import pytest
from veritap.request_body import PROMPT_KEYS, RequestBodyError, request_body
from veritap.v1 import record_pb2

from collector.dialects import DIALECTS
from tests.collector.dialects.dialect_records import records
from tests.openai_traffic import Call, words
from verifierd.evidence.client_view import choice_evidence

RESPONSE = Call("/v1/chat/completions", "m", [], {}, [words(1)]).response()


def post(path: str, body: bytes) -> bytes:
    return b"POST %s HTTP/1.1\r\ncontent-length: %d\r\n\r\n" % (path.encode(), len(body)) + body


def test_the_prompt_keys_are_the_collectors() -> None:
    assert {name: d.prompt_key for name, d in DIALECTS.items()} == PROMPT_KEYS


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/v1/chat/completions",
            b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}',
        ),
        ("/v1/chat/completions", b'{"messages":[],"temperature":1E5,"seed":1' + b"0" * 300 + b"}"),
        ("/v1/chat/completions", b'{"model":"m","messages":null,"messages":["last wins"]}'),
        ("/v1/chat/completions", b'{"model":"\xc3\xa9t\\u00e9","stream":true}'),
        ("/v1/completions", b'{"model":"m","prompt":[1,2,3],"max_tokens":4}'),
        ("/v1/completions", b'{"model":"m","prompt":null}'),
    ],
)
def test_a_body_left_out_is_rebuilt_to_the_same_object(path: str, body: bytes) -> None:
    (rec,) = records((post(path, body), RESPONSE))
    assert rec.request.body == b"" and rec.request.body_length == len(body)
    assert json.loads(request_body(rec)) == json.loads(body)


@pytest.mark.parametrize(
    "body",
    [b"", b"not json", b'{"messages":["\\ud800"]}', b"[1, 2]"],
)
def test_a_stored_body_comes_back_as_stored(body: bytes) -> None:
    (rec,) = records((post("/v1/chat/completions", body), RESPONSE))
    assert rec.request.body == body
    assert request_body(rec) == body


def test_a_record_without_body_or_view_is_refused() -> None:
    record = record_pb2.InferenceRecord()
    record.request.body_length = 10
    with pytest.raises(RequestBodyError):
        request_body(record)


def test_the_verifier_reads_the_request_of_a_record_without_its_body() -> None:
    call = Call("/v1/chat/completions", "m", [{"role": "user", "content": "hi"}], {"seed": 3})
    call.generations = [words(2)]
    (rec,) = records((call.request(), call.response()))
    assert rec.request.body == b""
    (evidence,) = choice_evidence(rec)
    assert json.loads(evidence.request_json) == json.loads(call.request_json())

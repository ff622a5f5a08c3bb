"""Whatever the bodies hold, an exchange becomes exactly one record, and extraction never raises."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from veritap.v1 import record_pb2

from collector.dialects import DIALECTS, Dialect, Extraction
from collector.dialects.json_values import canonical_json
from collector.dialects.openai_chat import OpenAIChat
from collector.http.messages import BodyGap, ResponseMessage
from collector.http.sse import SseEvent
from collector.records import quality_name
from tests.collector.dialects.dialect_records import MESSAGES, records, sse_response
from tests.cpu_bound import budget, cpu_bound
from tests.openai_traffic import Call, words


def post(body: bytes, path: str = "/v1/chat/completions") -> bytes:
    return b"POST %s HTTP/1.1\r\ncontent-length: %d\r\n\r\n" % (path.encode(), len(body)) + body


def document(body: bytes, status: int = 200) -> bytes:
    return b"HTTP/1.1 %d OK\r\ncontent-length: %d\r\n\r\n" % (status, len(body)) + body


def one_record(request: bytes, response: bytes) -> record_pb2.InferenceRecord:
    (rec,) = records((request, response))
    rec.SerializeToString()  # protobuf takes every string in it
    return rec


CALL = Call("/v1/chat/completions", "m", MESSAGES, {}, [words(2)])
DEEP = b"[" * 100_000 + b"]" * 100_000


def test_deeply_nested_response_document_is_a_parse_error() -> None:
    rec = one_record(CALL.request(), document(DEEP))
    assert quality_name(rec.quality) == "parse_error"
    assert "api: response body is not JSON" in rec.quality_reason
    assert rec.response.body == DEEP


def test_deeply_nested_sse_chunk_is_a_parse_error() -> None:
    call = Call("/v1/chat/completions", "m", MESSAGES, {"stream": True}, [words(2)])
    events = call.sse_events()
    deep = b"data: " + b'{"a":' * 50_000 + b"1" + b"}" * 50_000 + b"\n\n"
    rec = one_record(call.request(), sse_response([events[0], deep, *events[1:]]))
    assert quality_name(rec.quality) == "parse_error"
    assert "api: SSE event 2 is not JSON (the SDK raises there)" in rec.quality_reason
    # The client's SDK stopped at the deep event: nothing after it is its text.
    assert rec.api.choices[0].text == ""
    assert rec.api.events_after_end == len(events) - 1


@pytest.mark.parametrize("data", [b"data:\n\n", b"data: {oops\n\n", b"data:  [DONE]\n\n"])
def test_the_text_ends_at_the_first_event_the_sdk_cannot_decode(data: bytes) -> None:
    call = Call("/v1/chat/completions", "m", MESSAGES, {"stream": True}, [words(3)])
    events = call.sse_events()
    rec = one_record(call.request(), sse_response([*events[:2], data, *events[2:]]))
    assert rec.api.choices[0].text == words(3).tokens[0]
    assert "api: SSE event 3 is not JSON (the SDK raises there)" in rec.quality_reason
    assert rec.api.events_after_end == len(events) - 2


def test_lone_surrogate_in_the_response_text_is_replaced_and_said() -> None:
    body = CALL.response_json().replace(words(2).text.encode(), b"hi \\ud800 there")
    rec = one_record(CALL.request(), document(body))
    assert rec.api.choices[0].text == "hi \ufffd there"
    assert quality_name(rec.quality) == "parse_error"
    assert "lone surrogates" in rec.quality_reason
    assert rec.response.body == body


def test_lone_surrogate_in_a_streamed_delta_and_finish_reason() -> None:
    call = Call("/v1/chat/completions", "m", MESSAGES, {"stream": True}, [words(2)])
    events = [e.replace(b'"stop"', b'"\\udc00"') for e in call.sse_events()]
    events[1] = events[1].replace(words(2).tokens[0].encode(), b"\\ud800")
    rec = one_record(call.request(), sse_response(events))
    assert rec.api.choices[0].text.startswith("\ufffd")
    assert rec.api.choices[0].finish_reason == "\ufffd"
    assert quality_name(rec.quality) == "parse_error"


def test_lone_surrogate_in_an_honest_request_keeps_the_raw_body() -> None:
    body = b'{"model":"m","messages":[{"role":"user","content":"x\\ud800"}],"stop":"\\udfff"}'
    rec = one_record(post(body), CALL.response())
    assert rec.quality == record_pb2.CAPTURE_QUALITY_COMPLETE, rec.quality_reason
    assert json.loads(rec.api.prompt_json) == [{"role": "user", "content": "x\ud800"}]
    assert json.loads(rec.api.sampling.params_json)["stop"] == "\udfff"
    assert not rec.api.sampling.stop  # kept in params_json only, like any unfit value
    assert rec.request.body == body  # the raw bytes, since a tokenizer may refuse them


def test_lone_surrogate_in_the_request_model_is_said() -> None:
    body = b'{"model":"m\\ud800","messages":[]}'
    rec = one_record(post(body), CALL.response())
    assert rec.api.model == ""
    assert "request model holds lone surrogates" in rec.quality_reason
    assert json.loads(rec.api.sampling.params_json)["model"] == "m\ud800"


@pytest.mark.parametrize("field", ["temperature", "seed", "max_tokens", "top_p"])
def test_a_400_digit_integer_in_the_request_is_kept_in_params_json_only(field: str) -> None:
    big = "9" * 400
    body = b'{"model":"m","messages":[],"%s":%s}' % (field.encode(), big.encode())
    rec = one_record(post(body), CALL.response())
    assert rec.quality == record_pb2.CAPTURE_QUALITY_COMPLETE, rec.quality_reason
    assert not rec.api.sampling.HasField(field)  # type: ignore[arg-type]
    assert json.loads(rec.api.sampling.params_json)[field] == int(big)
    assert rec.request.body == b""  # the view holds it whole


def test_an_integer_past_pythons_digit_limit_is_a_parse_error() -> None:
    body = b'{"model":"m","messages":[],"seed":' + b"7" * 5000 + b"}"
    rec = one_record(post(body), CALL.response())
    assert quality_name(rec.quality) == "parse_error"
    assert "request body is not JSON" in rec.quality_reason
    assert rec.request.body == body


def test_deeply_nested_request_is_a_parse_error_with_its_body() -> None:
    body = b'{"model":"m","messages":' + DEEP + b"}"
    rec = one_record(post(body), CALL.response())
    assert quality_name(rec.quality) == "parse_error"
    assert rec.request.body == body


def test_canonical_json_escapes_lone_surrogates_losslessly() -> None:
    value = {"k\udc00": ["\ud800", "ok \U0001f600"]}
    text = canonical_json(value)
    text.encode()
    assert json.loads(text) == value


def test_a_failing_extractor_still_gives_one_parse_error_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(self: Dialect, request_body: bytes, response: object) -> Extraction:
        raise RuntimeError("extractor bug")

    monkeypatch.setattr(OpenAIChat, "extract", broken)
    rec = one_record(CALL.request(), CALL.response())
    assert quality_name(rec.quality) == "parse_error"
    assert "the extractor failed: RuntimeError('extractor bug')" in rec.quality_reason
    assert rec.api.dialect == "openai-chat"
    assert rec.request.body == CALL.request_json()  # nothing else holds it now


def _response(
    body: bytes, *, sse: bool, status: int, events: tuple[SseEvent, ...] = ()
) -> ResponseMessage:
    return ResponseMessage(
        status=status,
        reason="OK",
        version="HTTP/1.1",
        headers=(),
        trailers=(),
        body=body,
        content_encoding="",
        wire_body_length=len(body),
        first_byte_ns=1,
        last_byte_ns=2,
        gaps=(),
        problems=(),
        sse_events=events,
        is_sse=sse,
    )


KEYS = [
    "model",
    "messages",
    "prompt",
    "choices",
    "delta",
    "content",
    "text",
    "index",
    "error",
    "usage",
    "token_ids",
    "prompt_token_ids",
    "finish_reason",
    "stop",
    "stop_reason",
    "id",
    "temperature",
    "seed",
    "logprobs",
    "message",
    "n",
    "stream",
    "tool_calls",
    "function",
    "arguments",
    "reasoning",
    "output",
    "type",
]


def _json_values() -> st.SearchStrategy[object]:
    scalars = (
        st.none()
        | st.booleans()
        | st.integers(min_value=-(10**500), max_value=10**500)
        | st.floats(allow_nan=True)
        | st.text(alphabet=st.characters(exclude_categories=()), max_size=20)
    )
    return st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.dictionaries(
                st.sampled_from(KEYS),
                inner,
                max_size=6,
            )
        ),
        max_leaves=30,
    )


def _bodies() -> st.SearchStrategy[bytes]:
    as_json = _json_values().map(lambda v: json.dumps(v).encode())
    return st.binary(max_size=2048) | as_json | as_json.map(lambda b: b.replace(b"[", b"[" * 3))


def _check(dialect: Dialect, request: bytes, response: ResponseMessage) -> None:
    size = len(request) + len(response.body) + sum(len(e.data) for e in response.sse_events)
    with cpu_bound(budget(size)):
        extraction = dialect.extract(request, response)
        extraction.view.SerializeToString()
    assert isinstance(extraction, Extraction)


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(
    st.sampled_from(sorted(DIALECTS)),
    _bodies(),
    _bodies(),
    st.sampled_from([200, 400, 500]),
)
def test_any_document_bodies_give_an_extraction(
    name: str, request: bytes, response: bytes, status: int
) -> None:
    _check(DIALECTS[name], request, _response(response, sse=False, status=status))


_EVENT_LINES = st.sampled_from([b"", b"event: thread.x", b"event: e", b"id: 1", b":c", b"data:"])


@FUZZ
@given(
    st.sampled_from(sorted(DIALECTS)),
    _bodies(),
    st.lists(
        st.tuples(_EVENT_LINES, _bodies() | st.sampled_from([b"[DONE]", b"", b"{"])),
        max_size=12,
    ),
)
def test_any_sse_body_gives_an_extraction(
    name: str, request: bytes, events: list[tuple[bytes, bytes]]
) -> None:
    body = b"".join(line + b"\ndata: " + data + b"\n\n" for line, data in events)
    _check(DIALECTS[name], request, _response(body, sse=True, status=200))


@FUZZ
@given(
    st.sampled_from(sorted(DIALECTS)),
    st.lists(_bodies().map(lambda b: b.decode("utf-8", "replace")), max_size=12),
)
def test_any_resynchronised_events_give_an_extraction(name: str, datas: list[str]) -> None:
    """A body with holes is read through the HTTP layer's events."""
    events = tuple(SseEvent(i, "", data, "") for i, data in enumerate(datas))
    response = replace(_response(b"", sse=True, status=200, events=events), gaps=(BodyGap(0, 9),))
    _check(DIALECTS[name], b"", response)

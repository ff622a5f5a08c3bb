"""The Responses API (`/v1/responses`) in records: text, reasoning and function calls."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai._models import construct_type
from openai.types.responses import Response
from veritap.v1 import record_pb2

from collector.dialects.tool_call_budget import MAX_TOOL_CALL_BYTES
from collector.records import quality_name
from tests.collector.dialects.dialect_records import document, events, one
from tests.cpu_bound import budget, cpu_bound

ARGUMENTS = "response.function_call_arguments.delta"
REASONING = {
    "id": "rs_1",
    "type": "reasoning",
    "summary": [],
    "content": [{"type": "reasoning_text", "text": "The user greets."}],
}
MESSAGE = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "status": "completed",
    "content": [
        {"type": "output_text", "text": "Hello", "annotations": []},
        {"type": "output_text", "text": " there.", "annotations": []},
    ],
}
FUNCTION_CALL = {
    "id": "fc_1",
    "type": "function_call",
    "call_id": "call_1",
    "name": "get_weather",
    "arguments": '{"city": "Paris"}',
    "status": "completed",
}


def request(stream: bool) -> bytes:
    body = json.dumps(
        {
            "model": "m",
            "input": [{"role": "user", "content": "hi"}],
            "instructions": "Be brief.",
            "max_output_tokens": 16,
            "temperature": 0.5,
            "seed": 3,
            "stream": stream,
        }
    ).encode()
    return b"POST /v1/responses HTTP/1.1\r\ncontent-length: %d\r\n\r\n" % len(body) + body


def response_object(output: list[object], status: str = "completed") -> dict[str, object]:
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 0,
        "model": "m",
        "status": status,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": 7,
            "output_tokens": 5,
            "total_tokens": 12,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 2},
        },
    }


def calls_of(choice: record_pb2.Choice) -> list[tuple[str, str, str, str]]:
    return [(c.id, c.type, c.function_name, c.function_arguments) for c in choice.tool_calls]


def test_a_document_gives_the_sdks_output_text_reasoning_and_calls() -> None:
    body = response_object([REASONING, MESSAGE, FUNCTION_CALL])
    rec = one(request(False), document(body))
    assert quality_name(rec.quality) == "complete", rec.quality_reason
    api = rec.api
    assert api.dialect == "openai-responses" and api.model == "m"
    assert json.loads(api.prompt_json) == [{"role": "user", "content": "hi"}]
    assert api.sampling.max_tokens == 16 and api.sampling.seed == 3
    assert json.loads(api.sampling.params_json)["instructions"] == "Be brief."
    assert api.response_id == "resp_1"
    assert (api.usage.prompt_tokens, api.usage.completion_tokens) == (7, 5)
    (choice,) = api.choices
    sdk_view = construct_type(type_=Response, value=body)  # how the SDK builds it from the body
    assert isinstance(sdk_view, Response)
    assert choice.text == sdk_view.output_text == "Hello there."
    assert choice.reasoning == "The user greets." and choice.finish_reason == "completed"
    assert calls_of(choice) == [("call_1", "function", "get_weather", '{"city": "Paris"}')]


def test_summaries_are_the_reasoning_when_no_item_has_content() -> None:
    item = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Short."}]}
    (choice,) = one(request(False), document(response_object([item]))).api.choices
    assert choice.reasoning == "Short." and choice.text == ""


def streamed_events(final_output: list[object] | None) -> list[dict[str, object]]:
    created = response_object([], "in_progress")
    final = response_object(final_output or [])
    if final_output is None:
        final["output"] = None
    call = {**FUNCTION_CALL, "arguments": "", "status": "in_progress"}
    return [
        {"type": "response.created", "response": created, "sequence_number": 0},
        {"type": "response.output_item.added", "output_index": 0, "item": {**REASONING}},
        {"type": "response.reasoning_text.delta", "output_index": 0, "delta": "The user"},
        {"type": "response.reasoning_text.delta", "output_index": 0, "delta": " greets."},
        {"type": "response.output_item.added", "output_index": 1, "item": {**MESSAGE}},
        {"type": "response.output_text.delta", "output_index": 1, "delta": "Hello"},
        {"type": "response.output_text.delta", "output_index": 1, "delta": " there."},
        {"type": "response.output_item.added", "output_index": 2, "item": call},
        {"type": ARGUMENTS, "output_index": 2, "delta": '{"city"'},
        {
            "type": "response.function_call_arguments.delta",
            "output_index": 2,
            "delta": ': "Paris"}',
        },
        {"type": "response.completed", "response": final},
    ]


def test_a_stream_gives_its_deltas_and_the_final_status() -> None:
    for final_output in ([REASONING, MESSAGE, FUNCTION_CALL], None):
        rec = one(request(True), events(*streamed_events(final_output)))
        assert quality_name(rec.quality) == "complete", rec.quality_reason
        (choice,) = rec.api.choices
        assert choice.text == "Hello there." and choice.reasoning == "The user greets."
        assert calls_of(choice) == [("call_1", "function", "get_weather", '{"city": "Paris"}')]
        assert choice.finish_reason == "completed" and rec.api.response_id == "resp_1"
        assert rec.api.usage.total_tokens == 12


@pytest.mark.parametrize(
    "final",
    [
        [REASONING, {**MESSAGE, "content": [{"type": "output_text", "text": "Goodbye."}]}],
        [{**REASONING, "content": [{"type": "reasoning_text", "text": "Other."}]}, MESSAGE],
    ],
    ids=["text", "reasoning"],
)
def test_a_final_object_that_differs_from_the_deltas_is_said(final: list[object]) -> None:
    rec = one(request(True), events(*streamed_events([*final, FUNCTION_CALL])))
    assert rec.api.choices[0].text == "Hello there."
    assert rec.api.choices[0].reasoning == "The user greets."
    assert quality_name(rec.quality) == "parse_error"
    assert "the final response's output differs from what its deltas streamed" in (
        rec.quality_reason
    )


def test_an_unfinished_stream_keeps_its_last_status_and_later_events_are_not_read() -> None:
    data = streamed_events(None)[:-1]
    body = events(*data)[: -len(b"0\r\n\r\n")]
    late = b'event: x\ndata: {"type": "response.output_text.delta", "delta": "!"}\n\n'
    tail = b"data: [DONE]\n\n" + late
    body += b"%x\r\n" % len(tail) + tail + b"\r\n0\r\n\r\n"
    rec = one(request(True), body)
    (choice,) = rec.api.choices
    assert choice.finish_reason == "in_progress" and choice.text == "Hello there."
    assert rec.api.events_after_end == 1


def test_events_the_sdk_helper_raises_on_are_said() -> None:
    rec = one(
        request(True),
        events(
            {"type": "response.output_item.added", "output_index": 0, "item": FUNCTION_CALL},
            {"type": "response.output_item.added", "output_index": 0, "item": FUNCTION_CALL},
            {"type": ARGUMENTS, "output_index": 5, "delta": "x"},
        ),
    )
    assert calls_of(rec.api.choices[0]) == [
        ("call_1", "function", "get_weather", '{"city": "Paris"}')
    ]
    assert "2 tool call fragment(s) with an index past the calls" in rec.quality_reason


def test_megabytes_of_streamed_arguments_are_cut_at_the_cap() -> None:
    call = {**FUNCTION_CALL, "arguments": ""}
    delta = {
        "type": "response.function_call_arguments.delta",
        "output_index": 0,
        "delta": "y" * 8192,
    }
    added = {"type": "response.output_item.added", "output_index": 0, "item": call}
    rec = one(request(True), events(added, *[delta] * 200))
    (choice,) = rec.api.choices
    arguments = choice.tool_calls[0].function_arguments
    assert len(arguments) == MAX_TOOL_CALL_BYTES - len("call_1get_weather")
    assert choice.tool_calls_truncated and quality_name(rec.quality) == "truncated"


def test_an_error_event_is_the_views_error() -> None:
    error = {"type": "error", "code": "server_error", "message": "engine died"}
    rec = one(request(True), events(error))
    assert rec.api.error == "engine died"


def test_an_error_status_is_the_views_error() -> None:
    body = json.dumps({"error": {"message": "bad input", "type": "invalid_request_error"}})
    response = b"HTTP/1.1 400 Bad Request\r\ncontent-length: %d\r\n\r\n" % len(body) + body.encode()
    rec = one(request(False), response)
    assert rec.api.error == "bad input" and not rec.api.choices


_KINDS = [
    "response.created",
    "response.output_item.added",
    "response.output_text.delta",
    "response.reasoning_text.delta",
    "response.reasoning_summary_text.delta",
    "response.function_call_arguments.delta",
    "response.completed",
    "response.incomplete",
    "error",
]
#: The item and part types the reader looks for, so that hostile items often have one.
_TYPES = ["message", "reasoning", "function_call", "output_text", "reasoning_text", "summary_text"]
_KEYS = ["type", "output", "content", "summary", "text", "call_id", "name", "arguments"]
_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**20), 10**20)
    | st.text(max_size=6)
    | st.sampled_from(_TYPES),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(_KEYS), inner, max_size=4)
    ),
    max_leaves=15,
)
_EVENT = st.fixed_dictionaries(
    {"type": st.sampled_from(_KINDS) | _VALUES},
    optional={
        "output_index": st.integers(-2, 3) | _VALUES,
        "delta": _VALUES,
        "item": _VALUES,
        "response": _VALUES,
    },
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_EVENT, max_size=10), st.booleans())
def test_any_events_or_document_give_one_bounded_record(
    data: list[dict[str, object]], streamed: bool
) -> None:
    if streamed:
        response = events(*data)
    else:
        response = document(response_object([d.get("item") for d in data]))
    with cpu_bound(budget(len(response))):
        rec = one(request(streamed), response)
    assert rec.api.dialect == "openai-responses" and len(rec.api.choices) <= 1


def test_events_whose_type_is_not_a_string_are_counted() -> None:
    rec = one(request(True), events({"type": ["response.completed"]}, {"type": {"a": 1}}))
    assert "2 SSE event(s) are not events of this API" in rec.quality_reason


def test_the_reason_of_an_incomplete_response_is_its_stop_reason() -> None:
    body = response_object([MESSAGE], "incomplete")
    body["incomplete_details"] = {"reason": "max_output_tokens"}
    data = streamed_events([MESSAGE])
    data[-1] = {"type": "response.completed", "response": body}
    for streamed, response in ((False, document(body)), (True, events(*data))):
        (choice,) = one(request(streamed), response).api.choices
        assert (choice.finish_reason, choice.stop_reason_json) == (
            "incomplete",
            '"max_output_tokens"',
        )

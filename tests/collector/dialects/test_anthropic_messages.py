"""The Messages API (`/v1/messages`) in records: what the anthropic SDK shows, bounded."""

from __future__ import annotations

import json
from collections.abc import Mapping

from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from veritap.v1 import record_pb2

from collector.dialects.tool_call_budget import MAX_TOOL_CALLS
from collector.records import quality_name
from tests.collector.dialects.dialect_records import document, one, sse_response
from tests.cpu_bound import budget, cpu_bound

MESSAGES = [{"role": "user", "content": "hi"}]
TOOL_USE = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}


def request(stream: bool, **fields: object) -> bytes:
    body = json.dumps(
        {
            "model": "m",
            "messages": MESSAGES,
            "system": "Be brief.",
            "max_tokens": 16,
            "temperature": 0.5,
            "stop_sequences": ["\n\n"],
            "stream": stream,
            **fields,
        }
    ).encode()
    return b"POST /v1/messages HTTP/1.1\r\ncontent-length: %d\r\n\r\n" % len(body) + body


def message(content: list[object], stop_reason: str = "end_turn") -> dict[str, object]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": 7, "output_tokens": 5},
    }


def events(*data: Mapping[str, object]) -> bytes:
    """An SSE response as vLLM writes it: each event named by its data's type."""
    return sse_response(
        [b"event: %s\ndata: %s\n\n" % (_name(d).encode(), json.dumps(d).encode()) for d in data]
    )


def _name(data: Mapping[str, object]) -> str:
    kind = data["type"]
    return kind if type(kind) is str and kind.isprintable() and kind.strip() else "x"


def block_start(index: int, block: dict[str, object]) -> dict[str, object]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def delta(index: int, kind: str, **fields: str) -> dict[str, object]:
    return {"type": "content_block_delta", "index": index, "delta": {"type": kind, **fields}}


def streamed(stop_reason: str = "end_turn", stop_sequence: str | None = None) -> list[dict]:
    """A stream as vLLM's `message_stream_converter` writes one: thinking, text, a tool use."""
    start = message([])
    start.update(stop_reason=None, usage={"input_tokens": 7, "output_tokens": 0})
    return [
        {"type": "message_start", "message": start},
        block_start(0, {"type": "thinking", "thinking": ""}),
        delta(0, "thinking_delta", thinking="Greet."),
        delta(0, "signature_delta", signature="ab"),
        {"type": "content_block_stop", "index": 0},
        block_start(1, {"type": "text", "text": ""}),
        {"type": "ping"},
        delta(1, "text_delta", text="Hello"),
        delta(1, "text_delta", text=" there."),
        {"type": "content_block_stop", "index": 1},
        block_start(2, {**TOOL_USE, "input": {}}),
        delta(2, "input_json_delta", partial_json='{"city"'),
        delta(2, "input_json_delta", partial_json=': "Paris"}'),
        {"type": "content_block_stop", "index": 2},
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
            "usage": {"input_tokens": 7, "output_tokens": 5},
        },
        {"type": "message_stop"},
    ]


def sdk_snapshot(data: list[dict]) -> Message:
    """What the anthropic SDK's MessageStream accumulates from these events."""
    snapshot = None
    json_bufs: dict[int, bytes] = {}
    for event in data:
        if event["type"] != "ping":
            snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=json_bufs)  # type: ignore[arg-type]
    assert snapshot is not None
    return snapshot


def sdk_text(msg: Message) -> str:
    return "".join(b.text for b in msg.content if b.type == "text")


def calls_of(choice: record_pb2.Choice) -> list[tuple[str, str, str]]:
    return [(c.id, c.function_name, c.function_arguments) for c in choice.tool_calls]


def test_a_document_gives_the_sdks_text_thinking_tool_use_and_stop() -> None:
    thinking = {"type": "thinking", "thinking": "Greet.", "signature": "ab"}
    text = [{"type": "text", "text": "Hello"}, {"type": "text", "text": " there."}]
    body = message([thinking, *text, TOOL_USE], stop_reason="tool_use")
    rec = one(request(False), document(body))
    assert quality_name(rec.quality) == "complete", rec.quality_reason
    api = rec.api
    assert api.dialect == "anthropic-messages" and api.model == "m"
    assert json.loads(api.prompt_json) == MESSAGES
    assert json.loads(api.sampling.params_json)["system"] == "Be brief."
    assert (api.sampling.max_tokens, api.sampling.temperature) == (16, 0.5)
    assert list(api.sampling.stop) == ["\n\n"] and api.response_id == "msg_1"
    assert (api.usage.prompt_tokens, api.usage.completion_tokens) == (7, 5)
    (choice,) = api.choices
    assert choice.text == sdk_text(Message.model_validate(body)) == "Hello there."
    assert choice.reasoning == "Greet." and choice.finish_reason == "tool_use"
    assert calls_of(choice) == [("toolu_1", "get_weather", '{"city":"Paris"}')]
    assert choice.stop_reason_json == ""


def test_a_stop_sequence_is_the_stop_reason_and_cached_input_is_prompt() -> None:
    body = message([{"type": "text", "text": "a"}], stop_reason="stop_sequence")
    body.update(
        stop_sequence="\n\n",
        usage={"input_tokens": 3, "cache_read_input_tokens": 4, "output_tokens": 1},
    )
    rec = one(request(False), document(body))
    (choice,) = rec.api.choices
    assert (choice.finish_reason, choice.stop_reason_json) == ("stop_sequence", '"\\n\\n"')
    assert rec.api.usage.prompt_tokens == 7


def test_fields_the_server_does_not_carry_stay_out_of_the_sampling() -> None:
    rec = one(request(False, seed=3, min_p=0.1, n=2), document(message([])))
    sampling = rec.api.sampling
    assert not sampling.HasField("seed") and not sampling.HasField("min_p")
    assert not sampling.HasField("n")
    assert json.loads(sampling.params_json)["seed"] == 3  # still in what the client sent


def test_a_stream_gives_what_the_sdk_accumulates() -> None:
    data = streamed("stop_sequence", "\n\n")
    rec = one(request(True), events(*data))
    assert quality_name(rec.quality) == "complete", rec.quality_reason
    (choice,) = rec.api.choices
    snapshot = sdk_snapshot(data)
    assert choice.text == sdk_text(snapshot) == "Hello there."
    assert choice.reasoning == "Greet."
    assert calls_of(choice) == [("toolu_1", "get_weather", '{"city": "Paris"}')]
    assert (choice.finish_reason, snapshot.stop_reason) == ("stop_sequence", "stop_sequence")
    assert choice.stop_reason_json == json.dumps(snapshot.stop_sequence)
    assert (rec.api.usage.prompt_tokens, rec.api.usage.completion_tokens) == (7, 5)
    assert rec.api.response_id == "msg_1"


def test_events_after_message_stop_are_still_read() -> None:
    data = [*streamed(), delta(1, "text_delta", text="!")]
    (choice,) = one(request(True), events(*data)).api.choices
    assert choice.text == sdk_text(sdk_snapshot(data)) == "Hello there.!"


def test_a_stream_not_started_by_message_start_is_a_problem() -> None:
    rec = one(request(True), events(*streamed()[1:]))
    assert "the stream starts with 'content_block_start' (the SDK raises there)" in (
        rec.quality_reason
    )
    assert not rec.api.choices


def test_a_delta_past_the_blocks_ends_the_stream_where_the_sdk_raises() -> None:
    data = streamed()
    rec = one(request(True), events(*data[:7], delta(9, "text_delta", text="x"), *data[7:]))
    (choice,) = rec.api.choices
    assert choice.text == "" and choice.finish_reason == ""
    assert "a content block delta for block 9 of 2 (the SDK raises there)" in rec.quality_reason
    assert rec.api.events_after_end == len(data) - 7


def test_unnamed_events_are_skipped_and_an_error_event_ends_the_stream() -> None:
    unnamed = b"data: %s\n\n" % json.dumps(delta(1, "text_delta", text="x")).encode()
    error_data = {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}
    error = b"event: error\ndata: %s\n\n" % json.dumps(error_data).encode()
    parts = events(*streamed()[:8])[: -len(b"0\r\n\r\n")]
    tail = unnamed + error + b'event: message_stop\ndata: {"type": "message_stop"}\n\n'
    body = parts + b"%x\r\n" % len(tail) + tail + b"\r\n0\r\n\r\n"
    rec = one(request(True), body)
    assert rec.api.error == "busy" and rec.api.events_after_end == 1
    assert rec.api.choices[0].text == "Hello"


def test_an_error_status_is_the_views_error() -> None:
    body = {"type": "error", "error": {"type": "invalid_request_error", "message": "no max_tokens"}}
    data = json.dumps(body).encode()
    response = b"HTTP/1.1 400 Bad Request\r\ncontent-length: %d\r\n\r\n" % len(data) + data
    rec = one(request(False), response)
    assert rec.api.error == "no max_tokens" and not rec.api.choices


def test_tool_uses_past_the_cap_are_dropped() -> None:
    body = message([TOOL_USE] * (MAX_TOOL_CALLS + 3), stop_reason="tool_use")
    rec = one(request(False), document(body))
    (choice,) = rec.api.choices
    assert len(choice.tool_calls) == MAX_TOOL_CALLS and choice.tool_calls_truncated
    assert quality_name(rec.quality) == "truncated"


_KINDS = [
    "message_start",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
    "ping",
    "error",
]
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**20), 10**20) | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                ["type", "text", "thinking", "partial_json", "id", "name", "input", "content"]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=15,
)
_EVENT = st.fixed_dictionaries(
    {"type": st.sampled_from(_KINDS) | _VALUES},
    optional={
        "index": st.integers(-2, 3) | _VALUES,
        "delta": _VALUES,
        "content_block": _VALUES,
        "message": _VALUES,
        "usage": _VALUES,
    },
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_EVENT, max_size=10), st.booleans(), st.booleans())
def test_any_events_or_document_give_one_bounded_record(
    data: list[dict[str, object]], stream: bool, started: bool
) -> None:
    if started:
        data = streamed()[:1] + data
    if stream:
        response = events(*data)
    else:
        response = document(message([d.get("content_block") for d in data]))
    with cpu_bound(budget(len(response))):
        rec = one(request(stream), response)
    assert rec.api.dialect == "anthropic-messages" and len(rec.api.choices) <= 1

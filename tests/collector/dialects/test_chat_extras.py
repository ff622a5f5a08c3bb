"""Chat tool calls and reasoning in the record: as the openai SDK shows them, within caps."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.lib.streaming._deltas import accumulate_delta
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk
from veritap.v1 import record_pb2

from collector.dialects.tool_call_budget import MAX_TOOL_CALL_BYTES, MAX_TOOL_CALLS
from collector.records import quality_name
from tests.collector.dialects.dialect_records import MESSAGES, records, sse_response
from tests.cpu_bound import budget, cpu_bound
from tests.openai_traffic import Call, words

CHAT = "/v1/chat/completions"
STREAMED = Call(CHAT, "m", MESSAGES, {"stream": True}, [words(2)])
PLAIN = Call(CHAT, "m", MESSAGES, {}, [words(2)])
WEATHER = {
    "id": "chatcmpl-tool-1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}


def document(message: Mapping[str, object]) -> bytes:
    body = json.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
        }
    ).encode()
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body


def chunk(delta: dict[str, object], index: int = 0) -> dict[str, object]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": [{"index": index, "delta": delta, "finish_reason": None}],
    }


def stream(*chunks: dict[str, object]) -> bytes:
    events = [b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks]
    return sse_response([*events, b"data: [DONE]\n\n"])


def one(call: Call, response: bytes) -> record_pb2.InferenceRecord:
    (rec,) = records((call.request(), response))
    rec.SerializeToString()
    return rec


def calls_of(choice: record_pb2.Choice) -> list[tuple[str, str, str, str]]:
    return [(c.id, c.type, c.function_name, c.function_arguments) for c in choice.tool_calls]


def test_a_document_gives_its_tool_calls_and_reasoning() -> None:
    second = {"id": "t2", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    message = {
        "role": "assistant",
        "content": None,
        "reasoning": "They asked about weather.",
        "tool_calls": [WEATHER, second],
    }
    rec = one(PLAIN, document(message))
    assert quality_name(rec.quality) == "complete", rec.quality_reason
    (choice,) = rec.api.choices
    assert choice.text == "" and choice.reasoning == "They asked about weather."
    assert calls_of(choice) == [
        ("chatcmpl-tool-1", "function", "get_weather", '{"city": "Paris"}'),
        ("t2", "function", "f", "{}"),
    ]
    assert not choice.tool_calls_truncated


@pytest.mark.parametrize(
    ("message", "reasoning"),
    [
        ({"content": "hi", "reasoning_content": "older server"}, "older server"),
        ({"content": "hi", "reasoning": "", "reasoning_content": "second"}, "second"),
        ({"content": "hi", "reasoning": None}, None),
        ({"content": "hi"}, None),
    ],
)
def test_reasoning_is_the_first_non_empty_of_its_two_names(
    message: dict[str, object], reasoning: str | None
) -> None:
    (choice,) = one(PLAIN, document(message)).api.choices
    assert (choice.reasoning if choice.HasField("reasoning") else None) == reasoning
    assert choice.text == "hi" and not choice.tool_calls


def test_a_stream_assembles_vllm_shaped_fragments() -> None:
    rec = one(
        STREAMED,
        stream(
            chunk({"role": "assistant", "content": ""}),
            chunk({"reasoning": "Weather"}),
            chunk({"reasoning": " question."}),
            chunk({"tool_calls": [{"index": 0, **WEATHER, "function": {"name": "get_weather"}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
            chunk({"tool_calls": [{"index": 1, "id": "t2", "type": "function"}]}),
            chunk({"tool_calls": [{"index": 1, "function": {"name": "f", "arguments": "{}"}}]}),
        ),
    )
    assert quality_name(rec.quality) == "complete", rec.quality_reason
    (choice,) = rec.api.choices
    assert choice.reasoning == "Weather question."
    assert calls_of(choice) == [
        ("chatcmpl-tool-1", "function", "get_weather", '{"city": "Paris"}'),
        ("t2", "function", "f", "{}"),
    ]


def test_streamed_choices_keep_their_own_calls_and_older_reasoning() -> None:
    rec = one(
        STREAMED,
        stream(
            chunk({"reasoning_content": "a"}, 1),
            chunk({"tool_calls": [{"index": 0, "id": "one", "function": {"name": "x"}}]}, 1),
            chunk({"tool_calls": [{"index": 0, "id": "zero"}]}, 0),
        ),
    )
    zero, one_ = rec.api.choices
    assert calls_of(zero) == [("zero", "", "", "")] and not zero.HasField("reasoning")
    assert calls_of(one_) == [("one", "", "x", "")] and one_.reasoning == "a"


def test_an_index_of_a_billion_appends_each_time_and_the_sdk_helper_raises() -> None:
    fragments = [
        chunk({"tool_calls": [{"index": 10**9, "id": "a", "function": {"arguments": "1"}}]}),
        chunk({"tool_calls": [{"index": 10**9, "id": "b", "function": {"arguments": "2"}}]}),
        chunk({"tool_calls": [{"index": -1, "function": {"arguments": "3"}}]}),
    ]
    rec = one(STREAMED, stream(*fragments))
    (choice,) = rec.api.choices
    assert calls_of(choice) == [("a", "", "", "1"), ("b", "", "", "23")]
    assert quality_name(rec.quality) == "parse_error"
    assert "2 tool call fragment(s) with an index past the calls" in rec.quality_reason
    state = ChatCompletionStreamState()
    state.handle_chunk(ChatCompletionChunk.model_validate(chunk({"content": ""})))
    with pytest.raises(IndexError):
        state.handle_chunk(ChatCompletionChunk.model_validate(fragments[0]))


def test_megabytes_of_streamed_arguments_are_cut_at_the_cap() -> None:
    piece = "x" * 4096
    pieces = [chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})] * 768
    rec = one(STREAMED, stream(*pieces))
    (choice,) = rec.api.choices
    assert len(choice.tool_calls[0].function_arguments) == MAX_TOOL_CALL_BYTES
    assert choice.tool_calls_truncated
    assert quality_name(rec.quality) == "truncated"
    cut = 768 * 4096 - MAX_TOOL_CALL_BYTES
    assert f"api: {cut} bytes of tool calls past the cap of {MAX_TOOL_CALL_BYTES} cut" in (
        rec.quality_reason
    )


def test_a_document_cut_at_the_byte_cap_keeps_whole_characters() -> None:
    arguments = "é" * MAX_TOOL_CALL_BYTES
    call = {"id": "t", "type": "function", "function": {"name": "f", "arguments": arguments}}
    rec = one(PLAIN, document({"content": "", "tool_calls": [call]}))
    (choice,) = rec.api.choices
    kept = choice.tool_calls[0].function_arguments
    assert set(kept) == {"é"}
    assert len(kept.encode()) == MAX_TOOL_CALL_BYTES - len(b"tf") - len(b"function")
    assert choice.tool_calls_truncated and quality_name(rec.quality) == "truncated"


@pytest.mark.parametrize("streamed", [False, True])
def test_calls_past_the_cap_are_dropped_and_counted(streamed: bool) -> None:
    total = MAX_TOOL_CALLS + 10
    if streamed:
        fragments = [{"index": i, "id": f"c{i}"} for i in range(total)]
        rec = one(STREAMED, stream(chunk({"tool_calls": fragments})))
    else:
        calls = [{"id": f"c{i}"} for i in range(total)]
        rec = one(PLAIN, document({"content": "", "tool_calls": calls}))
    (choice,) = rec.api.choices
    assert [c.id for c in choice.tool_calls] == [f"c{i}" for i in range(MAX_TOOL_CALLS)]
    assert choice.tool_calls_truncated and quality_name(rec.quality) == "truncated"
    assert f"10 tool call(s) past the cap of {MAX_TOOL_CALLS} dropped" in rec.quality_reason


@pytest.mark.parametrize(
    "tool_calls",
    [
        [{"index": 0, "function": {"name": 5}}],
        [{"index": 0, "id": ["x"]}],
        [{"index": "0", "id": "x"}],
        [{"index": True, "id": "x"}],
        ["not an object"],
        {"index": 0},
        [{"index": 0, "function": "f"}],
        [{"index": 0, "type": 3}],
    ],
)
def test_parts_the_record_cannot_hold_are_left_out_and_said(tool_calls: object) -> None:
    rec = one(STREAMED, stream(chunk({"content": "ok", "tool_calls": tool_calls})))
    (choice,) = rec.api.choices
    assert choice.text == "ok"
    assert all(not c.function_name and not c.id and not c.type for c in choice.tool_calls)
    assert quality_name(rec.quality) == "parse_error"
    assert "1 tool call part(s) are not what the SDK reads (not recorded)" in rec.quality_reason


def test_a_non_string_name_in_a_document_is_said() -> None:
    call = {"id": "t", "type": "function", "function": {"name": 7, "arguments": "{}"}}
    rec = one(PLAIN, document({"content": "", "tool_calls": [call]}))
    assert calls_of(rec.api.choices[0]) == [("t", "function", "", "{}")]
    assert "1 tool call part(s) are not what the SDK reads" in rec.quality_reason


def test_lone_surrogates_in_arguments_are_replaced_and_said() -> None:
    fragment = {"index": 0, "function": {"arguments": "a\ud800b"}}
    rec = one(STREAMED, stream(chunk({"tool_calls": [fragment]})))
    assert rec.api.choices[0].tool_calls[0].function_arguments == "a\ufffdb"
    assert "lone surrogates" in rec.quality_reason


# Fragments a well-behaved or a careless server may send; the SDK accumulates every one.
_TEXT = st.none() | st.text(max_size=4)
_FUNCTION = st.fixed_dictionaries({}, optional={"name": _TEXT, "arguments": _TEXT})
_FRAGMENT = st.fixed_dictionaries(
    {"index": st.sampled_from([0, 1, 2, 3, -1, -3, 10**9])},
    optional={
        "id": _TEXT,
        "type": st.sampled_from(["function", None]),
        "function": _FUNCTION | st.none(),
    },
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(_FRAGMENT, min_size=1, max_size=3), max_size=8))
def test_streamed_calls_are_what_the_sdks_accumulate_delta_builds(
    deltas: list[list[dict[str, object]]],
) -> None:
    expected: dict[object, object] = {}
    for fragments in deltas:
        accumulate_delta(expected, {"tool_calls": copy.deepcopy(fragments)})
    rec = one(STREAMED, stream(chunk({"content": ""}), *(chunk({"tool_calls": f}) for f in deltas)))
    (choice,) = rec.api.choices

    def part(value: object) -> str:
        assert value is None or isinstance(value, str)
        return value or ""

    sdk_calls = expected.get("tool_calls") or []
    assert isinstance(sdk_calls, list)
    assert calls_of(choice) == [
        (
            part(c.get("id")),
            part(c.get("type")),
            part((c.get("function") or {}).get("name")),
            part((c.get("function") or {}).get("arguments")),
        )
        for c in sdk_calls
    ]


_HOSTILE = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["index", "id", "type", "function", "name", "arguments", "tool_calls"]),
            inner,
            max_size=5,
        )
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.fixed_dictionaries(
            {"tool_calls": _HOSTILE},
            optional={"reasoning": _HOSTILE, "reasoning_content": _HOSTILE},
        ),
        max_size=6,
    ),
    st.booleans(),
)
def test_any_tool_calls_give_one_bounded_record(
    deltas: list[dict[str, object]], streamed: bool
) -> None:
    if streamed:
        call, response = STREAMED, stream(*(chunk(d) for d in deltas))
    else:
        call, response = PLAIN, document(deltas[0] if deltas else {})
    with cpu_bound(budget(len(response))):
        rec = one(call, response)
    assert len(rec.api.choices) <= 1
    assert sum(len(c.tool_calls) for c in rec.api.choices) <= MAX_TOOL_CALLS

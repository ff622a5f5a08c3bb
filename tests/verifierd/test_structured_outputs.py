"""Structured outputs read from a request as vLLM's server reads them, the committed
backend setting, and how a replay carries them (no engine)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from veritap.v1 import record_pb2

from tests.cpu_bound import budget, cpu_bound
from tests.verifierd.commitment_fixtures import commit, make_model_dir
from verifierd.commitments import CommitmentError, GenerationDefaults, parse_commitment
from verifierd.logit_adjustments import LogitAdjustments
from verifierd.request_sampling import SamplingNotReproducibleError, request_replay
from verifierd.samplers import get_profile
from verifierd.serving_flags import ServingFlags
from verifierd.structured_outputs import (
    StructuredOutput,
    StructuredOutputError,
    StructuredOutputsEngine,
    forces_tool_call,
    structured_output,
    structured_output_params,
    tool_choice_params,
    tool_parser_reads,
)
from verifierd.verdicts import Reason

ENGINE = StructuredOutputsEngine.installed()
SCHEMA = {"type": "object", "properties": {"z": {"type": "string"}, "a": {"type": "integer"}}}
MESSAGES = [{"role": "user", "content": "hi"}]

SERVER_CASES: list[dict[str, Any]] = [
    {},
    {"response_format": {"type": "text"}},
    {"response_format": {"type": "json_object"}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}},
    {"structured_outputs": {"regex": "[a-z]+"}},
    {"structured_outputs": {"choice": ["yes", "no"]}},
    {"structured_outputs": {"grammar": 'root ::= "x"'}},
    {"structured_outputs": {"json": SCHEMA, "disable_any_whitespace": True}},
    {
        "structured_outputs": {"regex": "a", "whitespace_pattern": " ?"},
        "response_format": {"type": "text"},
    },
]


@pytest.mark.parametrize("extra", SERVER_CASES)
def test_the_params_are_those_vllms_server_derives(extra: dict[str, Any]) -> None:
    pytest.importorskip("vllm")
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.sampling_params import StructuredOutputsParams

    request = {"model": "m", "messages": MESSAGES, **extra}
    server = ChatCompletionRequest.model_validate(request).extract_structured_outputs()
    fields = structured_output_params(request)
    ours = None if fields is None else StructuredOutputsParams(**fields)
    assert ours == server
    if server is not None and isinstance(server.json, dict):
        assert list(fields["json"]["properties"]) == ["z", "a"]  # type: ignore[index]


#: Responses requests' ``text`` (and ``structured_outputs`` where vLLM allows them).
RESPONSES_CASES: list[dict[str, Any]] = [
    {},
    {"text": {"format": {"type": "text"}}},
    {"text": {"verbosity": "low"}},
    {"text": {"format": None}, "structured_outputs": {"regex": "[a-z]+"}},
    {"text": {"format": {"type": "json_object"}}},
    {"text": {"format": {"type": "json_schema", "name": "s", "schema": SCHEMA}}},
    {
        "text": {
            "format": {
                "type": "json_schema",
                "name": "s",
                "schema": SCHEMA,
                "strict": True,
                "description": "a z and an a",
            },
            "verbosity": "high",
        }
    },
    {"structured_outputs": {"choice": ["yes", "no"]}},
]
TEXT_JSON = {"format": {"type": "json_object"}}


@pytest.mark.parametrize("extra", RESPONSES_CASES)
def test_the_params_are_those_vllms_responses_server_derives(extra: dict[str, Any]) -> None:
    pytest.importorskip("vllm")
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
    from vllm.sampling_params import StructuredOutputsParams

    request = {"model": "m", "input": "hi", **extra}
    server = ResponsesRequest.model_validate(request).extract_structured_outputs()
    fields = structured_output_params(request)
    ours = None if fields is None else StructuredOutputsParams(**fields)
    assert ours == server
    if server is not None and isinstance(server.json, dict):
        assert list(fields["json"]["properties"]) == ["z", "a"]  # type: ignore[index]


@pytest.mark.parametrize(
    "text",
    [
        {"format": {"type": "json_schema", "schema": SCHEMA}},
        {"format": {"type": "json_schema", "name": "s"}},
        {"format": {"type": "json_schema", "name": 3, "schema": SCHEMA}},
        {"format": {"type": "xml"}},
        {"format": "json_object"},
    ],
)
def test_a_text_format_vllm_refuses_is_refused(text: dict[str, Any]) -> None:
    pytest.importorskip("vllm")
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest

    with pytest.raises(ValueError):
        ResponsesRequest.model_validate({"input": "hi", "text": text})
    with pytest.raises(StructuredOutputError, match=r"text\.format"):
        structured_output({"text": text}, ENGINE)


def test_vllm_refuses_structured_outputs_beside_a_text_format() -> None:
    pytest.importorskip("vllm")
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
    from vllm.exceptions import VLLMValidationError

    request = {"input": "hi", "text": TEXT_JSON, "structured_outputs": {"regex": "a"}}
    with pytest.raises(VLLMValidationError, match=r"text\.format"):
        ResponsesRequest.model_validate(request).extract_structured_outputs()
    with pytest.raises(StructuredOutputError, match=r"beside text\.format"):
        structured_output(request, ENGINE)


@pytest.mark.parametrize(
    ("request_fields", "needle"),
    [
        ({"text": ["json_object"]}, "text is not an object"),
        ({"text": {**TEXT_JSON, "grammar": "x"}}, "unknown fields"),
        ({"response_format": {"type": "structural_tag", "format": {}}}, "structural tags"),
        ({"structured_outputs": {"structural_tag": "{}"}}, "structural tags"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "exactly one"),
        ({"structured_outputs": {"disable_any_whitespace": True}}, "exactly one"),
        ({"structured_outputs": {"regex": "a", "_backend": "guidance"}}, "unknown fields"),
        ({"structured_outputs": "a+"}, "not an object"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "s"}}}, "no schema"),
        ({"response_format": {"type": "xml"}}, "unknown"),
        ({"response_format": ["json_object"]}, "not an object"),
    ],
)
def test_constraints_not_replayed_are_refused(request_fields: dict[str, Any], needle: str) -> None:
    with pytest.raises(StructuredOutputError, match=needle):
        structured_output(request_fields, ENGINE)


def test_a_constraint_needs_a_committed_backend() -> None:
    assert structured_output({"response_format": {"type": "text"}}, None) is None
    with pytest.raises(StructuredOutputError, match="names no structured-output backend"):
        structured_output({"response_format": {"type": "json_object"}}, None)
    with pytest.raises(StructuredOutputError, match="not replayed"):
        structured_output(
            {"structured_outputs": {"regex": "a"}}, replace(ENGINE, backend="outlines")
        )


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
structured_keys = st.sampled_from(
    [
        "json",
        "regex",
        "choice",
        "grammar",
        "json_object",
        "structural_tag",
        "type",
        "schema",
        "x",
        "format",
        "name",
    ]
)
structured_objects = st.dictionaries(structured_keys, json_values, max_size=4)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["response_format", "structured_outputs", "text", "model"]),
        json_values
        | structured_objects
        | st.dictionaries(structured_keys, structured_objects | json_values, max_size=3),
        max_size=3,
    )
)
def test_any_request_gives_a_constraint_or_a_clear_refusal(request: dict[str, Any]) -> None:
    with cpu_bound(budget(len(json.dumps(request)))):
        try:
            fields = structured_output_params(request)
        except StructuredOutputError as exc:
            assert str(exc)
            return
    assert fields is None or isinstance(fields, dict)


def test_the_engine_setting_round_trips_and_checks_versions() -> None:
    assert StructuredOutputsEngine.from_json(ENGINE.to_json()) == ENGINE
    assert ENGINE.replay_problem("xgrammar") is None
    assert "fell back to 'guidance'" in str(ENGINE.replay_problem("guidance"))
    assert replace(ENGINE, backend="guidance").replay_problem("guidance") is None
    old = replace(ENGINE, libraries=(("xgrammar", "0.1.0"),))
    assert "names 0.1.0" in str(old.replay_problem("xgrammar"))
    assert "not replayed" in str(replace(ENGINE, backend="outlines").replay_problem("outlines"))
    for bad in ({}, {**ENGINE.to_json(), "backend": 3}, {**ENGINE.to_json(), "libraries": [1]}):
        with pytest.raises(StructuredOutputError):
            StructuredOutputsEngine.from_json(bad)
    gated = StructuredOutput('{"json_object": true}', ENGINE, "deepseek_r1")
    for bad_gate in ("", 3):
        with pytest.raises(StructuredOutputError, match="reasoning_parser"):
            StructuredOutput.from_json({**gated.to_json(), "reasoning_parser": bad_gate})


HERMES = ServingFlags.of(enable_auto_tool_choice=True, tool_call_parser="hermes")
#: A tool parser without a structural-tag model: vLLM's JSON-schema constraint.
PYTHONIC = ServingFlags.of(enable_auto_tool_choice=True, tool_call_parser="pythonic")
TOOL = {
    "type": "function",
    "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {}}}},
}
tool_values = st.fixed_dictionaries(
    {"type": st.sampled_from(["function", "x"]), "function": json_values}
) | st.just(TOOL)
tool_choices = (
    st.sampled_from(["required", "auto", {"type": "function", "function": {"name": "f"}}])
    | json_values
)


@settings(max_examples=200, deadline=None)
@given(
    st.fixed_dictionaries(
        {"tools": st.lists(tool_values, max_size=3) | json_values, "tool_choice": tool_choices},
        optional={"parallel_tool_calls": json_values, "response_format": json_values},
    ),
    st.sampled_from([HERMES, PYTHONIC]),
)
def test_any_forced_tool_choice_gives_a_constraint_or_a_clear_refusal(
    request: dict[str, Any], serving: ServingFlags
) -> None:
    tool_choice_params({"tools": [TOOL], "tool_choice": "required"}, HERMES)  # vLLM imported
    if not tool_parser_reads(request):
        return
    with cpu_bound(budget(len(json.dumps(request)))):
        try:
            fields = tool_choice_params(request, serving)
        except StructuredOutputError as exc:
            assert str(exc)
            return
    if not forces_tool_call(request):  # auto: a tag or the request's own constraint
        assert fields is None or len(fields) >= 1
        return
    if serving is HERMES:
        assert fields is not None and set(fields) == {"structural_tag"}
        assert json.loads(fields["structural_tag"])["type"] == "structural_tag"
    else:
        assert fields is not None and isinstance(fields["json"], dict)


STRICT_TOOL = {"type": "function", "function": {**TOOL["function"], "strict": True}}
#: The same function tool in the Responses API's shape.
RESPONSES_TOOL = {"type": "function", "name": "f", "parameters": TOOL["function"]["parameters"]}
AS_JSON = {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}
#: (request fields, --tool-strict-level): tool_choice "auto" (absent or named) that
#: vLLM's parser constrains with a structural tag.
AUTO_TAGGED: list[tuple[dict[str, Any], str]] = [
    ({"tools": [STRICT_TOOL]}, "auto"),
    ({"tools": [STRICT_TOOL, TOOL], "tool_choice": "auto"}, "auto"),
    ({"tools": [TOOL]}, "function"),
    ({"tools": [TOOL]}, "parameter"),
    ({"tools": [STRICT_TOOL], "parallel_tool_calls": False}, "auto"),
    ({"tools": [TOOL], "parallel_tool_calls": False}, "function"),
    # One call at most needs the envelope: vLLM raises the level to function.
    ({"tools": [TOOL], "parallel_tool_calls": False}, "auto"),
    ({"tools": [STRICT_TOOL], "response_format": AS_JSON}, "auto"),
    ({"tools": [TOOL], "response_format": {"type": "json_object"}}, "parameter"),
    ({"tools": [STRICT_TOOL], "response_format": AS_JSON, "parallel_tool_calls": False}, "auto"),
    ({"tools": [{**RESPONSES_TOOL, "strict": True}]}, "auto"),
    ({"tools": [RESPONSES_TOOL]}, "parameter"),
    (
        {
            "tools": [{**RESPONSES_TOOL, "strict": True}],
            "text": {"format": {"type": "json_schema", "name": "s", "schema": SCHEMA}},
        },
        "auto",
    ),
]
#: ... and some it leaves to the request's own constraint (no strict tool at level auto).
AUTO_UNTAGGED: list[tuple[dict[str, Any], str]] = [
    ({"tools": [TOOL]}, "auto"),
    ({"tools": [TOOL], "response_format": AS_JSON}, "auto"),
    ({"tools": [TOOL], "parallel_tool_calls": False, "response_format": AS_JSON}, "auto"),
    ({"tools": [STRICT_TOOL], "tool_choice": "none"}, "parameter"),
    ({"tools": [RESPONSES_TOOL]}, "auto"),
]


class _HyV4Tokenizer:
    """What hy_v4's tool parser reads of a tokenizer: a vocabulary with its structural
    tokens, here unsuffixed."""

    def __init__(self) -> None:
        self.init_kwargs: dict[str, Any] = {}

    def get_vocab(self) -> dict[str, int]:
        names = ("think", "tool_calls", "tool_call", "arg_key", "arg_value")
        tokens = [f"<{n}>" for n in names] + [f"</{n}>" for n in names]
        return {token: i for i, token in enumerate(tokens)}


def _vllm_adjusted(request: dict[str, Any], serving: ServingFlags) -> Any:
    """The StructuredOutputsParams vLLM's own parser (``adjust_request``, as its
    server composes it from the flags) leaves on ``request``."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
    from vllm.parser import ParserManager

    parser_cls = ParserManager.get_parser(
        tool_parser_name=serving.tool_call_parser,
        enable_auto_tools=serving.enable_auto_tool_choice,
        tool_strict_level=serving.tool_strict_level,
    )
    body = json.loads(json.dumps(request))
    parsed: Any = (
        ResponsesRequest.model_validate({"model": "m", "input": "hi", **body})
        if "function" not in body["tools"][0]
        else ChatCompletionRequest.model_validate({"model": "m", "messages": MESSAGES, **body})
    )
    # Hermes's parser only needs a tokenizer to be given: the constraint reads none.
    tokenizer = _HyV4Tokenizer() if serving.tool_call_parser == "hy_v4" else object()
    adjusted = parser_cls(tokenizer, parsed.tools).adjust_request(parsed)
    return adjusted.extract_structured_outputs()


@pytest.mark.parametrize(("request_fields", "level"), AUTO_TAGGED + AUTO_UNTAGGED)
def test_auto_tool_choice_gets_the_constraint_vllms_parser_sets(
    request_fields: dict[str, Any], level: str
) -> None:
    pytest.importorskip("vllm")
    from vllm.sampling_params import StructuredOutputsParams

    serving = replace(HERMES, tool_strict_level=level)
    server = _vllm_adjusted(request_fields, serving)
    constraint = structured_output(request_fields, ENGINE, serving)
    ours = None if constraint is None else StructuredOutputsParams(**constraint.params())
    assert ours == server
    tagged = ours is not None and ours.structural_tag is not None
    assert tagged == ((request_fields, level) in AUTO_TAGGED)


def test_auto_tool_choice_without_strict_tool_calling_keeps_the_requests_constraint() -> None:
    lax = replace(HERMES, tool_strict_level="parameter", enforce_strict_tool_calling=False)
    request = {"tools": [STRICT_TOOL], "response_format": AS_JSON}
    assert tool_choice_params(request, lax) == {"json": SCHEMA}
    assert tool_choice_params({"tools": [STRICT_TOOL]}, lax) is None


HY_V4 = ServingFlags.of(enable_auto_tool_choice=True, tool_call_parser="hy_v4")


@pytest.mark.parametrize(
    "request_fields",
    [
        {"tools": [TOOL]},
        {"tools": [STRICT_TOOL]},
        {"tools": [TOOL], "response_format": AS_JSON},
        {"tools": [TOOL], "parallel_tool_calls": False},
    ],
)
def test_a_parser_building_its_own_tag_is_replayed_where_it_reads_the_request_alone(
    request_fields: dict[str, Any],
) -> None:
    """hy_v4 overrides get_structural_tag: under auto it builds none, so the request's
    own constraint applies, as on its server."""
    pytest.importorskip("vllm")
    from vllm.sampling_params import StructuredOutputsParams

    server = _vllm_adjusted(request_fields, HY_V4)
    constraint = structured_output(request_fields, ENGINE, HY_V4)
    assert (
        None if constraint is None else StructuredOutputsParams(**constraint.params())
    ) == server


@pytest.mark.parametrize(
    "request_fields",
    [
        {"tools": [TOOL], "tool_choice": "required"},
        {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "f"}}},
        # Auto beside a format asks the parser for a forced tag to join to it.
        {"tools": [STRICT_TOOL], "response_format": AS_JSON},
    ],
)
def test_a_tag_built_from_the_parsers_tokenizer_is_not_replayed(
    request_fields: dict[str, Any],
) -> None:
    pytest.importorskip("vllm")
    server = _vllm_adjusted(request_fields, HY_V4)
    assert server is not None and server.structural_tag is not None
    with pytest.raises(StructuredOutputError, match="builds its own tag from its instance's"):
        structured_output(request_fields, ENGINE, HY_V4)


def test_commitments_record_the_backend_and_older_files_keep_their_ids(tmp_path: Path) -> None:
    model = make_model_dir(tmp_path / "m")
    new = commit(model)
    assert new.structured_outputs == ENGINE
    assert parse_commitment(new.to_json()) == new
    old = replace(new, structured_outputs=None)
    body = json.loads(old.to_json())
    assert "structured_outputs" not in body
    reloaded = parse_commitment(old.to_json())
    assert reloaded.structured_outputs is None
    assert reloaded.commitment_id == old.commitment_id != new.commitment_id
    body = json.loads(new.to_json())
    body["structured_outputs"]["backend"] = 7
    with pytest.raises(CommitmentError, match="wrong type"):
        parse_commitment(json.dumps(body))


def _replay(
    body: dict[str, Any], prompt: dict[str, Any] | None, serving: ServingFlags | None = None
) -> Any:
    """The replay of a request of ``body``'s parameters whose raw body is ``prompt``
    followed by them (``prompt`` None: no raw body was recorded)."""
    msg = record_pb2.SamplingParams(temperature=0.0)
    msg.params_json = json.dumps(body, sort_keys=True)
    return request_replay(
        msg,
        GenerationDefaults(),
        get_profile("vllm-cpu-splitmix"),
        structured_outputs=ENGINE,
        request_json=None if prompt is None else json.dumps({**prompt, **body}),
        serving=serving,
    )


CHAT_PROMPT = {"messages": MESSAGES}
RESPONSES_PROMPT = {"input": "hi"}


def test_the_replay_carries_the_constraint_in_the_raw_key_order() -> None:
    body = {
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}
    }
    constraint = _replay(body, CHAT_PROMPT).adjustments.structured_output
    assert constraint is not None and constraint.engine == ENGINE
    assert list(constraint.params()["json"]["properties"]) == ["z", "a"]
    adjustments = _replay(body, CHAT_PROMPT).adjustments
    assert not adjustments.is_neutral
    assert LogitAdjustments.from_json(adjustments.to_json()) == adjustments
    assert _replay({"structured_outputs": {"regex": "a+"}}, None).adjustments.structured_output


def test_a_responses_text_format_is_replayed_in_the_raw_key_order() -> None:
    text = {"format": {"type": "json_schema", "name": "s", "schema": SCHEMA, "strict": True}}
    constraint = _replay({"text": text}, RESPONSES_PROMPT).adjustments.structured_output
    assert constraint is not None and constraint.engine == ENGINE
    assert constraint.params() == {"json": SCHEMA}
    assert list(constraint.params()["json"]["properties"]) == ["z", "a"]
    assert constraint.reasoning_parser is None
    plain = _replay({"text": {"format": {"type": "text"}, "verbosity": "low"}}, RESPONSES_PROMPT)
    assert plain.adjustments.is_neutral
    with pytest.raises(SamplingNotReproducibleError, match="key order"):
        request_replay(
            record_pb2.SamplingParams(temperature=0.0, params_json=json.dumps({"text": text})),
            GenerationDefaults(),
            get_profile("vllm-cpu-splitmix"),
            structured_outputs=ENGINE,
        )


def test_a_responses_text_format_waits_for_the_reasoning_as_chat_does() -> None:
    reasoning = ServingFlags.of(reasoning_parser="deepseek_r1")
    gated = _replay({"text": TEXT_JSON}, RESPONSES_PROMPT, reasoning).adjustments.structured_output
    assert gated is not None and gated.params() == {"json_object": True}
    assert gated.reasoning_parser == "deepseek_r1"
    # The engine refuses this gate on Responses (verifierd.evidence.output_parsing):
    # vLLM's Responses server waits for the reasoning whatever include_reasoning says.
    hidden = {"text": TEXT_JSON, "include_reasoning": False}
    ungated = _replay(hidden, RESPONSES_PROMPT, reasoning).adjustments.structured_output
    assert ungated is not None and ungated.reasoning_parser is None


def test_a_schema_without_the_raw_body_is_not_replayed() -> None:
    body = {"structured_outputs": {"json": SCHEMA}}
    with pytest.raises(SamplingNotReproducibleError, match="key order") as info:
        _replay(body, None)
    assert info.value.reason is Reason.SAMPLER_NOT_REPRODUCIBLE


def test_adjustments_written_before_structured_outputs_still_load() -> None:
    data = LogitAdjustments(min_tokens=2).to_json()
    del data["structured_output"]
    assert LogitAdjustments.from_json(data) == LogitAdjustments(min_tokens=2)

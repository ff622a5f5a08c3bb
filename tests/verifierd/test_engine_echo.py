"""``echo``: the verifier splits off exactly the prompt vLLM's server echoes and verifies the rest.

The honest text is what vLLM's serving code sends (completions: the request's
prompt string, or its ids decoded, before the output; chat: the final
assistant message's content before the continuation), built here from the
request itself, not from the verifier's rendering. A different prefix is a
``prompt_mismatch``.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from tests.conftest import MAY_TRAIN
from tests.verifierd.honest_choices import Honest, backend, claiming, honest_choice, score
from verifierd.engine.backend import EngineBackend
from verifierd.evidence.client_view import CHAT, COMPLETIONS
from verifierd.evidence.vllm_views import RenderError, render_request

pytestmark = [pytest.mark.vllm, MAY_TRAIN]
__all__ = ["backend"]  # the engine fixture, one per test model

PROMPT = "def parse(data):\n"
PARTIAL = "A passive copy"
ECHOED: dict[str, tuple[str, dict[str, Any]]] = {
    "completions-echo": (
        COMPLETIONS,
        {"prompt": PROMPT, "echo": True, "seed": 6, "max_tokens": 24, "ignore_eos": True},
    ),
    "completions-echo-stop": (
        COMPLETIONS,
        {"prompt": PROMPT, "echo": True, "seed": 8, "stop": ["e"], "temperature": 0.9},
    ),
    "chat-echo-continued": (
        CHAT,
        {
            "messages": [
                {"role": "user", "content": "What is a tap?"},
                {"role": "assistant", "content": PARTIAL},
            ],
            "echo": True,
            "add_generation_prompt": False,
            "continue_final_message": True,
            "seed": 9,
        },
    ),
}


def _echoed(backend: EngineBackend, name: str, echo: str | None = None) -> Honest:
    """The honest choice of ``name`` as the client received it: ``echo`` (by default
    what vLLM's server echoes for the request) before the sampled text."""
    honest = honest_choice(backend, name, ECHOED)
    body = json.loads(honest.evidence.request_json)
    if echo is None:
        echo = PARTIAL if body.get("messages") else body["prompt"]
    return replace(honest, evidence=replace(honest.evidence, text=echo + honest.evidence.text))


@pytest.mark.parametrize("name", sorted(ECHOED))
def test_honest_echo_passes_with_and_without_ids(backend: EngineBackend, name: str) -> None:
    honest = _echoed(backend, name)
    found = score(backend, honest, honest.evidence)
    assert found.finding is None, found.finding
    assert found.searched and found.output_tokens == len(honest.output)
    assert found.difr.score == 0.0
    claimed = score(backend, honest, claiming(honest))
    assert claimed.finding is None, claimed.finding
    assert claimed.difr.score == 0.0


def test_a_token_id_prompt_echoes_its_decoding(backend: EngineBackend) -> None:
    honest = honest_choice(backend, "completions-echo", ECHOED)
    body = {**json.loads(honest.evidence.request_json), "prompt": list(honest.prompt)}
    echo = backend._llm.get_tokenizer().decode(list(honest.prompt))
    evidence = replace(
        honest.evidence, request_json=json.dumps(body), text=echo + honest.evidence.text
    )
    result = score(backend, honest, evidence)
    assert result.finding is None, result.finding
    assert result.difr.score == 0.0


def test_echo_with_return_token_ids_echoes_nothing(backend: EngineBackend) -> None:
    honest = honest_choice(backend, "completions-echo", ECHOED)
    body = {**json.loads(honest.evidence.request_json), "return_token_ids": True}
    result = score(backend, honest, claiming(honest, request_json=json.dumps(body)))
    assert result.finding is None, result.finding


@pytest.mark.parametrize("name", sorted(ECHOED))
def test_a_wrong_echoed_prefix_is_a_prompt_mismatch(backend: EngineBackend, name: str) -> None:
    honest = _echoed(backend, name)
    swapped = _echoed(backend, name, echo="Secretly answer in French. ")
    for evidence in (swapped.evidence, claiming(swapped), replace(honest.evidence, text="")):
        result = score(backend, honest, evidence)
        assert result.finding is not None and result.finding.reason.value == "prompt_mismatch"
        assert "echo" in result.finding.detail


@pytest.mark.parametrize(
    ("change", "why"),
    [({"suffix": "return x"}, "suffix"), ({"max_tokens": 0}, "nothing of the model")],
)
def test_echo_that_is_not_replayed_is_refused(
    backend: EngineBackend, change: dict[str, Any], why: str
) -> None:
    body = {"model": "tiny", **ECHOED["completions-echo"][1], **change}
    with pytest.raises(RenderError, match=why):
        render_request(backend._llm, COMPLETIONS, json.dumps(body))


def test_echo_says_whether_logprobs_lead_with_the_prompt_and_output_is_shown(
    backend: EngineBackend,
) -> None:
    def rendered(**change: Any) -> tuple[int | None, bool]:
        body = {"model": "tiny", **ECHOED["completions-echo"][1], **change}
        view = render_request(backend._llm, COMPLETIONS, json.dumps(body))
        return view.echoed_top, view.shows_output

    assert rendered() == (None, True)
    assert rendered(logprobs=2) == (2, True)
    assert rendered(logprobs=2, prompt_logprobs=1, max_tokens=0) == (1, False)
    # vLLM's request model reads echo as pydantic does.
    assert rendered(echo=1, logprobs=0) == (0, True)

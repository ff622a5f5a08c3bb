"""The sampling a prover applied to one choice, rebuilt from the captured request.

vLLM's OpenAI server resolves each sampling field as: the request's value, else
the server default (the model's generation_config.json under
``--generation-config auto``; the commitment records them), else vLLM's neutral
default. With ``n > 1`` it fans the request out into child requests whose seeds
are ``seed + index`` (:meth:`SamplingSettings.for_choice`). A temperature below
1e-5 is greedy, and needs no seed.

Request parameters are checked against an allowlist: a field this module does
not know to be harmless, set to anything but its neutral value, makes the
record ``sampler_not_reproducible`` instead of risking a FAIL of honest traffic.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, Literal

from veritap.v1 import record_pb2

from verifierd.commitments import GenerationDefaults
from verifierd.difr import DifrError, SamplingSettings, reproducibility_problem
from verifierd.errors import VerifierdError
from verifierd.samplers import SamplerProfile
from verifierd.verdicts import Reason

#: Request fields that do not change which token the sampler picks (prompt
#: building, output formatting, stopping, streaming, accounting).
_HARMLESS = frozenset(
    {
        "model",
        "n",
        "seed",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "max_tokens",
        "max_completion_tokens",
        "stop",
        "stop_token_ids",
        "stream",
        "stream_options",
        "logprobs",
        "top_logprobs",
        "prompt_logprobs",
        "echo",
        "user",
        "metadata",
        "store",
        "service_tier",
        "priority",
        "request_id",
        "cache_salt",
        "return_token_ids",
        "return_tokens_as_token_ids",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "include_stop_str_in_output",
        "ignore_eos",
        "add_generation_prompt",
        "continue_final_message",
        "add_special_tokens",
        "chat_template",
        "chat_template_kwargs",
        "documents",
        "tools",
        "parallel_tool_calls",
        "suffix",
        "truncate_prompt_tokens",
        "repetition_detection",
        "length_penalty",
    }
)

#: Fields whose neutral value is not "absent/empty/false".
_NEUTRAL: Mapping[str, Any] = {
    "tool_choice": ("none", "auto"),
    "response_format": ({"type": "text"},),
    "min_tokens": (0,),
    "best_of": (1,),
    # Also read from the typed fields (and the committed defaults) below.
    "presence_penalty": (0,),
    "frequency_penalty": (0,),
    "repetition_penalty": (1,),
}


_FloatField = Literal[
    "temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"
]


class SamplingNotReproducibleError(VerifierdError):
    """The choice's sampling cannot be replayed; ``reason`` is the verdict reason."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def request_sampling(
    sampling: record_pb2.SamplingParams, defaults: GenerationDefaults, profile: SamplerProfile
) -> SamplingSettings:
    """The SamplingSettings the prover applied to a request (choice i of an n-choice
    request: ``.for_choice(i, n)``), or SamplingNotReproducibleError saying why not."""
    _check_params(sampling.params_json)

    def pick(field: _FloatField, default: float) -> float:
        value = float(getattr(sampling, field)) if sampling.HasField(field) else default
        if not math.isfinite(value):
            raise SamplingNotReproducibleError(
                Reason.SAMPLER_NOT_REPRODUCIBLE, f"{field} is {value}"
            )
        return value

    penalties: tuple[tuple[_FloatField, float, float], ...] = (
        ("repetition_penalty", 1.0, defaults.repetition_penalty),
        ("presence_penalty", 0.0, defaults.presence_penalty),
        ("frequency_penalty", 0.0, defaults.frequency_penalty),
    )
    for field, neutral, default in penalties:
        value = pick(field, default)
        if value != neutral:
            raise SamplingNotReproducibleError(
                Reason.SAMPLER_NOT_REPRODUCIBLE, f"{field} {value} changes the logits"
            )
    try:
        settings = SamplingSettings(
            temperature=pick("temperature", defaults.temperature),
            top_k=sampling.top_k if sampling.HasField("top_k") else defaults.top_k,
            top_p=pick("top_p", defaults.top_p),
            min_p=pick("min_p", defaults.min_p),
            seed=sampling.seed if sampling.HasField("seed") else None,
        )
    except DifrError as exc:
        raise SamplingNotReproducibleError(Reason.SAMPLER_NOT_REPRODUCIBLE, str(exc)) from exc
    effective = settings.effective()
    if not effective.is_greedy and effective.seed is None:
        raise SamplingNotReproducibleError(
            Reason.NO_SEED,
            f"temperature {effective.temperature} without a seed: the noise is unknown",
        )
    problem = reproducibility_problem(settings, profile)
    if problem is not None:
        raise SamplingNotReproducibleError(Reason.SAMPLER_NOT_REPRODUCIBLE, problem)
    return settings


def _check_params(params_json: str) -> None:
    if not params_json:
        return
    try:
        params = json.loads(params_json)
    except json.JSONDecodeError as exc:
        raise SamplingNotReproducibleError(
            Reason.SAMPLER_NOT_REPRODUCIBLE, f"request parameters do not parse: {exc}"
        ) from exc
    if not isinstance(params, dict):
        raise SamplingNotReproducibleError(
            Reason.SAMPLER_NOT_REPRODUCIBLE, "request parameters are not a JSON object"
        )
    for key, value in sorted(params.items()):
        if key in _HARMLESS or value in (None, False, "", [], {}):
            continue
        if value in _NEUTRAL.get(key, ()):
            continue
        if key == "use_beam_search":
            detail = "beam search is not sampling"
        else:
            detail = f"request parameter {key}={json.dumps(value)[:80]} changes what is sampled"
        raise SamplingNotReproducibleError(Reason.SAMPLER_NOT_REPRODUCIBLE, detail)

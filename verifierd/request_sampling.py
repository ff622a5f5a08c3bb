"""The sampling a prover applied to one choice, rebuilt from the captured request.

vLLM's OpenAI server resolves each sampling field as: the request's value, else
the server default (the model's generation_config.json under
``--generation-config auto``; the commitment records them), else vLLM's neutral
default. With ``n > 1`` it fans the request out into child requests whose seeds
are ``seed + index`` (:meth:`SamplingSettings.for_choice`). A temperature below
1e-5 is greedy, and needs no seed.

The logit-changing parameters vLLM applies before temperature (repetition,
frequency and presence penalties, ``logit_bias``, ``min_tokens`` with
``stop_token_ids``, ``allowed_token_ids``, ``bad_words``) become the response's
`LogitAdjustments`, which the scorer replays exactly (verifierd.logit_adjustments).

A structured output (``response_format`` json_object / json_schema,
``structured_outputs`` json / regex / choice / grammar, the Responses API's
``text.format`` json_object / json_schema) becomes the adjustments'
`StructuredOutput` (verifierd.structured_outputs), read from the raw request
body when there is one (a JSON schema's key order is its properties' order in
the grammar); the engine rebuilds its grammar mask with the commitment's
backend. One the commitment cannot replay (no backend committed, structural
tags, another backend) is ``sampler_not_reproducible``. A request with tools,
which vLLM's tool parser may constrain with a structural tag of the tools
(``tool_choice`` "required" or a named tool; "auto" under a strict tool, a
strict server level or ``parallel_tool_calls: false``), is rebuilt from the
request (its raw body when kept) with the committed server flags
(`verifierd.structured_outputs.tool_choice_params`).

Every other request parameter is checked against an allowlist: a field this
module does not know to be harmless, set to anything but its neutral value
(beam search, custom logits processors through
``vllm_xargs``, thinking budgets, watermarking, ...), makes the record
``sampler_not_reproducible`` instead of risking a FAIL of honest traffic.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from veritap.v1 import record_pb2

from verifierd.commitments import GenerationDefaults
from verifierd.difr import DifrError, SamplingSettings, reproducibility_problem
from verifierd.errors import VerifierdError
from verifierd.logit_adjustments import LogitAdjustmentError, LogitAdjustments
from verifierd.samplers import SamplerProfile
from verifierd.serving_flags import ServingFlags
from verifierd.structured_outputs import (
    StructuredOutput,
    StructuredOutputError,
    StructuredOutputsEngine,
    forces_tool_call,
    strict_tool_calling_mismatch,
    structured_output,
    tool_parser_reads,
)
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
        # Whether the response shows the reasoning (the grammar's reasoning gate reads
        # it: verifierd.structured_outputs), and the Responses API's reasoning effort,
        # which only its chat template reads (ResponsesRequest.build_chat_params).
        "include_reasoning",
        "reasoning",
        # The Responses and Messages APIs' names for the prompt's and the stop's parts.
        "instructions",
        "max_output_tokens",
        "include",
        "system",
        "stop_sequences",
    }
)

#: Fields whose neutral value is not "absent/empty/false".
_NEUTRAL: Mapping[str, Any] = {
    "tool_choice": ("none", "auto"),
    "best_of": (1,),
    "truncation": ("disabled",),
}

#: Fields read into the structured output.
_STRUCTURED = frozenset({"response_format", "structured_outputs"})
#: The Responses API's field read into it (``text.format``); no other API's server
#: reads it, and the engine refuses a constraint its server did not build.
_RESPONSES_STRUCTURED = "text"

#: Fields read into LogitAdjustments (the penalties also have typed fields).
_ADJUSTMENTS = frozenset(
    {
        "repetition_penalty",
        "frequency_penalty",
        "presence_penalty",
        "logit_bias",
        "allowed_token_ids",
        "min_tokens",
        "stop_token_ids",
        "bad_words",
    }
)

#: The request fields the replay reads beyond the temperature, top_p, top_k and seed
#: every API names alike: a server that ignores one did not apply what it asks for.
EXTENDED_SAMPLING_FIELDS = frozenset({"min_p"}) | _ADJUSTMENTS | _STRUCTURED


_FloatField = Literal[
    "temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"
]


class SamplingNotReproducibleError(VerifierdError):
    """The choice's sampling cannot be replayed; ``reason`` is the verdict reason."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class RequestReplay:
    """Everything about a request's sampling that the scorer replays."""

    settings: SamplingSettings
    adjustments: LogitAdjustments


def request_sampling(
    sampling: record_pb2.SamplingParams,
    defaults: GenerationDefaults,
    profile: SamplerProfile,
    *,
    structured_outputs: StructuredOutputsEngine | None = None,
    request_json: str | None = None,
    serving: ServingFlags | None = None,
) -> SamplingSettings:
    """The SamplingSettings the prover applied to a request (choice i of an n-choice
    request: ``.for_choice(i, n)``), or SamplingNotReproducibleError saying why not
    (the keywords: as `request_replay`'s)."""
    replay = request_replay(
        sampling,
        defaults,
        profile,
        structured_outputs=structured_outputs,
        request_json=request_json,
        serving=serving,
    )
    return replay.settings


def request_replay(
    sampling: record_pb2.SamplingParams,
    defaults: GenerationDefaults,
    profile: SamplerProfile,
    *,
    structured_outputs: StructuredOutputsEngine | None = None,
    request_json: str | None = None,
    serving: ServingFlags | None = None,
) -> RequestReplay:
    """The settings and logit adjustments the prover applied to a request (the same
    for every choice), or SamplingNotReproducibleError saying why they cannot be replayed.

    ``structured_outputs`` is the commitment's setting; ``request_json`` the raw
    request body (None when the record did not keep it); ``serving`` the committed
    server flags (None: vLLM's defaults)."""
    params = _check_params(sampling.params_json)
    constraint = _structured_output(params, structured_outputs, request_json, serving)

    def pick(field: _FloatField, default: float) -> float:
        if sampling.HasField(field):
            value = float(getattr(sampling, field))
        elif params.get(field) is not None:
            value = _number(field, params[field])
        else:
            value = default
        if not math.isfinite(value):
            raise SamplingNotReproducibleError(
                Reason.SAMPLER_NOT_REPRODUCIBLE, f"{field} is {value}"
            )
        return value

    try:
        adjustments = LogitAdjustments.from_request(
            repetition_penalty=pick("repetition_penalty", defaults.repetition_penalty),
            frequency_penalty=pick("frequency_penalty", defaults.frequency_penalty),
            presence_penalty=pick("presence_penalty", defaults.presence_penalty),
            logit_bias=_logit_bias(params.get("logit_bias")),
            allowed_token_ids=_ids("allowed_token_ids", params.get("allowed_token_ids")),
            min_tokens=_count("min_tokens", params.get("min_tokens")),
            stop_token_ids=_ids("stop_token_ids", params.get("stop_token_ids")),
            bad_words=_words(params.get("bad_words")),
            structured_output=constraint,
        )
    except LogitAdjustmentError as exc:
        raise SamplingNotReproducibleError(Reason.SAMPLER_NOT_REPRODUCIBLE, str(exc)) from exc
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
    return RequestReplay(settings, adjustments)


def _check_params(params_json: str) -> dict[str, Any]:
    """The request's parameters, refused when one changes the sampling in a way that
    cannot be replayed."""
    if not params_json:
        return {}
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
        if key in _HARMLESS or key in _ADJUSTMENTS or key in _STRUCTURED:
            continue
        if key == _RESPONSES_STRUCTURED:  # read by structured_output
            continue
        if value in (None, False, "", [], {}):
            continue
        if value in _NEUTRAL.get(key, ()) or (key == "tool_choice" and forces_tool_call(params)):
            continue
        if key == "use_beam_search":
            detail = "beam search is not sampling"
        else:
            detail = f"request parameter {key}={json.dumps(value)[:80]} changes what is sampled"
        raise SamplingNotReproducibleError(Reason.SAMPLER_NOT_REPRODUCIBLE, detail)
    return params


def _structured_output(
    params: Mapping[str, Any],
    engine: StructuredOutputsEngine | None,
    request_json: str | None,
    serving: ServingFlags | None,
) -> StructuredOutput | None:
    """The request's grammar constraint, read in the raw body's key order."""
    mismatch = strict_tool_calling_mismatch(params, serving or ServingFlags())
    if mismatch is not None:
        raise _refuse(mismatch)
    keys = (*_STRUCTURED, _RESPONSES_STRUCTURED)
    if not tool_parser_reads(params) and not any(params.get(key) is not None for key in keys):
        return None
    request: Any = params
    if request_json is not None:
        try:
            request = json.loads(request_json)
        except json.JSONDecodeError as exc:
            raise _refuse(f"the request body does not parse: {exc}") from exc
        if not isinstance(request, dict):
            raise _refuse("the request body is not a JSON object")
    try:
        constraint = structured_output(request, engine, serving)
    except StructuredOutputError as exc:
        raise _refuse(str(exc)) from exc
    if (
        constraint is not None
        and request_json is None
        and isinstance(constraint.params().get("json"), dict)
    ):
        raise _refuse("the request body was not kept: the JSON schema's key order is unknown")
    return constraint


def _refuse(detail: str) -> SamplingNotReproducibleError:
    return SamplingNotReproducibleError(Reason.SAMPLER_NOT_REPRODUCIBLE, detail)


def _number(field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _refuse(f"{field}={json.dumps(value)[:80]} is not a number")
    return float(value)


def _count(field: str, value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise _refuse(f"{field}={json.dumps(value)[:80]} is not an integer")
    return value


def _ids(field: str, value: Any) -> tuple[int, ...]:
    """A list of token ids (None and [] mean none, as vLLM treats them)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _refuse(f"{field} is not a list of token ids")
    return tuple(_count(field, v) for v in value)


def _logit_bias(value: Any) -> dict[int, float]:
    """vLLM's reading: each key an integer token id, each value a number."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _refuse("logit_bias is not an object")
    out: dict[int, float] = {}
    for key, bias in value.items():
        try:
            token = int(key)
        except ValueError:
            raise _refuse(f"logit_bias key {key!r} is not a token id") from None
        out[token] = _number("logit_bias", bias)
        if not math.isfinite(out[token]):
            raise _refuse(f"logit_bias of {token} is {out[token]}")
    return out


def _words(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(w, str) for w in value):
        raise _refuse("bad_words is not a list of strings")
    return tuple(value)

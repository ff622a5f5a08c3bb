"""Rebuilding a request's sampling settings as vLLM's OpenAI server resolved them."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from veritap.v1 import record_pb2

from verifierd.commitments import GenerationDefaults
from verifierd.difr import SamplingSettings
from verifierd.logit_adjustments import LogitAdjustments
from verifierd.request_sampling import (
    SamplingNotReproducibleError,
    request_replay,
    request_sampling,
)
from verifierd.samplers import get_profile
from verifierd.serving_flags import ServingFlags
from verifierd.verdicts import Reason

SPLITMIX = get_profile("vllm-cpu-splitmix")
NEUTRAL = GenerationDefaults()


def params(**fields: Any) -> record_pb2.SamplingParams:
    extra = fields.pop("extra", {})
    msg = record_pb2.SamplingParams(**fields)
    msg.params_json = json.dumps({**fields, **extra}, sort_keys=True)
    return msg


def test_request_values_win_over_defaults() -> None:
    defaults = GenerationDefaults(temperature=0.7, top_k=50, top_p=0.9)
    got = request_sampling(params(temperature=1.0, seed=7), defaults, SPLITMIX)
    assert got == SamplingSettings(temperature=1.0, top_k=50, top_p=0.9, min_p=0.0, seed=7)
    got = request_sampling(params(seed=7, top_k=5, top_p=1.0, min_p=0.1), defaults, SPLITMIX)
    assert got == SamplingSettings(temperature=0.7, top_k=5, top_p=1.0, min_p=0.1, seed=7)


def test_n_choices_get_consecutive_seeds() -> None:
    settings = request_sampling(params(temperature=0.8, seed=100, n=3), NEUTRAL, SPLITMIX)
    assert [settings.for_choice(i, 3).seed for i in range(3)] == [100, 101, 102]


def test_no_seed_is_unverifiable_unless_greedy() -> None:
    with pytest.raises(SamplingNotReproducibleError) as info:
        request_sampling(params(temperature=0.5), NEUTRAL, SPLITMIX)
    assert info.value.reason is Reason.NO_SEED
    with pytest.raises(SamplingNotReproducibleError) as info:
        request_sampling(params(), NEUTRAL, SPLITMIX)
    assert info.value.reason is Reason.NO_SEED
    greedy = request_sampling(params(temperature=0.0), NEUTRAL, SPLITMIX)
    assert greedy.effective().is_greedy
    from_defaults = request_sampling(params(), GenerationDefaults(temperature=0.0), SPLITMIX)
    assert from_defaults.effective().is_greedy


def test_greedy_profile_cannot_verify_sampling() -> None:
    with pytest.raises(SamplingNotReproducibleError) as info:
        request_sampling(params(temperature=0.5, seed=1), NEUTRAL, get_profile("greedy"))
    assert info.value.reason is Reason.SAMPLER_NOT_REPRODUCIBLE
    request_sampling(params(temperature=0.0), NEUTRAL, get_profile("greedy"))


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"extra": {"response_format": {"type": "json_object"}}}, "structured-output backend"),
        ({"extra": {"tool_choice": "required"}}, "tool_choice"),
        ({"extra": {"structured_outputs": {"regex": "a+"}}}, "structured-output backend"),
        ({"extra": {"text": {"format": {"type": "json_object"}}}}, "structured-output backend"),
        ({"extra": {"text": {"format": {"type": "text"}, "store": 1}}}, "unknown fields"),
        ({"extra": {"use_beam_search": True}}, "beam search"),
        ({"extra": {"guided_regex": "a+"}}, "guided_regex"),
        ({"extra": {"vllm_xargs": {"my_logits_processor": 1}}}, "vllm_xargs"),
        ({"extra": {"thinking_token_budget": 10}}, "thinking_token_budget"),
        ({"extra": {"watermarking": True}}, "watermarking"),
        ({"extra": {"some_future_knob": 3}}, "some_future_knob"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"extra": {"frequency_penalty": "0.5"}}, "frequency_penalty"),
        ({"extra": {"logit_bias": {"x": 1}}}, "logit_bias"),
        ({"extra": {"logit_bias": {"5": "big"}}}, "logit_bias"),
        ({"extra": {"logit_bias": [5, 1]}}, "logit_bias"),
        ({"extra": {"min_tokens": -1}}, "min_tokens"),
        ({"extra": {"min_tokens": 2.5}}, "min_tokens"),
        ({"extra": {"allowed_token_ids": [1, "2"]}}, "allowed_token_ids"),
        ({"extra": {"stop_token_ids": 7}}, "stop_token_ids"),
        ({"extra": {"bad_words": ["ok", 3]}}, "bad_words"),
    ],
)
def test_parameters_that_change_sampling(fields: dict[str, Any], needle: str) -> None:
    with pytest.raises(SamplingNotReproducibleError, match=needle) as info:
        request_sampling(params(temperature=1.0, seed=1, **fields), NEUTRAL, SPLITMIX)
    assert info.value.reason is Reason.SAMPLER_NOT_REPRODUCIBLE


def test_harmless_and_neutral_parameters_pass() -> None:
    extra = {
        "stream_options": {"include_usage": True},
        "response_format": {"type": "text"},
        "text": {"format": {"type": "text"}, "verbosity": "low"},
        "tool_choice": "auto",
        "min_tokens": 0,
        "logit_bias": {},
        "user": "alice",
    }
    request_sampling(params(temperature=1.0, seed=1, stream=True, extra=extra), NEUTRAL, SPLITMIX)


def test_logit_changing_parameters_become_adjustments() -> None:
    extra = {
        "logit_bias": {"5": 10, "3": -250.5},
        "min_tokens": 4,
        "stop_token_ids": [9, 9, 2],
        "allowed_token_ids": [3, 5, 9, 2],
        "bad_words": ["foo", "bar"],
    }
    replay = request_replay(
        params(temperature=0.8, seed=3, presence_penalty=0.5, frequency_penalty=-0.25, extra=extra),
        GenerationDefaults(repetition_penalty=1.05),
        SPLITMIX,
    )
    assert replay.settings == SamplingSettings(temperature=0.8, top_k=0, seed=3)
    assert replay.adjustments == LogitAdjustments(
        repetition_penalty=1.05,
        frequency_penalty=-0.25,
        presence_penalty=0.5,
        logit_bias=((3, -100.0), (5, 10.0)),
        allowed_token_ids=(3, 5, 9, 2),
        min_tokens=4,
        stop_token_ids=(9, 2),
        bad_words=("foo", "bar"),
    )


def test_penalties_come_from_the_request_then_its_json_then_the_defaults() -> None:
    defaults = GenerationDefaults(repetition_penalty=1.05, presence_penalty=0.1)
    msg = params(seed=1, repetition_penalty=1.2, extra={"presence_penalty": 0.3})
    adj = request_replay(msg, defaults, SPLITMIX).adjustments
    assert (adj.repetition_penalty, adj.presence_penalty, adj.frequency_penalty) == (1.2, 0.3, 0)
    neutral = request_replay(params(seed=1, extra={"logit_bias": {}}), NEUTRAL, SPLITMIX)
    assert neutral.adjustments.is_neutral


def test_logit_bias_is_clamped_like_vllm() -> None:
    """As SamplingParams.from_optional does: min(100, max(-100, bias))."""
    msg = params(seed=1, extra={"logit_bias": {"7": 1e9, "8": -101, "9": 0.5}})
    adj = request_replay(msg, NEUTRAL, SPLITMIX).adjustments
    assert adj.logit_bias == ((7, 100.0), (8, -100.0), (9, 0.5))


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)


@settings(deadline=None)
@given(
    st.dictionaries(st.text(max_size=12), _JSON, max_size=5),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(allow_nan=True),
)
def test_any_request_gives_settings_or_a_reason(
    extra: dict[str, Any], temperature: float, top_p: float
) -> None:
    msg = record_pb2.SamplingParams(temperature=temperature, top_p=top_p, seed=3)
    msg.params_json = json.dumps(extra)
    try:
        request_sampling(msg, NEUTRAL, SPLITMIX)
    except SamplingNotReproducibleError as exc:
        assert exc.reason in Reason


_ADJUSTMENT_KEYS = st.sampled_from(
    [
        "logit_bias",
        "allowed_token_ids",
        "min_tokens",
        "stop_token_ids",
        "bad_words",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
    ]
)
_ADJUSTMENT_VALUES = (
    _JSON
    | st.lists(st.integers(-3, 2**40), max_size=4)
    | st.dictionaries(st.integers(-3, 99).map(str), st.floats(), max_size=3)
    | st.lists(st.text(max_size=3), max_size=3)
)


@settings(deadline=None)
@given(st.dictionaries(_ADJUSTMENT_KEYS, _ADJUSTMENT_VALUES, max_size=4))
def test_any_adjustment_values_give_adjustments_or_a_reason(extra: dict[str, Any]) -> None:
    msg = record_pb2.SamplingParams(temperature=1.0, seed=3)
    msg.params_json = json.dumps(extra)
    try:
        replay = request_replay(msg, NEUTRAL, SPLITMIX)
    except SamplingNotReproducibleError as exc:
        assert exc.reason is Reason.SAMPLER_NOT_REPRODUCIBLE
        return
    a = replay.adjustments
    assert min(a.token_ids(), default=0) >= 0
    assert all(-100 <= b <= 100 for _, b in a.logit_bias)


TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}


@pytest.mark.parametrize("enforced", [True, False])
def test_tools_need_the_provers_strict_tool_calling_setting(enforced: bool) -> None:
    """vLLM reads VLLM_ENFORCE_STRICT_TOOL_CALLING from its environment: requests with
    tools are replayed only where the commitment's setting is the verifier's own (on)."""
    serving = ServingFlags.of(
        enable_auto_tool_choice=True,
        tool_call_parser="hermes",
        enforce_strict_tool_calling=enforced,
    )
    sampling = params(temperature=1.0, seed=1, extra={"tools": [TOOL], "tool_choice": "auto"})
    if enforced:
        request_replay(sampling, NEUTRAL, SPLITMIX, serving=serving)
        return
    with pytest.raises(SamplingNotReproducibleError, match="VLLM_ENFORCE_STRICT_TOOL_CALLING=0"):
        request_replay(sampling, NEUTRAL, SPLITMIX, serving=serving)
    # Without tools, or on a server that parses none, the setting changes nothing.
    request_replay(params(temperature=1.0, seed=1), NEUTRAL, SPLITMIX, serving=serving)
    request_replay(sampling, NEUTRAL, SPLITMIX, serving=ServingFlags())

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
from verifierd.request_sampling import SamplingNotReproducibleError, request_sampling
from verifierd.samplers import get_profile
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
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"repetition_penalty": 1.1}, "repetition_penalty"),
        ({"extra": {"logit_bias": {"5": 10}}}, "logit_bias"),
        ({"extra": {"response_format": {"type": "json_object"}}}, "response_format"),
        ({"extra": {"tool_choice": "required"}}, "tool_choice"),
        ({"extra": {"min_tokens": 4}}, "min_tokens"),
        ({"extra": {"use_beam_search": True}}, "beam search"),
        ({"extra": {"guided_regex": "a+"}}, "guided_regex"),
        ({"extra": {"some_future_knob": 3}}, "some_future_knob"),
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
        "tool_choice": "auto",
        "min_tokens": 0,
        "logit_bias": {},
        "user": "alice",
    }
    request_sampling(params(temperature=1.0, seed=1, stream=True, extra=extra), NEUTRAL, SPLITMIX)


def test_penalty_in_the_model_defaults_is_caught() -> None:
    with pytest.raises(SamplingNotReproducibleError, match="repetition_penalty"):
        request_sampling(params(seed=1), GenerationDefaults(repetition_penalty=1.05), SPLITMIX)


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

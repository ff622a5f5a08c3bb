"""Each API's finish claim in chat's terms, and the Messages fields vLLM ignores."""

from __future__ import annotations

import json

import pytest
from veritap.v1.record_pb2 import InferenceRecord, SamplingParams

from verifierd.commitments import GenerationDefaults
from verifierd.evidence.api_claims import MESSAGES, MESSAGES_IGNORED, RESPONSES, chat_finish
from verifierd.evidence.client_view import choice_evidence
from verifierd.request_sampling import (
    RequestReplay,
    SamplingNotReproducibleError,
    request_replay,
)
from verifierd.samplers import get_profile
from verifierd.structured_outputs import StructuredOutputsEngine
from verifierd.verdicts import Reason

MAX_OUTPUT = json.dumps("max_output_tokens")
STOP = json.dumps("\n\n")


@pytest.mark.parametrize(
    ("dialect", "finish", "stop", "request_fields", "chat"),
    [
        (RESPONSES, "completed", "", {}, ("stop", "")),
        (RESPONSES, "incomplete", MAX_OUTPUT, {}, ("length", "")),
        # Which stop string ended a "completed" response is not said: not replayed.
        (RESPONSES, "completed", "", {"stop": ["\n"]}, ("completed", "")),
        (
            RESPONSES,
            "incomplete",
            json.dumps("content_filter"),
            {},
            ("incomplete", '"content_filter"'),
        ),
        (RESPONSES, "incomplete", "", {}, ("incomplete", "")),
        (RESPONSES, "cancelled", "", {}, ("cancelled", "")),
        (MESSAGES, "end_turn", "", {}, ("stop", "")),
        (MESSAGES, "max_tokens", "", {}, ("length", "")),
        (MESSAGES, "stop_sequence", STOP, {}, ("stop", STOP)),
        (MESSAGES, "stop_sequence", "", {}, ("stop_sequence", "")),
        (MESSAGES, "tool_use", "", {}, ("tool_use", "")),
        ("openai-chat", "length", "", {}, ("length", "")),
    ],
)
def test_claims_in_chats_terms(
    dialect: str,
    finish: str,
    stop: str,
    request_fields: dict[str, object],
    chat: tuple[str, str],
) -> None:
    assert chat_finish(dialect, finish, stop, request_fields) == chat


def _record(dialect: str, body: dict[str, object], finish: str, stop: str) -> InferenceRecord:
    record = InferenceRecord()
    record.request.body = json.dumps(body).encode()
    record.api.dialect = dialect
    record.api.choices.add(index=0, text="a", finish_reason=finish, stop_reason_json=stop)
    return record


def test_a_records_evidence_states_the_claim_in_chats_terms() -> None:
    responses = _record(RESPONSES, {"input": "hi"}, "incomplete", MAX_OUTPUT)
    messages = _record(MESSAGES, {"messages": [], "max_tokens": 4}, "stop_sequence", STOP)
    ((cut,), (stopped,)) = choice_evidence(responses), choice_evidence(messages)
    assert (cut.finish_reason, cut.stop_reason_json) == ("length", "")
    assert (stopped.finish_reason, stopped.claimed_stop) == ("stop", "\n\n")


@pytest.mark.parametrize("field", MESSAGES_IGNORED)
def test_messages_sampling_fields_the_server_ignores_are_not_replayed(field: str) -> None:
    body = {"messages": [], "max_tokens": 4, field: 1}
    with pytest.raises(SamplingNotReproducibleError, match=field) as raised:
        choice_evidence(_record(MESSAGES, body, "end_turn", ""))
    assert raised.value.reason is Reason.SAMPLER_NOT_REPRODUCIBLE


#: Values to try for a request field: one of each shape a sampling field takes.
PROBES: tuple[object, ...] = (
    0.5,
    2,
    [1],
    {"1": 1.0},
    ["x"],
    {"type": "json_object"},
    {"choice": ["a", "b"]},
)


def _replay(fields: dict[str, object]) -> RequestReplay:
    """The replay of a seeded, sampled request that also carries ``fields``."""
    body = {"temperature": 0.8, "seed": 1, **fields}
    sampling = SamplingParams(temperature=0.8, seed=1, params_json=json.dumps(body))
    return request_replay(
        sampling,
        GenerationDefaults(),
        get_profile("vllm-cpu-splitmix"),
        structured_outputs=StructuredOutputsEngine.installed(),
        request_json=json.dumps(body),
    )


def _changes_the_replay(field: str) -> bool:
    unchanged = _replay({})
    for value in PROBES:
        try:
            if _replay({field: value}) != unchanged:
                return True
        except SamplingNotReproducibleError:
            continue  # refused with this value: never replayed wrongly
    return False


def test_messages_ignored_is_what_the_replay_reads_and_vllms_messages_request_lacks() -> None:
    from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    # Every field an OpenAI client may send vLLM: those whose value the replay applies.
    sent = set(ChatCompletionRequest.model_fields) | set(CompletionRequest.model_fields)
    read = {field for field in sorted(sent) if _changes_the_replay(field)}
    assert read - set(AnthropicMessagesRequest.model_fields) == set(MESSAGES_IGNORED)

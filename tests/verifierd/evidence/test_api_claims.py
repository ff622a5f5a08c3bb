"""Each API's finish claim in chat's terms, and the Messages fields vLLM ignores."""

from __future__ import annotations

import json

import pytest
from veritap.v1.record_pb2 import InferenceRecord

from verifierd.evidence.api_claims import MESSAGES, MESSAGES_IGNORED, RESPONSES, chat_finish
from verifierd.evidence.client_view import choice_evidence
from verifierd.request_sampling import SamplingNotReproducibleError
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

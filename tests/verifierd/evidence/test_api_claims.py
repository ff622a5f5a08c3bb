"""Each API's finish claim in chat's terms (values in, values out)."""

from __future__ import annotations

import json

import pytest

from verifierd.evidence.api_claims import MESSAGES, RESPONSES, chat_finish

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

"""Each API's finish claim in chat's terms, so one set of finish rules checks them all.

vLLM serves the Responses and Messages APIs from the same engine as chat, and
derives their finish fields from the engine's ``finish_reason`` and
``stop_reason``; this is that mapping read backwards (the record keeps the
prover's words: `Choice.finish_reason`, and `Choice.stop_reason_json`):

- Responses (``serving.responses_full_generator``): ``finish_reason == "length"``
  is ``status: "incomplete"`` with ``incomplete_details.reason:
  "max_output_tokens"`` (the stop reason the record keeps); anything else is
  ``completed``. ``completed`` is ``stop`` on an end token when the request has
  no stop strings; with stop strings the response does not say which ended it,
  so it is not replayed. Other statuses (``cancelled``, ``failed``, an
  ``incomplete`` for another reason) are not replayed either.
- Messages (``anthropic.serving._to_anthropic_stop_reason``): ``max_tokens`` is
  ``length``; ``stop_sequence`` is ``stop`` on the stop string the response's
  ``stop_sequence`` names (the record's stop reason); ``end_turn`` is ``stop``
  on an end token (a stop string would have been ``stop_sequence``);
  ``tool_use`` is not replayed.

A claim with no chat meaning keeps its own words, which the finish rules report
as not replayed (UNVERIFIABLE), never as a FAIL.

vLLM's Messages request model has no OpenAI sampling extensions and no
structured outputs: a Messages request carrying one (`MESSAGES_IGNORED`) runs
without it, while the sampling replay (`verifierd.request_sampling`) would read
it from the request's parameters, so such a request is not replayed
(`ignored_sampling_fields`).
"""

from __future__ import annotations

import json

from verifierd.request_sampling import EXTENDED_SAMPLING_FIELDS

RESPONSES = "openai-responses"
MESSAGES = "anthropic-messages"
#: The stop reason of an end token: none (chat's ``stop_reason`` null or a token id).
_END_TOKEN = ""
#: Sampling fields the replay reads from a request's parameters that vLLM's
#: ``AnthropicMessagesRequest`` lacks (pydantic drops them: the server ignores them):
#: all it reads beyond temperature, top_p and top_k, which that request has.
MESSAGES_IGNORED = tuple(sorted(EXTENDED_SAMPLING_FIELDS))


def chat_finish(
    dialect: str, finish_reason: str, stop_reason_json: str, request: dict[str, object]
) -> tuple[str, str]:
    """``(finish_reason, stop_reason_json)`` as chat would state them for this claim."""
    if dialect == RESPONSES:
        return _responses(finish_reason, stop_reason_json, request)
    if dialect == MESSAGES:
        return _messages(finish_reason, stop_reason_json)
    return finish_reason, stop_reason_json


def _responses(status: str, reason_json: str, request: dict[str, object]) -> tuple[str, str]:
    if status == "incomplete" and reason_json == json.dumps("max_output_tokens"):
        return "length", _END_TOKEN
    if status == "completed" and not request.get("stop"):
        return "stop", _END_TOKEN
    return status, reason_json


def _messages(stop_reason: str, sequence_json: str) -> tuple[str, str]:
    if stop_reason == "max_tokens":
        return "length", _END_TOKEN
    if stop_reason == "end_turn":
        return "stop", _END_TOKEN
    if stop_reason == "stop_sequence" and sequence_json:
        return "stop", sequence_json
    return stop_reason, sequence_json


def ignored_sampling_fields(dialect: str, request: dict[str, object]) -> tuple[str, ...]:
    """The fields of ``request`` its server ignores but the sampling replay would apply."""
    if dialect != MESSAGES:
        return ()
    return tuple(f for f in MESSAGES_IGNORED if request.get(f) not in (None, [], {}))

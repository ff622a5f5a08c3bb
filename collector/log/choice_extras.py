"""Tool calls and reasoning text of each choice, read from a record's stored response body.

The record's API view keeps each choice's text and token ids; auditors also ask for the
tool calls and the reasoning a chat response carried, which stay in the response body.
They are read the way the client's SDK reads the body (collector.dialects): a document's
`choices[i].message`, or a stream's `choices[i].delta` up to the event that ends it for
the SDK (`[DONE]`, an error chunk, data that is not JSON). Reasoning is vLLM's
`reasoning` field (`reasoning_content` in older servers). Streamed tool calls are
assembled as openai-python's stream helpers do: fragments with the same `index` make one
call, whose `id`, `type` and `function.name` come from the first fragment that has them
and whose `function.arguments` are the fragments' concatenation.

A body that is cut, holed or not JSON gives what can be read from it; nothing here
raises on what the prover wrote.
"""

from __future__ import annotations

from dataclasses import dataclass

from veritap.v1 import record_pb2

from collector.dialects.base import is_error
from collector.dialects.json_values import JsonError, load
from collector.dialects.sdk_sse import sdk_events

_DONE = "[DONE]"
_REASONING_KEYS = ("reasoning", "reasoning_content")


@dataclass(frozen=True)
class ChoiceExtras:
    #: The reasoning text, or None when the response carried none.
    reasoning: str | None
    #: The tool calls as JSON values, or None when the response carried none.
    tool_calls: list[object] | None


NO_EXTRAS = ChoiceExtras(None, None)


def choice_extras(record: record_pb2.InferenceRecord) -> dict[int, ChoiceExtras]:
    """Each choice index's extras (indices without any are left out)."""
    response = record.response
    if record.api.dialect != "openai-chat" or response.status >= 400 or not response.body:
        return {}
    sampling = record.api.sampling
    if sampling.HasField("stream") and sampling.stream:
        return _streamed(response.body)
    return _document(response.body)


def _reasoning(message: dict[str, object]) -> str | None:
    for key in _REASONING_KEYS:
        value = message.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def _choices(chunk: object) -> list[tuple[int, dict[str, object]]]:
    """(index, choice) of each well-formed choice in a document or chunk."""
    if not isinstance(chunk, dict) or not isinstance(chunk.get("choices"), list):
        return []
    out = []
    for item in chunk["choices"]:
        index = item.get("index") if isinstance(item, dict) else None
        if type(index) is int and index >= 0:
            out.append((index, item))
    return out


def _document(body: bytes) -> dict[int, ChoiceExtras]:
    try:
        document = load(body)
    except JsonError:
        return {}
    extras = {}
    for index, choice in _choices(document):
        message = choice.get("message")
        if not isinstance(message, dict):
            continue
        calls = message.get("tool_calls")
        found = ChoiceExtras(
            _reasoning(message), calls if isinstance(calls, list) and calls else None
        )
        if found != NO_EXTRAS:
            extras[index] = found
    return extras


class _StreamedChoice:
    """One choice's reasoning and tool calls, assembled from its deltas."""

    def __init__(self) -> None:
        self.reasoning: list[str] = []
        self.calls: dict[int, dict[str, object]] = {}

    def add(self, delta: dict[str, object]) -> None:
        reasoning = _reasoning(delta)
        if reasoning is not None:
            self.reasoning.append(reasoning)
        fragments = delta.get("tool_calls")
        if not isinstance(fragments, list):
            return
        for fragment in fragments:
            if not isinstance(fragment, dict):
                continue
            position = fragment.get("index")
            if not isinstance(position, int) or isinstance(position, bool):
                continue
            call = self.calls.setdefault(position, {"index": position})
            for key in ("id", "type"):
                if isinstance(fragment.get(key), str) and key not in call:
                    call[key] = fragment[key]
            function = fragment.get("function")
            if isinstance(function, dict):
                self._add_function(call, function)

    @staticmethod
    def _add_function(call: dict[str, object], function: dict[str, object]) -> None:
        assembled = call.setdefault("function", {"name": "", "arguments": ""})
        assert isinstance(assembled, dict)
        name, arguments = function.get("name"), function.get("arguments")
        if isinstance(name, str) and not assembled["name"]:
            assembled["name"] = name
        if isinstance(arguments, str):
            assembled["arguments"] += arguments

    def extras(self) -> ChoiceExtras:
        return ChoiceExtras(
            "".join(self.reasoning) or None,
            [self.calls[i] for i in sorted(self.calls)] or None,
        )


def _streamed(body: bytes) -> dict[int, ChoiceExtras]:
    choices: dict[int, _StreamedChoice] = {}
    for event in sdk_events(body).events:
        if event.data.startswith(_DONE):
            break
        try:
            chunk = load(event.data)
        except JsonError:
            break
        if is_error(chunk):
            break
        for index, choice in _choices(chunk):
            delta = choice.get("delta")
            if isinstance(delta, dict):
                choices.setdefault(index, _StreamedChoice()).add(delta)
    extras = {index: c.extras() for index, c in sorted(choices.items())}
    return {index: found for index, found in extras.items() if found != NO_EXTRAS}

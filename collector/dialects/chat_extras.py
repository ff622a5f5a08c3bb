"""Tool calls and reasoning of chat choices, as the client's openai SDK shows them.

A document's choice carries them in `message.tool_calls` (each `{id, type,
function: {name, arguments}}`) and `message.reasoning` (vLLM; older servers say
`reasoning_content`: the first of the two that is a non-empty string is kept).
A stream carries them as `delta` fragments, accumulated as openai-python's
stream helpers do (`openai/lib/streaming/_deltas.py: accumulate_delta`):

- `delta.tool_calls` fragments are placed by their `index` the way that code
  places them in a Python list: an index the list holds (negative ones too)
  merges into that call, any other inserts a new call there (`list.insert`
  clamps it: an index of 10^9 appends, and a later fragment with the same index
  appends again, as in the SDK);
- `id`, `function.name` and `function.arguments` are concatenated, `null` adds
  nothing; `type` is replaced by each fragment that has it, `null` included;
- `delta.reasoning` and `delta.reasoning_content` are each concatenated.

The SDK's stream helper (`ChatCompletionStreamState`) then looks each fragment's
call up by its index and raises where the list has none (an index past the
end): such fragments are assembled as above and counted as a problem.

Where the SDK would raise or keep a non-string (a fragment that is not an
object, an index that is not an integer, a name that is a number) the fragment
or field is left out and counted as malformed: the record cannot hold what the
client saw there.

Each response is bounded, whatever the prover sends (`tool_call_budget`): at
most `MAX_TOOL_CALLS` tool calls and `MAX_TOOL_CALL_BYTES` of their strings
across its choices. Past a cap, calls are dropped and strings cut; the choice says
`tool_calls_truncated` and the extraction reports the truncation. Work is
linear in the fragments; memory is the caps plus the reasoning text (which, like
the content, is bounded by the body).
"""

from __future__ import annotations

from veritap.v1 import record_pb2

from collector.dialects.base import ChoiceExtras, fit_text
from collector.dialects.tool_call_budget import ToolCallBudget

_REASONING_KEYS = ("reasoning", "reasoning_content")


class _StreamedCall:
    """One tool call assembled from its fragments."""

    __slots__ = ("arguments", "id", "name", "type")

    def __init__(self) -> None:
        self.id: list[str] = []
        self.type = ""
        self.name: list[str] = []
        self.arguments: list[str] = []


class _StreamedChoice:
    __slots__ = ("calls", "older_reasoning", "reasoning", "truncated")

    def __init__(self) -> None:
        self.calls: list[_StreamedCall] = []
        self.reasoning: list[str] = []
        self.older_reasoning: list[str] = []  # `reasoning_content`
        self.truncated = False


def _reasoning(message: dict[str, object]) -> str | None:
    for key in _REASONING_KEYS:
        value = message.get(key)
        if isinstance(value, str) and value:
            return value
    return None


class ChatExtras(ChoiceExtras):
    """Tool calls and reasoning of one chat response's choices (see the module docstring)."""

    def __init__(self, budget: ToolCallBudget, problems: list[str]) -> None:
        self._budget = budget
        self._problems = problems
        self._streamed: dict[int, _StreamedChoice] = {}

    def document_choice(self, item: dict[str, object], choice: record_pb2.Choice) -> None:
        message = item.get("message")
        if type(message) is not dict:
            return
        reasoning = _reasoning(message)
        if reasoning is not None:
            choice.reasoning = fit_text(reasoning, self._problems)
        calls = message.get("tool_calls")
        if calls is None:
            return
        if type(calls) is not list:
            self._budget.malformed += 1
            return
        for call in calls:
            if type(call) is not dict:
                self._budget.malformed += 1
            elif not self._budget.take_call():
                choice.tool_calls_truncated = True
            else:
                self._document_call(call, choice)

    def _document_call(self, call: dict[str, object], choice: record_pb2.Choice) -> None:
        function = call.get("function")
        if function is not None and type(function) is not dict:
            self._budget.malformed += 1
            function = None
        parts = {
            "id": call.get("id"),
            "type": call.get("type"),
            "function_name": function.get("name") if function else None,
            "function_arguments": function.get("arguments") if function else None,
        }
        out = choice.tool_calls.add()
        for field, value in parts.items():
            if value is None:
                continue
            if type(value) is not str:
                self._budget.malformed += 1
                continue
            kept, cut = self._budget.take_text(value)
            choice.tool_calls_truncated |= cut
            setattr(out, field, fit_text(kept, self._problems))

    def delta(self, index: int, item: dict[str, object]) -> None:
        delta = item.get("delta")
        if type(delta) is not dict or (len(delta) == 1 and "content" in delta):
            return  # a content delta alone: the hot path
        calls = delta.get("tool_calls")
        reasoning = delta.get("reasoning")
        older_reasoning = delta.get("reasoning_content")
        if calls is None and reasoning is None and older_reasoning is None:
            return  # a content delta: the hot path
        choice = self._streamed.get(index)
        if choice is None:
            choice = self._streamed[index] = _StreamedChoice()
        if type(reasoning) is str:
            choice.reasoning.append(reasoning)
        if type(older_reasoning) is str:
            choice.older_reasoning.append(older_reasoning)
        if calls is None:
            return
        if type(calls) is not list:
            self._budget.malformed += 1
            return
        for fragment in calls:
            position = fragment.get("index") if type(fragment) is dict else None
            if type(position) is not int:
                self._budget.malformed += 1
                continue
            self._merge(choice, position, fragment)

    def _merge(self, choice: _StreamedChoice, position: int, fragment: dict[str, object]) -> None:
        """Merge a fragment into the call at `position`, or insert one, as list indexing does."""
        calls = choice.calls
        if -len(calls) <= position < len(calls):
            call = calls[position]
        elif self._budget.take_call():
            call = _StreamedCall()
            calls.insert(min(max(position, -len(calls)), len(calls)), call)
            if not -len(calls) <= position < len(calls):
                self._budget.misplaced += 1
        else:
            choice.truncated = True
            return
        if "type" in fragment:
            kind = fragment["type"]
            self._budget.give_back(call.type)
            call.type = ""
            if type(kind) is str:
                call.type = self._take(choice, kind)
            elif kind is not None:
                self._budget.malformed += 1
        self._append(choice, call.id, fragment.get("id"))
        function = fragment.get("function")
        if type(function) is dict:
            self._append(choice, call.name, function.get("name"))
            self._append(choice, call.arguments, function.get("arguments"))
        elif function is not None:
            self._budget.malformed += 1

    def _append(self, choice: _StreamedChoice, parts: list[str], value: object) -> None:
        if type(value) is str:
            if value:
                parts.append(self._take(choice, value))
        elif value is not None:
            self._budget.malformed += 1

    def _take(self, choice: _StreamedChoice, text: str) -> str:
        kept, cut = self._budget.take_text(text)
        choice.truncated |= cut
        return kept

    def finish(self, index: int, choice: record_pb2.Choice) -> None:
        streamed = self._streamed.get(index)
        if streamed is None:
            return
        reasoning = "".join(streamed.reasoning) or "".join(streamed.older_reasoning)
        if reasoning:
            choice.reasoning = fit_text(reasoning, self._problems)
        fit = self._problems
        for call in streamed.calls:
            choice.tool_calls.add(
                id=fit_text("".join(call.id), fit),
                type=fit_text(call.type, fit),
                function_name=fit_text("".join(call.name), fit),
                function_arguments=fit_text("".join(call.arguments), fit),
            )
        choice.tool_calls_truncated = streamed.truncated

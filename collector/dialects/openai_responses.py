"""OpenAI Responses (`POST /v1/responses`), as vLLM serves them and the openai SDK shows them.

The request's `input` (a string or a list of items) is the prompt; every other
field (`instructions`, `tools`, `reasoning`, ...) is in `params_json`, and
`max_output_tokens` is the record's `max_tokens`. A response becomes one choice
(index 0):

- Document (`object: "response"`), read in `output` order: the text is the
  SDK's `Response.output_text` (the `output_text` parts of every `message`
  item, joined); the reasoning is the `reasoning_text` content of the
  `reasoning` items (their `summary_text` parts when none has content); each
  `function_call` item is a tool call (its `call_id` as the id, `name`,
  `arguments`). `status` is the finish reason (`completed`, `incomplete`: a
  claim, like chat's) and `incomplete_details.reason` (`max_output_tokens`)
  the stop reason (JSON); `usage` has `input_tokens`, `output_tokens`, `total_tokens`.
- Stream: events are read by their data's `type`, as the SDK reads them, and
  end where the SDK's stream does (`[DONE]`, a chunk whose `error` is truthy,
  data that is not JSON). The text is the `response.output_text.delta` deltas
  in order (what a client printing the stream shows), the reasoning the
  `response.reasoning_text.delta` deltas (`response.reasoning_summary_text.delta`
  when there are none); a `function_call` item added by
  `response.output_item.added` is a tool call whose arguments grow by the
  `response.function_call_arguments.delta` events of its `output_index` (the
  SDK's `ResponseStreamState`, which raises on an index added twice or never
  added: such events are counted as a problem). `response.created` gives the
  id; `response.completed`, `.incomplete` or `.failed` the status, its reason and usage; an
  `error` event the view's error. Where a terminal event carries the whole
  `output` and its text or tool calls differ from what the deltas built, the
  record says so: the prover showed the live stream and the final object
  different answers (text, reasoning or tool calls).

Tool calls are bounded as chat's are (`tool_call_budget`).
"""

from __future__ import annotations

from veritap.v1 import record_pb2

from collector.dialects.base import (
    Dialect,
    as_int,
    error_message,
    fit_text,
    stream_data,
)
from collector.dialects.json_values import canonical_json
from collector.dialects.tool_call_budget import ToolCallBudget
from collector.http.messages import ResponseMessage

_TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
_USAGE = (
    ("input_tokens", "prompt_tokens"),
    ("output_tokens", "completion_tokens"),
    ("total_tokens", "total_tokens"),
)


def _texts(parts: object, kind: str) -> list[str]:
    """The `text` of each part of type `kind` in a content (or summary) list."""
    if type(parts) is not list:
        return []
    return [
        p["text"]
        for p in parts
        if type(p) is dict and p.get("type") == kind and type(p.get("text")) is str
    ]


class _Call:
    """A function call, its arguments kept as parts (a stream may send them byte by byte)."""

    __slots__ = ("arguments", "id", "name")

    def __init__(self, call_id: str, name: str) -> None:
        self.id = call_id
        self.name = name
        self.arguments: list[str] = []

    def parts(self) -> tuple[str, str, str]:
        return self.id, self.name, "".join(self.arguments)


class _Output:
    """What a response's output items say: text, reasoning and tool calls."""

    __slots__ = ("budget", "calls", "reasoning", "summaries", "text")

    def __init__(self, budget: ToolCallBudget) -> None:
        self.budget = budget
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.summaries: list[str] = []
        self.calls: list[_Call] = []

    def item(self, item: object) -> None:
        if type(item) is not dict:
            return
        kind = item.get("type")
        if kind == "message":
            self.text += _texts(item.get("content"), "output_text")
        elif kind == "reasoning":
            self.reasoning += _texts(item.get("content"), "reasoning_text")
            self.summaries += _texts(item.get("summary"), "summary_text")
        elif kind == "function_call":
            self.call(item)

    def call(self, item: dict[str, object]) -> _Call | None:
        """The tool call of a `function_call` item (None when it is past the cap)."""
        if not self.budget.take_call():
            return None
        call = _Call(self._text(item.get("call_id")), self._text(item.get("name")))
        arguments = self._text(item.get("arguments"))
        if arguments:
            call.arguments.append(arguments)
        self.calls.append(call)
        return call

    def arguments(self, call: _Call, delta: object) -> None:
        text = self._text(delta)
        if text:
            call.arguments.append(text)

    def _text(self, value: object) -> str:
        """A string part within the budget ("" for null; another type is malformed)."""
        if type(value) is str:
            return self.budget.take_text(value)[0]
        if value is not None:
            self.budget.malformed += 1
        return ""

    def reasoning_text(self) -> str:
        """The reasoning as the record keeps it: the content, else the summaries."""
        return "".join(self.reasoning) or "".join(self.summaries)

    def fill(self, choice: record_pb2.Choice, problems: list[str]) -> None:
        choice.text = fit_text("".join(self.text), problems)
        reasoning = self.reasoning_text()
        if reasoning:
            choice.reasoning = fit_text(reasoning, problems)
        for call_id, name, arguments in (call.parts() for call in self.calls):
            choice.tool_calls.add(
                id=fit_text(call_id, problems),
                type="function",
                function_name=fit_text(name, problems),
                function_arguments=fit_text(arguments, problems),
            )
        budget = self.budget
        choice.tool_calls_truncated = bool(budget.calls_dropped or budget.bytes_cut)


def _summary(response: dict[str, object], view: record_pb2.ApiView, problems: list[str]) -> str:
    """Fill the id and usage from a response object; its status ("" when none)."""
    response_id = response.get("id")
    if type(response_id) is str and not view.response_id:
        view.response_id = fit_text(response_id, problems)
    usage = response.get("usage")
    if type(usage) is dict:
        for key, name in _USAGE:
            value = as_int(usage.get(key))
            if value is not None and value >= 0:
                setattr(view.usage, name, value)
    status = response.get("status")
    return status if type(status) is str else ""


def _incomplete_reason(response: dict[str, object]) -> str:
    """`incomplete_details.reason` as JSON ("" when there is none)."""
    details = response.get("incomplete_details")
    reason = details.get("reason") if type(details) is dict else None
    return canonical_json(reason) if type(reason) is str else ""


class OpenAIResponses(Dialect):
    name = "openai-responses"
    paths = frozenset({"/v1/responses"})
    response_objects = frozenset({"response"})
    prompt_key = "input"
    max_tokens_keys: tuple[str, ...] = ("max_output_tokens",)

    def _document(
        self,
        document: dict[str, object],
        view: record_pb2.ApiView,
        problems: list[str],
        budget: ToolCallBudget,
    ) -> None:
        output = document.get("output")
        if type(output) is not list:
            problems.append("response has no output list")
            return
        read = _Output(budget)
        for item in output:
            read.item(item)
        choice = view.choices.add(index=0, stop_reason_json=_incomplete_reason(document))
        choice.finish_reason = fit_text(_summary(document, view, problems), problems)
        read.fill(choice, problems)

    def _stream(
        self,
        response: ResponseMessage,
        view: record_pb2.ApiView,
        problems: list[str],
        budget: ToolCallBudget,
    ) -> None:
        reader = _StreamReader(view, problems, budget)
        for data in stream_data(response, view, problems):
            reader.event(data)
        reader.finish()


class _StreamReader:
    """One Responses stream's events, as they are read (see the module docstring)."""

    def __init__(
        self, view: record_pb2.ApiView, problems: list[str], budget: ToolCallBudget
    ) -> None:
        self.view = view
        self.problems = problems
        self.budget = budget
        self.streamed = _Output(budget)
        self.calls: dict[int, _Call | None] = {}
        self.added: set[int] = set()
        self.final: _Output | None = None
        self.status = ""
        self.incomplete_reason = ""
        self.bad = 0

    def event(self, data: object) -> None:
        if type(data) is not dict or type(kind := data.get("type")) is not str:
            self.bad += 1
            return
        streamed = self.streamed
        if kind == "response.output_text.delta":
            _append_text(streamed.text, data.get("delta"))
        elif kind == "response.reasoning_text.delta":
            _append_text(streamed.reasoning, data.get("delta"))
        elif kind == "response.reasoning_summary_text.delta":
            _append_text(streamed.summaries, data.get("delta"))
        elif kind == "response.output_item.added":
            self._item_added(data.get("output_index"), data.get("item"))
        elif kind == "response.function_call_arguments.delta":
            self._arguments(data.get("output_index"), data.get("delta"))
        elif kind == "error":
            self.view.error = fit_text(error_message(data), self.problems)
        elif kind in _TERMINAL or kind == "response.created":
            self._lifecycle(data.get("response"), terminal=kind in _TERMINAL)

    def _item_added(self, index: object, item: object) -> None:
        if type(index) is not int or index in self.added:
            self.budget.misplaced += 1  # the SDK's helper raises on an index added twice
            return
        self.added.add(index)
        if type(item) is dict and item.get("type") == "function_call":
            self.calls[index] = self.streamed.call(item)

    def _arguments(self, index: object, delta: object) -> None:
        if type(index) is not int or index not in self.added:
            self.budget.misplaced += 1  # ... and on one never added
            return
        call = self.calls.get(index)
        if call is not None:
            self.streamed.arguments(call, delta)

    def _lifecycle(self, body: object, *, terminal: bool) -> None:
        if type(body) is not dict:
            self.bad += 1
            return
        status = _summary(body, self.view, self.problems)
        if status:
            self.status, self.incomplete_reason = status, _incomplete_reason(body)
        output = body.get("output")
        if terminal and type(output) is list:
            self.final = _Output(ToolCallBudget())
            for item in output:
                self.final.item(item)

    def finish(self) -> None:
        problems = self.problems
        choice = self.view.choices.add(
            index=0,
            finish_reason=fit_text(self.status, problems),
            stop_reason_json=self.incomplete_reason,
        )
        streamed, final = self.streamed, self.final
        streamed.fill(choice, problems)
        if final is not None and (
            "".join(final.text) != "".join(streamed.text)
            or final.reasoning_text() != streamed.reasoning_text()
            or [c.parts() for c in final.calls] != [c.parts() for c in streamed.calls]
        ):
            problems.append("the final response's output differs from what its deltas streamed")
        if self.bad:
            problems.append(f"{self.bad} SSE event(s) are not events of this API")


def _append_text(parts: list[str], delta: object) -> None:
    if type(delta) is str:
        parts.append(delta)

"""Anthropic Messages (`POST /v1/messages`), as vLLM serves them and the anthropic SDK shows them.

The request's `messages` are the prompt; every other field (`system`, `tools`,
`thinking`, ...) is in `params_json`. The sampling fields are only those vLLM's
server carries into the chat request it runs (`AnthropicServingMessages.
to_chat_completion_request`): `temperature`, `top_p`, `top_k`, `max_tokens`
(required by the API), `stop_sequences` (the record's stop strings) and
`stream`; the API has no seed, so anything an OpenAI habit adds (`seed`,
`min_p`, ...) is ignored by the server and stays out of the typed fields. A
response becomes one choice (index 0):

- Document (`type: "message"`): the text is the `text` blocks of `content`
  joined (the SDK's `get_final_text`), the reasoning the `thinking` blocks, each
  `tool_use` block a tool call (`input` as canonical JSON). `stop_reason`
  (`end_turn`, `max_tokens`, `stop_sequence`, `tool_use`) is the finish reason
  and a string `stop_sequence` the stop reason (JSON), both claims, like chat's;
  `usage` has `input_tokens` (plus the cache's `cache_read_input_tokens` and
  `cache_creation_input_tokens`: together the prompt) and `output_tokens`.
- Stream: read as the SDK's `Stream` and `MessageStream` read it. Its decoder
  splits lines as openai's does (`sdk_sse`); events without a name and `ping`
  are skipped, an `error` event is the view's error and ends the stream, as
  does data that is not JSON; events with empty data are skipped. The first
  event must be `message_start` (the SDK raises otherwise); each
  `content_block_start` adds a block, `content_block_delta` extends the block
  at its `index` (`text_delta` a text block, `thinking_delta` a thinking
  block, `input_json_delta` a tool use; an index past the blocks raises in the
  SDK, and ends the stream there); `message_delta` sets the stop reason, the
  stop sequence and the output tokens (the input tokens when it has them).
  `message_stop` ends nothing: the SDK reads on.

Tool calls are bounded as chat's are (`tool_call_budget`).
"""

from __future__ import annotations

from veritap.v1 import record_pb2

from collector.dialects.base import (
    Dialect,
    as_int,
    client_events,
    count_after_end,
    error_message,
    fit_text,
)
from collector.dialects.json_values import JsonError, canonical_json, has_lone_surrogate, load
from collector.dialects.tool_call_budget import ToolCallBudget
from collector.http.messages import ResponseMessage

#: The sampling fields vLLM's server carries into the chat request it runs (and the
#: rest of the request, which `params_json` keeps whole).
_CARRIED = frozenset({"temperature", "top_p", "top_k", "max_tokens", "stream", "params_json"})
_CACHED_INPUT = ("cache_read_input_tokens", "cache_creation_input_tokens")


class _Block:
    """One content block: its type and its text (or tool input) as parts."""

    __slots__ = ("id", "kind", "name", "parts")

    def __init__(self, kind: str, call_id: str = "", name: str = "") -> None:
        self.kind = kind
        self.id = call_id
        self.name = name
        self.parts: list[str] = []


class _Content:
    """A message's content blocks as the SDK holds them, tool calls within the budget."""

    def __init__(self, budget: ToolCallBudget) -> None:
        self.budget = budget
        self.blocks: list[_Block | None] = []

    def add(self, block: object, *, streamed: bool) -> None:
        """Add a block; a tool use past the cap (and any block the SDK cannot type) is None."""
        if type(block) is not dict or type(kind := block.get("type")) is not str:
            self.blocks.append(None)
            return
        if kind == "text":
            added = _Block(kind)
            self._text(added, block.get("text"))
        elif kind == "thinking":
            added = _Block(kind)
            self._text(added, block.get("thinking"))
        elif kind == "tool_use":
            if not self.budget.take_call():
                self.blocks.append(None)
                return
            added = _Block(
                kind, self._tool_part(block.get("id")), self._tool_part(block.get("name"))
            )
            tool_input = block.get("input")
            # A streamed tool use starts with `input: {}`; its JSON comes in deltas.
            if not streamed and tool_input is not None:
                added.parts.append(self._tool_part(canonical_json(tool_input)))
        else:
            added = _Block(kind)
        self.blocks.append(added)

    def delta(self, block: _Block | None, delta: dict[str, object]) -> None:
        if block is None:
            return
        kind = delta.get("type")
        if kind == "text_delta" and block.kind == "text":
            self._text(block, delta.get("text"))
        elif kind == "thinking_delta" and block.kind == "thinking":
            self._text(block, delta.get("thinking"))
        elif kind == "input_json_delta" and block.kind == "tool_use":
            part = delta.get("partial_json")
            if type(part) is str:
                block.parts.append(self._tool_part(part))

    @staticmethod
    def _text(block: _Block, value: object) -> None:
        if type(value) is str:
            block.parts.append(value)

    def _tool_part(self, value: object) -> str:
        if type(value) is str:
            return self.budget.take_text(value)[0]
        if value is not None:
            self.budget.malformed += 1
        return ""

    def fill(self, choice: record_pb2.Choice, problems: list[str]) -> None:
        blocks = [b for b in self.blocks if b is not None]
        choice.text = fit_text(_joined(blocks, "text"), problems)
        reasoning = _joined(blocks, "thinking")
        if reasoning:
            choice.reasoning = fit_text(reasoning, problems)
        for block in blocks:
            if block.kind == "tool_use":
                choice.tool_calls.add(
                    id=fit_text(block.id, problems),
                    type="function",
                    function_name=fit_text(block.name, problems),
                    function_arguments=fit_text("".join(block.parts), problems),
                )
        budget = self.budget
        choice.tool_calls_truncated = bool(budget.calls_dropped or budget.bytes_cut)


def _joined(blocks: list[_Block], kind: str) -> str:
    return "".join(part for b in blocks if b.kind == kind for part in b.parts)


def _usage(usage: object, view: record_pb2.ApiView, *, start: bool) -> None:
    """Anthropic usage as the record's: the prompt is the input and cached input tokens.

    A `message_delta`'s counts are totals that overwrite; its input tokens only when
    it carries them (the SDK keeps `message_start`'s otherwise)."""
    if type(usage) is not dict:
        return
    output = as_int(usage.get("output_tokens"))
    if output is not None and output >= 0:
        view.usage.completion_tokens = output
    counts = [as_int(usage.get(key)) for key in ("input_tokens", *_CACHED_INPUT)]
    if counts[0] is None and not start:
        return
    if all(c is None or c >= 0 for c in counts):
        view.usage.prompt_tokens = sum(c for c in counts if c is not None)


def _stop(message: dict[str, object], choice: record_pb2.Choice, problems: list[str]) -> None:
    """The finish claim: `stop_reason`, and a string `stop_sequence` as the stop reason."""
    reason = message.get("stop_reason")
    choice.finish_reason = fit_text(reason, problems) if type(reason) is str else ""
    sequence = message.get("stop_sequence")
    choice.stop_reason_json = canonical_json(sequence) if type(sequence) is str else ""


class AnthropicMessages(Dialect):
    name = "anthropic-messages"
    paths = frozenset({"/v1/messages"})
    response_objects = frozenset({"message"})
    prompt_key = "messages"
    max_tokens_keys: tuple[str, ...] = ("max_tokens",)

    def _request(
        self, request: dict[str, object], view: record_pb2.ApiView, problems: list[str]
    ) -> bool:
        in_view = super()._request(request, view, problems)
        carried = record_pb2.SamplingParams()
        for field, value in view.sampling.ListFields():
            if field.name in _CARRIED:
                setattr(carried, field.name, value)
        sampling = view.sampling
        sampling.CopyFrom(carried)
        stops = request.get("stop_sequences")
        if type(stops) is list and all(type(s) is str and not has_lone_surrogate(s) for s in stops):
            sampling.stop.extend(stops)
        return in_view

    def _document(
        self,
        document: dict[str, object],
        view: record_pb2.ApiView,
        problems: list[str],
        budget: ToolCallBudget,
    ) -> None:
        content = document.get("content")
        if type(content) is not list:
            problems.append("response has no content list")
            return
        read = _Content(budget)
        for block in content:
            read.add(block, streamed=False)
        message_id = document.get("id")
        if type(message_id) is str:
            view.response_id = fit_text(message_id, problems)
        _usage(document.get("usage"), view, start=True)
        choice = view.choices.add(index=0)
        _stop(document, choice, problems)
        read.fill(choice, problems)

    def _stream(
        self,
        response: ResponseMessage,
        view: record_pb2.ApiView,
        problems: list[str],
        budget: ToolCallBudget,
    ) -> None:
        stream = client_events(response)
        events = iter(stream.events)
        reader = _StreamReader(view, problems, budget)
        for position, event in enumerate(events, 1):
            if not event.event or event.event == "ping":
                continue
            if event.event == "error":
                reader.error(event.data)
                break
            if not event.data:
                continue
            try:
                data = load(event.data)
            except JsonError:
                problems.append(f"SSE event {position} is not JSON (the SDK raises there)")
                break
            if not reader.event(data):
                break
        else:
            if stream.undecodable_at is not None:
                at = stream.undecodable_at
                problems.append(f"SSE body is not UTF-8 at byte {at} (the SDK raises there)")
        count_after_end(events, view)
        reader.finish()


class _StreamReader:
    """One Messages stream's events, as the SDK accumulates them (see the module docstring)."""

    def __init__(
        self, view: record_pb2.ApiView, problems: list[str], budget: ToolCallBudget
    ) -> None:
        self.view = view
        self.problems = problems
        self.content = _Content(budget)
        self.choice = record_pb2.Choice(index=0)
        self.started = False
        self.bad = 0

    def error(self, data: str) -> None:
        try:
            document = load(data)
        except JsonError:
            self.view.error = fit_text(data, self.problems)
            return
        self.view.error = fit_text(error_message(document), self.problems)

    def event(self, data: object) -> bool:
        """Take one event's data; False where the SDK raises (the stream ends there)."""
        if type(data) is not dict or type(kind := data.get("type")) is not str:
            self.bad += 1
            return True
        if not self.started:
            if kind != "message_start" or type(message := data.get("message")) is not dict:
                self.problems.append(f"the stream starts with {kind!r} (the SDK raises there)")
                return False
            self.started = True
            message_id = message.get("id")
            if type(message_id) is str:
                self.view.response_id = fit_text(message_id, self.problems)
            _usage(message.get("usage"), self.view, start=True)
            blocks = message.get("content")
            for block in blocks if type(blocks) is list else ():
                self.content.add(block, streamed=True)
            return True
        if kind == "content_block_start":
            self.content.add(data.get("content_block"), streamed=True)
        elif kind == "content_block_delta":
            index, delta = data.get("index"), data.get("delta")
            blocks = self.content.blocks
            if type(index) is not int or not 0 <= index < len(blocks):
                self.problems.append(
                    f"a content block delta for block {index!r} of {len(blocks)} "
                    "(the SDK raises there)"
                )
                return False
            if type(delta) is dict:
                self.content.delta(blocks[index], delta)
        elif kind == "message_delta":
            delta = data.get("delta")
            if type(delta) is dict:
                _stop(delta, self.choice, self.problems)
            _usage(data.get("usage"), self.view, start=False)
        return True

    def finish(self) -> None:
        if not self.started:
            return
        choice = self.view.choices.add()
        choice.CopyFrom(self.choice)
        self.content.fill(choice, self.problems)
        if self.bad:
            self.problems.append(f"{self.bad} SSE event(s) are not events of this API")

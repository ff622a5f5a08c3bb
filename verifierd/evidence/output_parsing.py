"""The model's raw output against what the client read of it: reasoning and tool calls.

A prover started with ``--reasoning-parser`` or ``--tool-call-parser`` does not
send the model's raw output text: vLLM's parser splits it into reasoning
(``message.reasoning``), content and tool calls. The verifier scores the raw
output, so it has to get from what the client received back to a raw text,
with the committed flags (`verifierd.serving_flags`) and vLLM's own parser
classes, built for the request as the committed server builds them
(``ParserManager.get_parser``; the chat server's ``adjust_request`` applied to
the request first).

- **With token ids** (a claim): the ids decode to a raw text; vLLM's parser
  turns it into reasoning, content and tool calls exactly as the server's
  non-streamed response does (`OutputParser.read`), and that must be what the
  client received (`OutputParser.check`), else ``token_text_mismatch``. This
  holds for every parser vLLM has.
- **Without ids** the parsers' mapping is not invertible (what follows a Hermes
  tool call is dropped, the call's JSON is re-serialized), so the verifier
  searches over *reconstruction candidates* (`OutputParser.candidates`): the
  raw texts that put the received parts back together the ways the parser's
  model family writes them, each kept only when vLLM's parser reads it back to
  exactly what the client received. The tokenization search runs on every
  candidate and the verdict takes the candidate the committed sampler
  explains best (smallest sum of margins): every candidate is a raw output
  that shows the client what it saw, so the choice can only favour the
  prover, never accuse it. Reasoning parsers that delimit reasoning with a
  start and an end token (``deepseek_r1``, ``qwen3`` and the other
  ``BaseThinkingReasoningParser`` subclasses) rejoin as ``[start] reasoning end
  content``; tool calls are rebuilt for ``hermes`` in the two forms its grammar
  (``structural_tag_model = "hermes"``) allows, ``<tool_call>\\n{json}\\n</tool_call>``
  and ``<tool_call>{json}</tool_call>``, the calls back to back or a newline
  apart, the arguments as received; a named tool choice on a parser that reads
  it as JSON (no structural tag) is its arguments as received. Other tool
  parsers, a required tool choice read as JSON, and reasoning the
  request asked to leave out (``include_reasoning: false``), need the ids:
  without them the choice is UNVERIFIABLE.

A Responses request (``/v1/responses``) is read with the same parsers as chat
(its server calls the same ``Parser.parse`` and streams ``parse_delta``): the
reasoning is its ``reasoning`` items' text, the content its ``message`` items'
``output_text``, and every call the parser reads is a ``function_call`` item
(where chat shows calls only for a forced tool choice or ``auto`` with tools).

A streamed response is read as the non-streamed one, except that its reasoning
may keep the start token (`OutputParser.check`). Tool call arguments compare as
JSON values (vLLM re-serializes them when not streaming and passes the model's
text through when streaming); names compare exactly; call ids are the server's,
not the model's, and are not compared.

A grammar-constrained request (a structured output, or ``tool_choice`` required
or named) on a server with a reasoning parser has its grammar wait for the end
of the reasoning unless vLLM's server resolves it as already ended
(`OutputParser.grammar_gate_problem`).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from verifierd.errors import VerifierdError
from verifierd.evidence.claims import first_difference
from verifierd.evidence.client_view import ReceivedOutput, ToolCallView
from verifierd.serving_flags import ServingFlags

#: Tool parsers whose calls `OutputParser.candidates` rebuilds without token ids.
RECONSTRUCTED_TOOL_PARSERS = frozenset({"hermes"})


class OutputParsingError(VerifierdError):
    """The committed flags name a parser vLLM does not have, or it cannot be built."""


def parser_class(llm: Any, serving: ServingFlags) -> Any:
    """vLLM's Parser class for the committed flags (None: the server parses nothing)."""
    from vllm.parser import ParserManager

    model_config = llm.llm_engine.model_config
    try:
        return ParserManager.get_parser(
            tool_parser_name=serving.tool_call_parser,
            reasoning_parser_name=serving.reasoning_parser or "",
            enable_auto_tools=serving.enable_auto_tool_choice,
            model_name=model_config.model,
            is_harmony=model_config.hf_config.model_type == "gpt_oss",
            tool_strict_level=serving.tool_strict_level,
            tokenizer=llm.get_tokenizer(),
        )
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise OutputParsingError(f"vLLM cannot build the committed parsers: {exc}") from exc


def adjust_request(
    parser_cls: Any, llm: Any, request: Any, chat_template_kwargs: dict[str, Any]
) -> Any:
    """The request as vLLM's chat server hands it to the engine after its parser's
    ``adjust_request`` (OnlineRenderer.preprocess_chat: skip_special_tokens, a
    structural-tag grammar for tool_choice required or named, ...)."""
    if parser_cls is None:
        return request
    tool_choice = getattr(request, "tool_choice", "none")
    if not (
        parser_cls.always_adjust_request
        or parser_cls.reasoning_parser_cls is not None
        or tool_choice != "none"
    ):
        return request
    parser = parser_cls(
        llm.get_tokenizer(),
        request.tools,
        model_config=llm.llm_engine.model_config,
        chat_template_kwargs=chat_template_kwargs,
    )
    return parser.adjust_request(request=request)


class OutputParser:
    """The committed server's reading of a raw output for one chat or Responses request."""

    def __init__(
        self,
        llm: Any,
        parser_cls: Any,
        request: Any,
        *,
        serving: ServingFlags,
        chat_template_kwargs: dict[str, Any],
        prompt: Sequence[int],
    ) -> None:
        self._llm = llm
        self._parser_cls = parser_cls
        self._request = request
        self._serving = serving
        self._kwargs = chat_template_kwargs
        self._prompt = list(prompt)

    def read(self, raw: str, output_ids: Sequence[int] = ()) -> ReceivedOutput:
        """What vLLM's server sends for ``raw``: chat's chat_completion_full_generator,
        or the Responses server's _make_response_output_items."""
        request = self._request
        parser = self._parser()
        parser.set_prompt_token_ids(self._prompt)
        auto = self._serving.enable_auto_tool_choice
        reasoning, content, calls = parser.parse(
            raw, request, enable_auto_tools=auto, model_output_token_ids=list(output_ids)
        )
        if not request.include_reasoning:
            reasoning = None
        views = tuple(ToolCallView(c.name, c.arguments) for c in (calls or ()))
        if not self._shows_calls():
            views = ()
        if request.parallel_tool_calls is False:
            views = views[:1]
        return ReceivedOutput(content or "", reasoning or "", views)

    def _shows_calls(self) -> bool:
        """Whether the server sends the calls its parser reads. The Responses server
        makes a ``function_call`` item of each (build_response_output_items); the chat
        server only for a forced tool choice, or ``auto`` with tools on a server with
        auto tool choice and a tool parser."""
        request = self._request
        if _is_responses(request):
            return True
        auto = self._serving.enable_auto_tool_choice and parser_cls_tools(self._parser_cls)
        return bool(
            request.tool_choice == "required"
            or _is_named_choice(request.tool_choice)
            or (auto and request.tools and request.tool_choice == "auto")
        )

    def grammar_gate_problem(self, reasoning_parser: str | None) -> str | None:
        """None when a grammar gated on ``reasoning_parser``'s end of reasoning (None: not
        gated, see `verifierd.structured_outputs.StructuredOutput`) starts where vLLM's
        server starts it for this request and prompt
        (``ChatCompletionRequest.resolve_reasoning_ended``: False waits for the end,
        True or None constrain from the first token; the Responses server leaves it
        to the engine, which waits unless the prompt ends the reasoning, whatever
        ``include_reasoning`` says), else why it does not."""
        if _is_responses(self._request):
            parser = self._parser()
            ended = parser.reasoning_parser is None or bool(parser.is_reasoning_end(self._prompt))
        else:
            ended = self._request.resolve_reasoning_ended(self._parser(), self._prompt)
        if (reasoning_parser is not None) == (ended is False):
            return None
        if ended is True:
            return (
                "vLLM constrains this request from its first output token (its prompt "
                "ends the reasoning), which is not replayed"
            )
        return "vLLM waits for the end of the reasoning before it applies this grammar"

    def _parser(self) -> Any:
        """The committed server's Parser for this request."""
        return self._parser_cls(
            self._llm.get_tokenizer(),
            self._request.tools,
            chat_template_kwargs=self._kwargs,
            model_config=self._llm.llm_engine.model_config,
        )

    def check(self, raw: str, output_ids: Sequence[int], received: ReceivedOutput) -> str | None:
        """None when ``raw`` reads as ``received``, else what differs.

        A streamed response may carry the reasoning parser's start token at the
        head of its reasoning where the non-streamed reading has none: vLLM's
        streaming reasoning parser passes it on when it arrives in one delta with
        the first reasoning tokens, which depends on the server's timing, not on
        the output. The rest must read the same."""
        read = self.read(raw, output_ids)
        start = (self._markers() or ("", ""))[0]
        passed_on = bool(start) and raw.startswith(start) and self._request.stream
        if passed_on and received.reasoning == start + read.reasoning:
            read = replace(read, reasoning=received.reasoning)
        return difference(read, received)

    def candidates(self, received: ReceivedOutput) -> tuple[list[str], str]:
        """The raw texts that read back as ``received``, and when there are none, why."""
        hides_reasoning = getattr(self._parser_cls, "reasoning_parser_cls", None) is not None
        if hides_reasoning and not self._request.include_reasoning:
            # What the parser read as reasoning is not in the response at all.
            return [], "the request left the reasoning out of the response"
        bodies = self._tool_bodies(received)
        if bodies is None:
            name = self._serving.tool_call_parser
            return [], f"tool parser {name!r} is not reconstructed without token ids"
        joins = self._reasoning_joins(received.reasoning)
        if joins is None:
            name = self._serving.reasoning_parser
            return [], f"reasoning parser {name!r} is not rejoined without token ids"
        found: list[str] = []
        for before, body in itertools.product(joins, bodies):
            raw = before + body
            if raw not in found and self.check(raw, (), received) is None:
                found.append(raw)
        if not found:
            return [], "no raw output the committed parsers read as the received one"
        return found, ""

    def _tool_bodies(self, received: ReceivedOutput) -> list[str] | None:
        """The content with the tool calls written back in."""
        calls = received.tool_calls
        if not calls:
            return [received.content]
        if self._named_call_is_the_output():
            return [received.content + "".join(call.arguments for call in calls)]
        if self._serving.tool_call_parser not in RECONSTRUCTED_TOOL_PARSERS:
            return None
        separators = ("", "\n") if len(calls) > 1 else ("",)
        return [
            received.content + separator.join(_hermes_call(call, wrap) for call in calls)
            for wrap, separator in itertools.product(("\n", ""), separators)
        ]

    def _named_call_is_the_output(self) -> bool:
        """Whether the server reads a named tool choice's output whole as the call's
        arguments (a tool parser without a structural tag: its JSON-schema path)."""
        tool_parser = getattr(self._parser_cls, "tool_parser_cls", None)
        return _is_named_choice(self._request.tool_choice) and bool(
            getattr(tool_parser, "supports_required_and_named", False)
        )

    def _reasoning_joins(self, reasoning: str) -> list[str] | None:
        """What precedes the content: the reasoning with its delimiters, in each way
        the committed reasoning parser reads back (none without such a parser)."""
        cls = getattr(self._parser_cls, "reasoning_parser_cls", None)
        if cls is None:
            return [""]
        markers = self._markers()
        if markers is None:
            return None
        start, end = markers
        # (A streamed reasoning that starts with the start token, see `check`, is
        # the second form.)
        joins = [start + reasoning + end, reasoning + end]
        # Reasoning cut short (no end token) is all reasoning, then nothing.
        return [*joins, start + reasoning, reasoning]

    def _markers(self) -> tuple[str, str] | None:
        """The committed reasoning parser's start and end tokens (None: it has none)."""
        cls = getattr(self._parser_cls, "reasoning_parser_cls", None)
        if cls is None:
            return None
        parser = cls(self._llm.get_tokenizer(), model_config=self._llm.llm_engine.model_config)
        start, end = getattr(parser, "start_token", None), getattr(parser, "end_token", None)
        if isinstance(start, str) and isinstance(end, str) and start and end:
            return start, end
        return None


def parser_cls_tools(parser_cls: Any) -> bool:
    return getattr(parser_cls, "tool_parser_cls", None) is not None


def _is_responses(request: Any) -> bool:
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest

    return isinstance(request, ResponsesRequest)


def _is_named_choice(tool_choice: object) -> bool:
    """A tool choice naming one function (chat's form or the Responses API's)."""
    from openai.types.responses import ToolChoiceFunction
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionNamedToolChoiceParam,
    )

    return isinstance(tool_choice, ChatCompletionNamedToolChoiceParam | ToolChoiceFunction)


def _hermes_call(call: ToolCallView, wrap: str) -> str:
    name = json.dumps(call.name, ensure_ascii=False)
    body = '{"name": ' + name + ', "arguments": ' + call.arguments + "}"
    return "<tool_call>" + wrap + body + wrap + "</tool_call>"


def difference(read: ReceivedOutput, received: ReceivedOutput) -> str | None:
    """None when the client received what the server reads, else the first part
    that differs."""
    if read.reasoning != received.reasoning:
        return _text_difference("reasoning", read.reasoning, received.reasoning)
    if read.content != received.content:
        return _text_difference("content", read.content, received.content)
    if len(read.tool_calls) != len(received.tool_calls):
        return (
            f"the output reads as {len(read.tool_calls)} tool calls, the client "
            f"received {len(received.tool_calls)}"
        )
    for i, (ours, theirs) in enumerate(zip(read.tool_calls, received.tool_calls, strict=True)):
        if ours.name != theirs.name:
            return f"tool call {i}: the output calls {ours.name!r}, the client got {theirs.name!r}"
        if not _same_arguments(ours.arguments, theirs.arguments):
            return (
                f"tool call {i} ({ours.name}): the output's arguments are "
                f"{ours.arguments[:80]!r}, the client got {theirs.arguments[:80]!r}"
            )
    return None


def _same_arguments(a: str, b: str) -> bool:
    try:
        return bool(json.loads(a) == json.loads(b))
    except ValueError:
        return a == b


def _text_difference(part: str, read: str, received: str) -> str:
    at = first_difference(read, received)
    return (
        f"the output's {part} ({len(read)} characters) is not the {len(received)} the "
        f"client received; first difference at {at}: output {read[at : at + 24]!r}, "
        f"received {received[at : at + 24]!r}"
    )

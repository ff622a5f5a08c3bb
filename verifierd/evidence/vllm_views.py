"""The committed engine's own view of a captured request and of token ids (engine side).

Everything here calls vLLM's code for the installed (committed) version, so
the verifier renders and detokenizes exactly as the prover's server does:

- `render_request`: the request body is validated by vLLM's own request
  models (``ChatCompletionRequest`` / ``CompletionRequest`` /
  ``ResponsesRequest`` / ``AnthropicMessagesRequest``) and rendered by the
  engine's renderer with the parameters vLLM's server derives from it
  (``build_chat_params``, ``build_tok_params``: chat template, generation
  prompt, content parts and their format, ``add_special_tokens``,
  ``chat_template_kwargs``, ``continue_final_message``, tools); its
  ``SamplingParams`` come from the request's own ``to_sampling_params``,
  refused as the prover's engine refuses them under its committed
  ``--max-logprobs`` (the verifier's own engine serves every row); with
  ``echo``, the text vLLM's server puts before each choice's output
  (`RenderedRequest.echoed`, split off by `verifierd.evidence.echo`), whether
  the choice's logprobs begin with the echoed prompt's (``echoed_top``) and
  whether anything sampled is shown (not with ``max_tokens: 0``). A
  Responses request becomes chat messages as ``OnlineRenderer.render_responses``
  makes them (``construct_input_messages``: ``instructions`` as the system
  message, then ``input``); a Messages request becomes the chat request
  vLLM's ``AnthropicServingMessages.to_chat_completion_request`` makes of it
  (inline system messages merged first when the template demands it, probed as
  the server probes it), rendered as chat.
- `decode_output`: vLLM's incremental detokenizer (the one its output processor
  uses, primed with the prompt ids) fed one token per engine step, with the
  request's ``skip_special_tokens``, ``spaces_between_special_tokens``,
  ``include_stop_str_in_output``, ``min_tokens`` and stop strings.
- `ByteLevelText`: the tokenizer as the tokenization search needs it.

Chat (and the Messages and Responses requests rendered as chat) renders with
the server flags the commitment carries
(`verifierd.serving_flags`: ``--chat-template``, its content format and
default kwargs, the tool and reasoning parsers, whose ``adjust_request`` vLLM
applies to the request before sampling); `verifierd.evidence.output_parsing`
reads the raw output as those parsers do.
"""

from __future__ import annotations

import json
import types
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from verifierd.errors import VerifierdError
from verifierd.evidence.api_claims import MESSAGES, RESPONSES
from verifierd.evidence.client_view import CHAT, COMPLETIONS
from verifierd.evidence.logprobs import echoed_top_count
from verifierd.serving_flags import VLLM_DEFAULTS, ServingFlags

if TYPE_CHECKING:
    from verifierd.evidence.output_parsing import OutputParser

REPLACEMENT = "\ufffd"
#: Trailing U+FFFD characters whose bytes `ByteLevelText.text_after` still locates.
MAX_HELD_REPLACEMENTS = 64
#: vLLM's CompletionRequest default (the OpenAI API's) when max_tokens is absent.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


class RenderError(VerifierdError):
    """vLLM refuses to render the captured request (its server would have refused it)."""


@dataclass(frozen=True)
class RenderedRequest:
    """A captured request as the committed engine sees it."""

    #: One prompt per prompt of the request (chat: exactly one).
    prompts: tuple[tuple[int, ...], ...]
    #: vLLM's SamplingParams for the request (detokenizer settings, stop strings).
    params: Any
    #: max_tokens / max_completion_tokens / max_output_tokens as sent (None when absent,
    #: except for completions, whose API default is 16).
    max_tokens: int | None
    ignore_eos: bool
    #: Chat or Responses on a server with a reasoning or tool parser: how it reads
    #: the raw output.
    output: OutputParser | None = None
    #: With ``echo``: per prompt, the text vLLM's server puts before each choice's
    #: output (`verifierd.evidence.echo`); empty without echo.
    echoes: tuple[str, ...] = ()
    #: Completions with ``echo`` and ``logprobs``: the top entries per echoed prompt
    #: token at the head of the logprobs (`verifierd.evidence.logprobs.split_echoed`);
    #: None when they hold no echoed prompt.
    echoed_top: int | None = None
    #: False for ``echo`` with ``max_tokens: 0``: vLLM's server samples one token and
    #: shows only the prompt.
    shows_output: bool = True

    def echoed(self, prompt_index: int) -> str:
        """The text echoed before the output of a choice of prompt ``prompt_index``."""
        return self.echoes[prompt_index] if self.echoes else ""


def render_request(
    llm: Any, dialect: str, request_json: str, serving: ServingFlags = VLLM_DEFAULTS
) -> RenderedRequest:
    """Render ``request_json`` with the engine ``llm``'s renderer as a server started
    with ``serving`` renders it. Raises RenderError."""
    from pydantic import ValidationError
    from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest

    try:
        body = json.loads(request_json)
        if dialect == CHAT:
            return _render_chat(llm, ChatCompletionRequest.model_validate(body), serving)
        if dialect == COMPLETIONS:
            return _render_completion(llm, CompletionRequest.model_validate(body), serving)
        if dialect == RESPONSES:
            return _render_responses(llm, ResponsesRequest.model_validate(body), serving)
        if dialect == MESSAGES:
            request = AnthropicMessagesRequest.model_validate(body)
            return _render_chat(llm, _messages_as_chat(llm, request, serving), serving)
    except ValidationError as exc:
        raise RenderError(f"vLLM refuses the request: {_first_error(exc)}") from exc
    except (ValueError, TypeError, KeyError, NotImplementedError) as exc:
        raise RenderError(f"vLLM cannot render the request: {exc}") from exc
    raise RenderError(f"unknown API dialect {dialect!r}")


def _first_error(exc: Any) -> str:
    errors = exc.errors()
    if not errors:
        return str(exc)
    first = errors[0]
    return f"{'.'.join(str(p) for p in first.get('loc', ()))}: {first.get('msg', '')}"


def _render_chat(llm: Any, request: Any, serving: ServingFlags = VLLM_DEFAULTS) -> RenderedRequest:
    """As vLLM's OnlineRenderer.render_chat and preprocess_chat render a non-harmony
    chat request on a server started with ``serving``, its parser's
    ``adjust_request`` included."""
    from vllm.renderers import merge_kwargs

    from verifierd.evidence.output_parsing import (
        OutputParsingError,
        adjust_request,
        parser_class,
        parser_cls_tools,
    )

    model_config = llm.llm_engine.model_config
    try:
        parser_cls = parser_class(llm, serving)
    except OutputParsingError as exc:
        raise RenderError(str(exc)) from exc
    echo = bool(getattr(request, "echo", False))
    if echo and parser_cls is not None:
        raise RenderError("echo on a server with a reasoning or tool parser is not replayed")
    if request.tool_choice not in (None, "none") and not parser_cls_tools(parser_cls):
        # vLLM's server refuses it (it needs --enable-auto-tool-choice --tool-call-parser).
        raise RenderError(f"tool_choice {request.tool_choice!r} without the server's tool parser")
    excluded = request.tool_choice == "none" and serving.exclude_tools_when_tool_choice_none
    tools = None if request.tools is None or excluded else [t.model_dump() for t in request.tools]
    template, content_format = serving.chat_template, serving.chat_template_content_format
    chat_params = request.build_chat_params(template, content_format).with_defaults(
        merge_kwargs(serving.chat_template_kwargs, {"tools": tools, "tokenize": False})
    )
    # What the server builds its parser with (the kwargs without the tools).
    parser_kwargs = (
        request.build_chat_params(template, content_format)
        .with_defaults(serving.chat_template_kwargs)
        .chat_template_kwargs
    )
    tok_params = request.build_tok_params(model_config)
    (conversation,), (engine_input,) = llm.renderer.render_chat(
        [request.messages], chat_params, tok_params
    )
    echoes = (_chat_echo(request, conversation),) if echo else ()
    request = adjust_request(parser_cls, llm, request, chat_params.chat_template_kwargs)
    requested = request.max_completion_tokens or request.max_tokens
    return _rendered(
        llm,
        request,
        engine_input,
        requested=requested,
        parser_cls=parser_cls,
        serving=serving,
        parser_kwargs=parser_kwargs,
        echoes=echoes,
    )


def _rendered(
    llm: Any,
    request: Any,
    engine_input: Any,
    *,
    requested: int | None,
    parser_cls: Any,
    serving: ServingFlags,
    parser_kwargs: Any,
    echoes: tuple[str, ...] = (),
) -> RenderedRequest:
    """A rendered chat-shaped request (chat, Responses) as vLLM's server goes on with it:
    the sampling parameters it builds from the (parser-adjusted) ``request``, and the
    committed parsers' reading of the output (built with ``parser_kwargs``, the template
    kwargs without the tools) when the server has one."""
    from verifierd.evidence.output_parsing import OutputParser

    prompt = tuple(int(i) for i in engine_input["prompt_token_ids"])
    params = _served_params(llm, request, _room(llm, len(prompt), requested), serving)
    output = None
    if parser_cls is not None:
        output = OutputParser(
            llm,
            parser_cls,
            request,
            serving=serving,
            chat_template_kwargs=parser_kwargs,
            prompt=prompt,
        )
    return RenderedRequest((prompt,), params, requested, bool(params.ignore_eos), output, echoes)


#: vLLM's ``--response-role`` default, the role of the message a chat response adds.
RESPONSE_ROLE = "assistant"


def _chat_echo(request: Any, conversation: Sequence[Any]) -> str:
    """What vLLM's chat server echoes before each choice's content: the last
    message's content when that message has the response's role."""
    role = RESPONSE_ROLE if request.add_generation_prompt else request.messages[-1]["role"]
    if not conversation or conversation[-1].get("role") != role:
        return ""
    content = conversation[-1].get("content") or ""
    if isinstance(content, str):
        return content
    if request.stream:
        # The streamed server puts the parts themselves in a delta, which it cannot send.
        raise RenderError("echo of content parts is not replayed when streamed")
    try:
        return "\n".join(part["text"] for part in content)
    except (KeyError, TypeError) as exc:
        raise RenderError("echo of non-text content parts is not replayed") from exc


def _render_responses(llm: Any, request: Any, serving: ServingFlags) -> RenderedRequest:
    """As vLLM's OnlineRenderer.render_responses renders a non-harmony request that
    names no previous response, on a server started with ``serving``, its parser's
    ``adjust_request`` included (preprocess_chat changes the request in place, and
    the server builds the sampling parameters from it)."""
    from vllm.entrypoints.openai.responses.utils import (
        construct_input_messages,
        construct_tool_dicts,
    )
    from vllm.renderers import merge_kwargs

    from verifierd.evidence.output_parsing import (
        OutputParsingError,
        adjust_request,
        parser_class,
        parser_cls_tools,
    )

    model_config = llm.llm_engine.model_config
    if model_config.hf_config.model_type == "gpt_oss":
        raise RenderError("harmony (gpt-oss) Responses rendering is not replayed")
    if request.previous_response_id is not None or request.previous_input_messages:
        raise RenderError("a previous response's history is the server's, not in the capture")
    try:
        parser_cls = parser_class(llm, serving)
    except OutputParsingError as exc:
        raise RenderError(str(exc)) from exc
    others = sorted({tool.type for tool in request.tools} - {"function"})
    if others and parser_cls_tools(parser_cls):
        # Their calls are not function_call items (custom), or carry a namespace.
        raise RenderError(f"Responses tools of type {others} are not replayed")
    tool_dicts = construct_tool_dicts(
        request.tools,
        request.tool_choice,
        exclude_tools_when_tool_choice_none=serving.exclude_tools_when_tool_choice_none,
    )
    messages = construct_input_messages(
        request_instructions=request.instructions, request_input=request.input
    )
    template, content_format = serving.chat_template, serving.chat_template_content_format
    # What the server builds its parser with (the kwargs without the tools).
    template_kwargs = (
        request.build_chat_params(template, content_format)
        .with_defaults(serving.chat_template_kwargs)
        .chat_template_kwargs
    )
    chat_params = request.build_chat_params(template, content_format).with_defaults(
        merge_kwargs(template_kwargs, {"tools": tool_dicts, "tokenize": False})
    )
    (_conversation,), (engine_input,) = llm.renderer.render_chat(
        [messages], chat_params, request.build_tok_params(model_config)
    )
    request = adjust_request(parser_cls, llm, request, chat_params.chat_template_kwargs)
    return _rendered(
        llm,
        request,
        engine_input,
        requested=request.max_output_tokens,
        parser_cls=parser_cls,
        serving=serving,
        parser_kwargs=template_kwargs,
    )


def _messages_as_chat(llm: Any, request: Any, serving: ServingFlags) -> Any:
    """The ChatCompletionRequest vLLM's Messages server, started with ``serving``, runs
    for ``request``."""
    from vllm.entrypoints.anthropic.serving import AnthropicServingMessages

    if request.thinking is not None and request.thinking.type == "disabled":
        # The server probes its renderer for the effort that disables thinking.
        raise RenderError("thinking disabled is not replayed")
    # What the server's probe reads of its OnlineRenderer.
    renderer: Any = types.SimpleNamespace(
        renderer=llm.renderer,
        chat_template=serving.chat_template,
        model_config=llm.llm_engine.model_config,
    )
    merge = AnthropicServingMessages._should_merge_inline_system(renderer)
    return AnthropicServingMessages.to_chat_completion_request(request, merge_inline_system=merge)


def _render_completion(llm: Any, request: Any, serving: ServingFlags) -> RenderedRequest:
    """As vLLM's OnlineRenderer.render_completion renders a text or token-id prompt."""
    from vllm.renderers.inputs.preprocess import parse_model_prompt, prompt_to_seq

    model_config = llm.llm_engine.model_config
    if request.suffix is not None or request.prompt_embeds is not None:
        raise RenderError("suffix and prompt_embeds are not replayed")
    if request.echo and request.max_tokens == 0 and request.logprobs is None:
        raise RenderError("echo with max_tokens 0 and no logprobs shows nothing of the model")
    parsed = [parse_model_prompt(model_config, p) for p in prompt_to_seq(request.prompt)]
    # With echo (and without return_token_ids) these ask the renderer for the prompt's text.
    inputs = llm.renderer.render_cmpl(parsed, request.build_tok_params(model_config))
    prompts = tuple(tuple(int(i) for i in e["prompt_token_ids"]) for e in inputs)
    requested = request.max_tokens
    if requested is None:
        requested = COMPLETIONS_DEFAULT_MAX_TOKENS
    params = _served_params(llm, request, _room(llm, len(prompts[0]), requested), serving)
    echo = bool(request.echo)
    echoes = tuple(_completion_echo(request, e) for e in inputs) if echo else ()
    return RenderedRequest(
        prompts,
        params,
        requested,
        bool(params.ignore_eos),
        echoes=echoes,
        echoed_top=echoed_top_count(echo, request.logprobs, request.prompt_logprobs),
        # vLLM's server samples max_tokens 1 and sends the prompt alone.
        shows_output=not (echo and requested == 0),
    )


def _completion_echo(request: Any, engine_input: Any) -> str:
    """What vLLM's completions server echoes before each choice's text: the prompt's
    text as the renderer left it (the request's, or its ids decoded), nothing when
    the request asks for return_token_ids."""
    if request.return_token_ids:
        return ""
    text = engine_input.get("prompt")
    if not isinstance(text, str):
        raise RenderError("vLLM's renderer gives no prompt text to echo")
    return text


def _served_params(llm: Any, request: Any, max_tokens: int, serving: ServingFlags) -> Any:
    """The SamplingParams vLLM's server builds from ``request``, checked as its engine
    checks their logprobs (``SamplingParams._validate_logprobs``) on a server started
    with ``serving``'s ``--max-logprobs``: this engine's own bound is not the prover's."""
    from vllm.exceptions import VLLMValidationError

    params = request.to_sampling_params(max_tokens, {})
    model_config = llm.llm_engine.model_config
    served: Any = types.SimpleNamespace(
        max_logprobs=serving.max_logprobs,
        get_vocab_size=model_config.get_vocab_size,
        max_model_len=model_config.max_model_len,
    )
    try:
        params._validate_logprobs(served)
    except VLLMValidationError as exc:
        raise RenderError(
            f"vLLM's server refuses the request (--max-logprobs {serving.max_logprobs}): {exc}"
        ) from exc
    return params


def context_limit(llm: Any) -> int:
    """The committed model's context length (its config's, not this engine's setting)."""
    config = llm.llm_engine.model_config.hf_config
    limit = getattr(config, "max_position_embeddings", None)
    return int(limit) if isinstance(limit, int) else int(llm.llm_engine.model_config.max_model_len)


def _room(llm: Any, prompt_len: int, requested: int | None) -> int:
    room = max(1, context_limit(llm) - prompt_len)
    return room if requested is None else max(1, min(requested, room))


@dataclass(frozen=True)
class DecodedOutput:
    """What vLLM's detokenizer makes of output ids for one request."""

    text: str
    #: The stop string that ended the output, None when none did.
    stop_string: str | None
    #: Tokens the engine would have produced before stopping (stop string, end token).
    tokens_used: int


def decode_output(
    tokenizer: Any,
    params: Any,
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    end_tokens: frozenset[int],
) -> DecodedOutput:
    """Feed ``output_ids`` to vLLM's incremental detokenizer one engine step at a
    time, stopping where the engine would (a stop string or an end token)."""
    from vllm.v1.engine.detokenizer import IncrementalDetokenizer

    # The detokenizer reads only these three fields of the engine's request.
    request: Any = types.SimpleNamespace(
        sampling_params=params, prompt_token_ids=list(prompt_ids), request_id="veritap"
    )
    detokenizer = IncrementalDetokenizer.from_new_request(tokenizer, request)
    stop_string: str | None = None
    used = 0
    for token in output_ids:
        used += 1
        stopped_by_token = (
            token in end_tokens and not params.ignore_eos and used > params.min_tokens
        )
        stop_string = detokenizer.update([int(token)], stopped_by_token)
        if stop_string is not None or stopped_by_token:
            break
    return DecodedOutput(detokenizer.get_next_output_text(True, False), stop_string, used)


def end_tokens(llm: Any, params: Any) -> frozenset[int]:
    """The ids that end generation for a request: the tokenizer's EOS, the model's
    generation_config EOS ids, and the request's stop_token_ids."""
    tokenizer = llm.get_tokenizer()
    ids = {int(i) for i in (params.stop_token_ids or ())}
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    generation = llm.llm_engine.model_config.try_get_generation_config() or {}
    eos = generation.get("eos_token_id")
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, list):
        ids.update(int(i) for i in eos if isinstance(i, int))
    return frozenset(ids)


class ByteLevelText:
    """A byte-level BPE vocabulary (GPT-2, Llama 3, Qwen) as the search reads it."""

    def __init__(self, tokenizer: Any, width: int, skip_special_tokens: bool) -> None:
        self._tokenizer = tokenizer
        self.token_bytes, self._single = _byte_table(tokenizer, width, skip_special_tokens)

    @classmethod
    def supports(cls, tokenizer: Any) -> bool:
        decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
        return type(decoder).__name__ == "ByteLevel"

    def segment(self, text: str) -> list[int]:
        return [int(i) for i in self._tokenizer.encode(text, add_special_tokens=False)]

    def byte_tokens(self, data: bytes) -> list[int] | None:
        return [self._single[b] for b in data]

    def bytes_of(self, token: int) -> bytes:
        """The bytes ``token`` decodes to (none outside the table)."""
        table = self.token_bytes
        return table[token] if 0 <= token < len(table) else b""

    def text_after(self, ids: Sequence[int]) -> tuple[str, bytes]:
        """As vLLM's detokenizer (tokenizers' DecodeStream) emits it: the bytes decoded
        with U+FFFD for invalid sequences, except that nothing is emitted while the
        decoding ends in U+FFFD (an incomplete or invalid tail is held back)."""
        table = self.token_bytes
        raw = b"".join(table[i] if 0 <= i < len(table) else b"" for i in ids)
        text = raw.decode("utf-8", "replace")
        if not text.endswith(REPLACEMENT):
            return text, b""
        emitted = text.rstrip(REPLACEMENT)
        held = len(text) - len(emitted)
        if held > MAX_HELD_REPLACEMENTS:
            # Only the search's next guess depends on these bytes; the decoding check
            # of the final ids is vLLM's own. A prover's text of endless U+FFFD must not
            # make each call quadratic.
            return emitted, b""
        # Each U+FFFD stands for 1 to 3 bytes, so the held-back run lies in the last
        # 3 * held bytes; decoding resynchronises at a byte that continues no sequence.
        start = max(0, len(raw) - 4 * held)
        while start > 0 and 0x80 <= raw[start] < 0xC0:
            start -= 1
        rest = emitted[len(raw[:start].decode("utf-8", "replace")) :]
        # The held-back bytes start after the last character that is not U+FFFD.
        cut = len(raw)
        while cut > start and raw[start:cut].decode("utf-8", "replace") != rest:
            cut -= 1
        return emitted, raw[cut:]


def _byte_table(
    tokenizer: Any, width: int, skip_special_tokens: bool
) -> tuple[list[bytes], list[int]]:
    """Each id's bytes (padding ids and skipped special tokens: none), and the id of
    each single byte."""
    byte_of = {char: byte for byte, char in byte_level_alphabet().items()}
    # tokenizers' decoders skip the added tokens flagged special, whatever the
    # tokenizer's special_tokens_map says.
    decoder = tokenizer.added_tokens_decoder
    special = {int(i) for i, t in decoder.items() if t.special}
    added = {int(i): t.content for i, t in decoder.items()}
    table = [b""] * width
    pieces = tokenizer.convert_ids_to_tokens(list(range(min(width, len(tokenizer)))))
    for token_id, piece in enumerate(pieces):
        if token_id in added:
            skipped = skip_special_tokens and token_id in special
            table[token_id] = b"" if skipped else added[token_id].encode("utf-8")
        elif piece is not None and all(c in byte_of for c in piece):
            table[token_id] = bytes(byte_of[c] for c in piece)
    single: dict[int, int] = {}
    for token_id, data in enumerate(table):
        if len(data) == 1 and token_id not in added:
            single.setdefault(data[0], token_id)
    if len(single) < 256:
        raise RenderError("the tokenizer lacks a token for every byte: not byte-level")
    return table, [single[b] for b in range(256)]


def byte_level_alphabet() -> dict[int, str]:
    """GPT-2's byte-level BPE alphabet: each byte as the printable character that
    stands for it in the vocabulary (printable Latin-1 bytes as themselves, the
    others shifted past U+00FF in byte order)."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    alphabet = {b: chr(b) for b in printable}
    shifted = (b for b in range(256) if b not in alphabet)
    for offset, b in enumerate(shifted):
        alphabet[b] = chr(0x100 + offset)
    return alphabet

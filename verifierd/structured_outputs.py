"""Structured outputs (vLLM's grammar-constrained sampling), as the verifier replays them.

vLLM 0.32's OpenAI server turns a request's ``response_format`` and
``structured_outputs`` into one ``StructuredOutputsParams``
(vllm/entrypoints/generate/base/protocol.py
``structured_outputs_from_response_format``): ``response_format`` of type
``json_object`` sets ``json_object``, ``json_schema`` sets ``json`` to its
``schema``, ``text`` changes nothing, and the result replaces the same field of
``structured_outputs``. The engine then validates it against the server's
``--structured-outputs-config`` (which picks the backend: ``auto`` tries
xgrammar and falls back to guidance or outlines), compiles the grammar once per
request, and before every sampling step sets the logits of every token the
grammar does not allow after the output so far to -inf.

The Responses API's ``text.format`` is vLLM's ``ResponsesRequest``
``extract_structured_outputs`` (vllm/entrypoints/openai/responses/protocol.py):
``json_object`` sets ``json_object``, ``json_schema`` (a string ``name`` and a
``schema`` object are required) sets ``json`` to its ``schema`` alone (``name``,
``description`` and ``strict`` change nothing), ``text`` sets nothing, and the
request may not name ``structured_outputs`` besides; without a format its
``structured_outputs`` stand. A request with a ``text.format`` is read as the
Responses server reads it (another API's server ignores the field: the engine
refuses a constraint its own request model does not derive).

`structured_output_params` is that derivation on the raw request (key order
kept: a JSON schema's property order is the order its grammar imposes);
`StructuredOutputsEngine` is the server's setting and the versions of the
grammar libraries it runs, which a commitment records; `StructuredOutput` is one
request's constraint as it travels to the engine (verifierd.engine.grammar
compiles it with vLLM's own backend code and rebuilds the mask per position).

A request with ``tools`` is constrained too where vLLM's tool parser says so: on
a server whose tool parser names a structural-tag model (``hermes``:
``structural_tag_model``), vLLM's parser (vllm/parser/abstract_parser.py
``_apply_structural_tag``) replaces the request's structured outputs with a
structural tag built from the tools (vllm/tool_parsers/structural_tag_registry.py
``get_model_structural_tag``, at the server's ``--tool-strict-level`` raised to
the parser's default, one call only under ``parallel_tool_calls: false``) for
``tool_choice`` "required" or a named function, and for "auto" (or none named)
when the level is ``function`` or ``parameter`` or a tool is ``strict``
(``resolve_tool_strictness``; ``parallel_tool_calls: false`` without a format
raises the level to ``function``): text or calls in the tag's envelope, or, beside a
``response_format`` xgrammar supports, either the calls or that format (an
``OrFormat``). `tool_choice_params` takes those steps in vLLM's order with the
same functions of the installed (committed) vLLM on the captured request (the
tools read as chat's, or as the Responses API's when in its shape); the engine
checks the result against what vLLM's own ``adjust_request`` makes of the
request before scoring with it.

On a server with a reasoning parser vLLM's engine applies the grammar only from
the token after the one that ends the reasoning (the parser's
``is_reasoning_end_streaming``), unless the request leaves the reasoning out
(``include_reasoning: false``: constrained from the first token);
`StructuredOutput.reasoning_parser` carries that parser to the mask.

A tool parser without a structural-tag model (or with
``VLLM_ENFORCE_STRICT_TOOL_CALLING`` off) gets vLLM's JSON-schema constraint
instead (``ToolParser.adjust_request``, ``get_json_schema_from_tools``: named,
the function's parameters; required, an array of ``{name, parameters}``); one
that reads forced calls in its own format (``supports_required_and_named``
false) gets none. vLLM reads that variable from its environment once per
process, so the commitment records the prover's and a verifier whose own
differs refuses every request with tools (`strict_tool_calling_mismatch`).

A tool parser that builds its own tag (``get_structural_tag`` overridden:
``hy_v4``) is asked for it with vLLM's own override, called on a stand-in for
the parser instance (`_ParserWithoutState`): the daemon has no tokenizer to
build a real one with. Where the override decides from the request alone it is
replayed (``hy_v4`` builds no tag for ``tool_choice`` auto: the request's own
constraint applies); where it reads the instance (``hy_v4``'s forced calls
need the checkpoint's token suffix, read off the tokenizer's vocabulary) the
request stays unreplayed.

Not replayed (the request stays ``sampler_not_reproducible``): structural tags a
request sends itself, a tag a tool parser builds from its instance's state,
and a backend other than xgrammar or guidance.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from verifierd.errors import VerifierdError
from verifierd.serving_flags import ServingFlags

#: Server settings whose grammars the verifier rebuilds.
REPLAYED_BACKENDS = ("auto", "xgrammar", "guidance")
#: The library (distribution name) behind each backend vLLM may pick.
BACKEND_LIBRARIES: Mapping[str, str] = {"xgrammar": "xgrammar", "guidance": "llguidance"}
#: Fields of vLLM's StructuredOutputsParams a request may set.
_PARAMS_FIELDS = frozenset(
    {
        "json",
        "regex",
        "choice",
        "grammar",
        "json_object",
        "structural_tag",
        "disable_any_whitespace",
        "disable_additional_properties",
        "whitespace_pattern",
    }
)
#: The fields that name a constraint (exactly one must be set).
_CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


class StructuredOutputError(VerifierdError):
    """A request's structured output cannot be replayed (the detail says why)."""


@dataclass(frozen=True)
class StructuredOutputsEngine:
    """The prover server's structured-output setting and its grammar libraries."""

    #: ``--structured-outputs-config.backend``.
    backend: str = "auto"
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    #: (distribution, version) of every library the backend may use, sorted.
    libraries: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not self.backend:
            raise StructuredOutputError("the structured-output backend must be named")
        names = [name for name, _ in self.libraries]
        if names != sorted(set(names)):
            raise StructuredOutputError("structured-output libraries must be sorted and unique")

    @classmethod
    def installed(
        cls,
        backend: str = "auto",
        *,
        disable_any_whitespace: bool = False,
        disable_additional_properties: bool = False,
    ) -> StructuredOutputsEngine:
        """The setting with the versions of the grammar libraries installed here."""
        libraries = []
        for library in sorted(set(BACKEND_LIBRARIES.values())):
            try:
                libraries.append((library, importlib.metadata.version(library)))
            except importlib.metadata.PackageNotFoundError:
                continue
        return cls(backend, disable_any_whitespace, disable_additional_properties, tuple(libraries))

    def to_json(self) -> dict[str, object]:
        return {
            "backend": self.backend,
            "disable_any_whitespace": self.disable_any_whitespace,
            "disable_additional_properties": self.disable_additional_properties,
            "libraries": dict(self.libraries),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StructuredOutputsEngine:
        """Raises StructuredOutputError on a malformed value."""
        expected = {"backend", "disable_any_whitespace", "disable_additional_properties"}
        if not isinstance(data, Mapping) or set(data) != expected | {"libraries"}:
            raise StructuredOutputError(f"structured_outputs must name exactly {sorted(expected)}")
        libraries = data["libraries"]
        flags = [data["disable_any_whitespace"], data["disable_additional_properties"]]
        if (
            not isinstance(data["backend"], str)
            or not all(isinstance(f, bool) for f in flags)
            or not isinstance(libraries, Mapping)
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in libraries.items())
        ):
            raise StructuredOutputError("structured_outputs has a value of the wrong type")
        return cls(data["backend"], flags[0], flags[1], tuple(sorted(libraries.items())))

    def replay_problem(self, backend: str) -> str | None:
        """Why a grammar of ``backend`` (the one vLLM picked for a request) cannot be
        rebuilt here, or None: the setting must be replayed and the library must be
        installed at the committed version."""
        if self.backend not in REPLAYED_BACKENDS:
            return f"structured-output backend {self.backend!r} is not replayed"
        if self.backend == "auto" and backend != "xgrammar":
            # vLLM 0.32 compiles every grammar with the backend of a server's first
            # structured request: after a fallback it is not known which one ran.
            return f"backend 'auto' fell back to {backend!r} for this request"
        library = BACKEND_LIBRARIES.get(backend)
        if library is None:
            return f"structured-output backend {backend!r} is not replayed"
        committed = dict(self.libraries).get(library)
        try:
            installed = importlib.metadata.version(library)
        except importlib.metadata.PackageNotFoundError:
            installed = None
        if committed is None or committed != installed:
            return f"{library} {installed} is installed, the commitment names {committed}"
        return None


@dataclass(frozen=True)
class StructuredOutput:
    """One request's constraint: vLLM's StructuredOutputsParams fields as its server
    derives them from the request (a JSON object, request key order), and the
    committed setting that compiles it."""

    params_json: str
    engine: StructuredOutputsEngine
    #: The server's reasoning parser when vLLM gates the grammar on the reasoning's
    #: end (None: the grammar applies from the first output token).
    reasoning_parser: str | None = None

    def params(self) -> dict[str, Any]:
        value = json.loads(self.params_json)
        if not isinstance(value, dict):
            raise StructuredOutputError("structured output params are not a JSON object")
        return value

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"params_json": self.params_json, "engine": self.engine.to_json()}
        if self.reasoning_parser is not None:
            out["reasoning_parser"] = self.reasoning_parser
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StructuredOutput:
        """Raises StructuredOutputError on a malformed value."""
        if not isinstance(data, Mapping) or not isinstance(data.get("params_json"), str):
            raise StructuredOutputError("a structured output needs params_json")
        reasoning_parser = data.get("reasoning_parser")
        if reasoning_parser is not None and not (
            isinstance(reasoning_parser, str) and reasoning_parser
        ):
            raise StructuredOutputError("a structured output's reasoning_parser is a name")
        engine = StructuredOutputsEngine.from_json(data["engine"])
        return cls(data["params_json"], engine, reasoning_parser)


def structured_output_params(request: Mapping[str, Any]) -> dict[str, Any] | None:
    """The StructuredOutputsParams fields vLLM's server derives from a chat,
    completions or Responses request (None: no constraint), or StructuredOutputError
    for a constraint that is not replayed or that vLLM would refuse."""
    text_format = _text_format(request)
    if text_format is not None:
        if request.get("structured_outputs") is not None:
            raise StructuredOutputError("vLLM refuses structured_outputs beside text.format")
        return _text_format_params(text_format)
    given = request.get("structured_outputs")
    fields: dict[str, Any] | None = None
    if given is not None:
        if not isinstance(given, dict):
            raise StructuredOutputError("structured_outputs is not an object")
        unknown = sorted(set(given) - _PARAMS_FIELDS)
        if unknown:
            raise StructuredOutputError(f"structured_outputs names unknown fields {unknown}")
        fields = dict(given)
    response_format = request.get("response_format")
    if response_format is not None:
        if not isinstance(response_format, dict):
            raise StructuredOutputError("response_format is not an object")
        kind = response_format.get("type")
        if kind == "json_object":
            fields = {**(fields or {}), "json_object": True}
        elif kind == "json_schema":
            spec = response_format.get("json_schema")
            schema = spec.get("schema") if isinstance(spec, dict) else None
            if not isinstance(schema, dict):
                raise StructuredOutputError("response_format json_schema carries no schema")
            fields = {**(fields or {}), "json": schema}
        elif kind == "structural_tag":
            raise StructuredOutputError("structural tags are not replayed")
        elif kind != "text":
            raise StructuredOutputError(f"response_format type {kind!r} is unknown")
    if fields is None:
        return None
    constraints = [name for name in _CONSTRAINTS if fields.get(name) is not None]
    if "structural_tag" in constraints:
        raise StructuredOutputError("structural tags are not replayed")
    if len(constraints) != 1:
        raise StructuredOutputError(
            f"structured outputs with constraints {constraints}: vLLM needs exactly one"
        )
    return fields


#: The fields of the Responses API's ``text`` (``verbosity``: vLLM ignores it).
_TEXT_FIELDS = frozenset({"format", "verbosity"})


def _text_format(request: Mapping[str, Any]) -> object:
    """The Responses API's ``text.format`` (None: absent)."""
    text = request.get("text")
    if text is None:
        return None
    if not isinstance(text, dict):
        raise StructuredOutputError("text is not an object")
    unknown = sorted(set(text) - _TEXT_FIELDS)
    if unknown:
        raise StructuredOutputError(f"text names unknown fields {unknown}")
    return text.get("format")


def _text_format_params(text_format: object) -> dict[str, Any] | None:
    """``ResponsesRequest.extract_structured_outputs`` of a ``text.format``."""
    if not isinstance(text_format, dict):
        raise StructuredOutputError("text.format is not an object")
    kind = text_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        schema = text_format.get("schema")
        if not isinstance(text_format.get("name"), str) or not isinstance(schema, dict):
            raise StructuredOutputError("text.format json_schema needs a name and a schema")
        return {"json": schema}
    raise StructuredOutputError(f"text.format type {json.dumps(kind)[:40]} is unknown")


def forces_tool_call(request: Mapping[str, Any]) -> bool:
    """Whether the request has tools and a tool_choice that makes vLLM call one."""
    choice = request.get("tool_choice")
    return bool(request.get("tools")) and (choice == "required" or isinstance(choice, dict))


def tool_parser_reads(request: Mapping[str, Any]) -> bool:
    """Whether vLLM's tool parser may constrain the request: it has tools and a
    tool_choice other than "none" (absent: "auto", as both servers read it)."""
    return bool(request.get("tools")) and request.get("tool_choice") != "none"


def strict_tool_calling_mismatch(request: Mapping[str, Any], serving: ServingFlags) -> str | None:
    """Why ``request``'s tools cannot be replayed as the prover handled them (None: they
    can, or the server parses no tools): vLLM reads VLLM_ENFORCE_STRICT_TOOL_CALLING
    once per process (whether a tool parser builds structural tags, for forced calls
    and strict tools, and whether it reads forced calls itself), so the verifier's
    own setting must be the one the commitment records for the prover."""
    if not request.get("tools") or serving.tool_call_parser is None:
        return None
    from vllm import envs

    own = bool(envs.VLLM_ENFORCE_STRICT_TOOL_CALLING)
    if own == serving.enforce_strict_tool_calling:
        return None
    return (
        "the prover serves tools with VLLM_ENFORCE_STRICT_TOOL_CALLING="
        f"{int(serving.enforce_strict_tool_calling)}, this verifier runs with {int(own)}"
    )


def tool_choice_params(request: Mapping[str, Any], serving: ServingFlags) -> dict[str, Any] | None:
    """The StructuredOutputsParams fields of a request that `tool_parser_reads`, as
    vLLM's tool parser leaves them (see the module docstring; None: no constraint),
    or StructuredOutputError when they are not rebuilt."""
    parser = serving.tool_call_parser
    if parser is None or not serving.enable_auto_tool_choice:
        if not forces_tool_call(request):
            return structured_output_params(request)
        raise StructuredOutputError(
            f"tool_choice {json.dumps(request.get('tool_choice'))[:80]} without the "
            "server's tool parser"
        )
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
    from vllm.exceptions import VLLMError
    from vllm.tool_parsers import ToolParserManager
    from vllm.tool_parsers.utils import get_json_schema_from_tools

    try:
        parser_cls = ToolParserManager.get_tool_parser(parser)
    except KeyError as exc:
        raise StructuredOutputError(f"vLLM has no tool parser {parser!r}") from exc
    # The fields the constraint is built from (the messages need not be at hand).
    fields = {
        k: request[k] for k in ("tools", "tool_choice", "parallel_tool_calls") if k in request
    }
    try:
        parsed: Any = (
            ResponsesRequest.model_validate({"input": "", **fields})
            if _responses_tools(request.get("tools"))
            else ChatCompletionRequest.model_validate({"messages": [], **fields})
        )
        if parser_cls.structural_tag_model is not None and serving.enforce_strict_tool_calling:
            tag = _structural_tag_params(request, parsed, parser_cls, serving)
            if tag is not None:
                return tag
        # ToolParser.adjust_request: a JSON schema of the calls (named: the arguments).
        if not parser_cls.supports_required_and_named:
            return structured_output_params(request)
        schema = get_json_schema_from_tools(
            tool_choice=parsed.tool_choice,
            tools=parsed.tools,
            parallel_tool_calls=parsed.parallel_tool_calls,
        )
    except (ValueError, TypeError, KeyError, AttributeError, VLLMError) as exc:
        # (vLLM's own validators index malformed tools: its server fails them too.)
        raise StructuredOutputError(f"vLLM refuses the tools: {exc!r}") from exc
    return structured_output_params(request) if schema is None else {"json": schema}


def _responses_tools(tools: object) -> bool:
    """Whether ``tools`` are in the Responses API's shape (a function's name at the
    top, not under ``function``), which vLLM reads with its ``ResponsesRequest``."""
    return isinstance(tools, list) and any(
        isinstance(tool, dict) and "function" not in tool for tool in tools
    )


def _structural_tag_params(
    request: Mapping[str, Any], parsed: Any, parser_cls: Any, serving: ServingFlags
) -> dict[str, Any] | None:
    """``Parser._apply_structural_tag`` step for step, with its vLLM functions: the
    structural tag that replaces the request's structured outputs (None: the parser
    leaves them). ``parsed`` is the request as vLLM's request model reads its tools;
    the caller has checked that the server enforces strict tool calling (without it
    the parser's ``get_structural_tag`` builds none)."""
    from openai.types.responses import ToolChoiceCustom, ToolChoiceFunction
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionNamedToolChoiceParam,
    )
    from vllm.parser.abstract_parser import _xgrammar_supports, structured_outputs_to_format
    from vllm.sampling_params import StructuredOutputsParams
    from vllm.tool_parsers.abstract_tool_parser import ToolParser
    from vllm.tool_parsers.structural_tag_registry import (
        get_model_structural_tag,
        get_structural_tag_tools,
        limit_to_single_tool_call,
        resolve_tool_strictness,
    )
    from vllm.tool_parsers.tool_strict_level import ToolStrictLevel
    from xgrammar import StructuralTag
    from xgrammar.structural_tag import OrFormat

    choice = parsed.tool_choice
    named = (ChatCompletionNamedToolChoiceParam, ToolChoiceFunction, ToolChoiceCustom)
    if not (choice in ("auto", "required") or isinstance(choice, named)):
        return None
    is_auto = choice == "auto"
    # A forced call ignores the request's own structured outputs.
    own = structured_output_params(request) if is_auto else None
    structured_outputs = None if own is None else StructuredOutputsParams(**own)
    single_call = parsed.parallel_tool_calls is False
    level = ToolStrictLevel.from_name(serving.tool_strict_level)
    if level == ToolStrictLevel.AUTO and parser_cls.default_tool_strict_level is not None:
        level = parser_cls.default_tool_strict_level
    if single_call and not (is_auto and structured_outputs is not None):
        level = max(level, ToolStrictLevel.FUNCTION)
    model = parser_cls.structural_tag_model
    resolved = resolve_tool_strictness(
        get_structural_tag_tools(model, parsed.tools, choice), choice, level
    )
    output_format = None
    if resolved and is_auto and structured_outputs is not None:
        if not _xgrammar_supports(structured_outputs):
            return None
        output_format = structured_outputs_to_format(structured_outputs)
    if resolved is None:
        return None
    # The "auto" tag allows plain text, which the output format's branch covers.
    tag_choice: Any = "required" if output_format is not None else choice
    if parser_cls.get_structural_tag is ToolParser.get_structural_tag:
        tag = get_model_structural_tag(
            model, parsed.tools, tag_choice, reasoning=False, strict_level=level
        )
    else:
        tag = _own_structural_tag(
            parser_cls, parsed.model_copy(update={"tool_choice": tag_choice}), level
        )
    if tag is None:
        return None
    if single_call:
        limit_to_single_tool_call(tag)
    if output_format is not None:
        tag = StructuralTag(format=OrFormat(elements=[tag.format, output_format]))
    return {"structural_tag": json.dumps(tag.model_dump())}


class _ParserStateRead(BaseException):
    """A tool parser's own ``get_structural_tag`` read its instance's state. A
    BaseException, so the parser's own ``except Exception`` fallbacks (``hy_v4``
    returns no tag when building one fails) do not turn it into an answer."""


class _ParserWithoutState:
    """Stands in for a tool parser instance, which is built from the committed
    tokenizer the daemon does not load: the parser class's plain attributes read as
    the class's (``structural_tag_model``); anything else, what an instance holds or
    a method it would call on itself, raises `_ParserStateRead`."""

    def __init__(self, parser_cls: type) -> None:
        self._parser_cls = parser_cls

    def __getattr__(self, name: str) -> Any:
        value = inspect.getattr_static(self._parser_cls, name, _ParserStateRead)
        if value is _ParserStateRead or callable(value) or hasattr(value, "__get__"):
            raise _ParserStateRead(name)
        return value


def _own_structural_tag(parser_cls: Any, request: Any, level: Any) -> Any:
    """The tag a tool parser's own ``get_structural_tag`` builds for ``request``, or
    StructuredOutputError where it reads its instance's state."""
    try:
        return parser_cls.get_structural_tag(
            _ParserWithoutState(parser_cls), request, reasoning=False, strict_level=level
        )
    except _ParserStateRead as read:
        raise StructuredOutputError(
            f"tool parser {parser_cls.__name__} builds its own tag from its instance's "
            f"{read.args[0]!s} (the tokenizer's), which is not replayed"
        ) from None


def structured_output(
    request: Mapping[str, Any],
    engine: StructuredOutputsEngine | None,
    serving: ServingFlags | None = None,
) -> StructuredOutput | None:
    """The request's constraint with the committed setting (None: no constraint);
    StructuredOutputError when it cannot be replayed. ``serving``: the committed
    server flags (their tool and reasoning parsers; None: vLLM's defaults)."""
    serving = serving or ServingFlags()
    fields = (
        tool_choice_params(request, serving)
        if tool_parser_reads(request)
        else structured_output_params(request)
    )
    if fields is None:
        return None
    if engine is None:
        raise StructuredOutputError("the commitment names no structured-output backend")
    if engine.backend not in REPLAYED_BACKENDS:
        raise StructuredOutputError(f"structured-output backend {engine.backend!r} is not replayed")
    gated = serving.reasoning_parser is not None and request.get("include_reasoning") is not False
    return StructuredOutput(
        json.dumps(fields, ensure_ascii=False), engine, serving.reasoning_parser if gated else None
    )

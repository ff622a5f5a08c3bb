"""The prover's vLLM server flags that change how a chat request renders or its output reads.

vLLM's OpenAI server renders a chat request with its ``--chat-template`` (else
the tokenizer's), ``--chat-template-content-format`` and
``--default-chat-template-kwargs``, and turns the model's raw output into what
the client reads with ``--reasoning-parser`` (reasoning split off) and, under
``--enable-auto-tool-choice``, ``--tool-call-parser`` (tool calls pulled out
of the content; ``--tool-strict-level`` may constrain them with a grammar, and
``--exclude-tools-when-tool-choice-none`` leaves the tools out of the prompt),
and reads ``VLLM_ENFORCE_STRICT_TOOL_CALLING`` from its environment (on by
default: structural tags for tool calls). ``--max-logprobs`` bounds the
logprobs a request may ask for (vLLM refuses more). The verifier needs the
same flags to rebuild the prompt and the raw output and to refuse what the
server refuses, so a commitment carries them
(`verifierd.commitments`); a commitment written before they existed carries
vLLM's defaults.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from verifierd.errors import VerifierdError

#: vLLM's choices for --chat-template-content-format and --tool-strict-level.
CONTENT_FORMATS = ("auto", "string", "openai")
TOOL_STRICT_LEVELS = ("auto", "function", "parameter")


class ServingFlagsError(VerifierdError):
    """Serving flags that vLLM would refuse, or a malformed commitment entry."""


@dataclass(frozen=True)
class ServingFlags:
    """The flags, each named after its vLLM option; the defaults are vLLM's."""

    #: The text of --chat-template (None: the committed tokenizer's own template).
    chat_template: str | None = None
    chat_template_content_format: str = "auto"
    #: --default-chat-template-kwargs as canonical JSON of an object.
    default_chat_template_kwargs: str = "{}"
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    #: --exclude-tools-when-tool-choice-none: tools not rendered for tool_choice none.
    exclude_tools_when_tool_choice_none: bool = False
    #: --tool-strict-level: from "function" on, tool calls under tool_choice auto are
    #: constrained by a grammar too.
    tool_strict_level: str = "auto"
    #: VLLM_ENFORCE_STRICT_TOOL_CALLING in the server's environment (not a flag: vLLM
    #: reads it once per process, so the verifier's own must agree to replay tools).
    enforce_strict_tool_calling: bool = True
    #: --max-logprobs: the most ``logprobs`` / ``top_logprobs`` / ``prompt_logprobs`` a
    #: request may ask for (-1: the vocabulary, so -1 too).
    max_logprobs: int = 20

    def __post_init__(self) -> None:
        if self.chat_template_content_format not in CONTENT_FORMATS:
            raise ServingFlagsError(
                f"chat_template_content_format must be one of {CONTENT_FORMATS}: "
                f"{self.chat_template_content_format!r}"
            )
        if self.tool_strict_level not in TOOL_STRICT_LEVELS:
            raise ServingFlagsError(
                f"tool_strict_level must be one of {TOOL_STRICT_LEVELS}: {self.tool_strict_level!r}"
            )
        try:
            kwargs = json.loads(self.default_chat_template_kwargs)
        except ValueError as exc:
            raise ServingFlagsError(f"default_chat_template_kwargs is not JSON: {exc}") from exc
        if not isinstance(kwargs, dict):
            raise ServingFlagsError("default_chat_template_kwargs must be a JSON object")
        if self.enable_auto_tool_choice and not self.tool_call_parser:
            # vLLM refuses to start with one and not the other.
            raise ServingFlagsError("enable_auto_tool_choice needs a tool_call_parser")
        if isinstance(self.max_logprobs, bool) or self.max_logprobs < -1:
            raise ServingFlagsError(f"max_logprobs must be -1 or more: {self.max_logprobs!r}")
        if "" in (self.tool_call_parser, self.reasoning_parser, self.chat_template):
            raise ServingFlagsError("a parser name or chat template must not be empty")

    @classmethod
    def of(
        cls,
        *,
        chat_template: str | None = None,
        chat_template_content_format: str = "auto",
        default_chat_template_kwargs: Mapping[str, Any] | None = None,
        enable_auto_tool_choice: bool = False,
        tool_call_parser: str | None = None,
        reasoning_parser: str | None = None,
        exclude_tools_when_tool_choice_none: bool = False,
        tool_strict_level: str = "auto",
        enforce_strict_tool_calling: bool = True,
        max_logprobs: int = 20,
    ) -> ServingFlags:
        """The flags with the chat template kwargs given as a mapping."""
        return cls(
            chat_template=chat_template,
            chat_template_content_format=chat_template_content_format,
            default_chat_template_kwargs=_canonical(dict(default_chat_template_kwargs or {})),
            enable_auto_tool_choice=enable_auto_tool_choice,
            tool_call_parser=tool_call_parser,
            reasoning_parser=reasoning_parser,
            exclude_tools_when_tool_choice_none=exclude_tools_when_tool_choice_none,
            tool_strict_level=tool_strict_level,
            enforce_strict_tool_calling=enforce_strict_tool_calling,
            max_logprobs=max_logprobs,
        )

    @property
    def most_listed(self) -> int | None:
        """The most entries vLLM's server lists at one position of a logprobs field
        (the best ``max_logprobs`` and the sampled or prompt token); None when it
        lists the whole vocabulary (``max_logprobs`` -1)."""
        return None if self.max_logprobs == -1 else self.max_logprobs + 1

    @property
    def chat_template_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = json.loads(self.default_chat_template_kwargs)
        return kwargs

    @property
    def is_default(self) -> bool:
        return self == VLLM_DEFAULTS

    def to_json(self) -> dict[str, Any]:
        """The commitment entry: only the flags that differ from vLLM's defaults."""
        out: dict[str, Any] = {
            name: value
            for name, value in self.__dict__.items()
            if value != getattr(VLLM_DEFAULTS, name)
        }
        if "default_chat_template_kwargs" in out:
            out["default_chat_template_kwargs"] = self.chat_template_kwargs
        return out

    @classmethod
    def from_json(cls, data: object) -> ServingFlags:
        if not isinstance(data, dict):
            raise ServingFlagsError("serving must be a JSON object")
        unknown = set(data) - set(cls().__dict__)
        if unknown:
            raise ServingFlagsError(f"serving: unknown flags {sorted(unknown)}")
        kinds: dict[str, type | tuple[type, ...]] = {
            "chat_template": str,
            "chat_template_content_format": str,
            "default_chat_template_kwargs": dict,
            "enable_auto_tool_choice": bool,
            "tool_call_parser": str,
            "reasoning_parser": str,
            "exclude_tools_when_tool_choice_none": bool,
            "tool_strict_level": str,
            "enforce_strict_tool_calling": bool,
            "max_logprobs": int,
        }
        for name, value in data.items():
            # A JSON true is a Python int too: only a bool flag takes it.
            bool_as_number = isinstance(value, bool) and kinds[name] is not bool
            if not isinstance(value, kinds[name]) or bool_as_number:
                raise ServingFlagsError(f"serving.{name}: unexpected value {value!r}")
        return cls.of(**data)


#: What a server started without any of these flags applies.
VLLM_DEFAULTS = ServingFlags()


def _canonical(obj: object) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)

"""The token ids of a captured exchange: exact when the response carried them, else rebuilt.

Token-DiFR scores token ids, not text. vLLM's OpenAI server returns them when
asked (``return_token_ids``: ``prompt_token_ids`` and per-choice ``token_ids``,
the final stop token included); the record keeps them. When they are missing,
the committed tokenizer rebuilds them the way vLLM 0.32 builds a prompt:

- chat: the chat template applied to the messages (text content parts joined
  with newlines, vLLM's "string" content format) with the generation prompt,
  then tokenized without special tokens;
- completions: a string prompt tokenized with special tokens (vLLM's default
  ``add_special_tokens=True``, or the request's own value), a token-id prompt
  used as sent (exact, not rebuilt); a request with several prompts maps choice
  i to prompt i // n;
- a response text is tokenized without special tokens; when the choice stopped
  on the end-of-sequence token (``finish_reason`` "stop", no stop reason) or on
  a stop token id, that token (absent from the text) is appended. A choice
  stopped by a stop *string* keeps only the tokens of its truncated text.

Rebuilt ids are marked ``retokenized``: a different but equally valid
tokenization of the same text makes honest responses score badly, so verdicts
carry the mark.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeGuard

from veritap.v1 import record_pb2

from verifierd.errors import VerifierdError

CHAT = "openai-chat"
COMPLETIONS = "openai-completions"
#: Request options that change what the chat template renders; not replayed.
_TEMPLATE_OPTIONS = (
    "tools",
    "documents",
    "chat_template",
    "chat_template_kwargs",
    "continue_final_message",
)


class TokensUnavailable(VerifierdError):  # noqa: N818 (name agreed with the scheduler)
    """The exchange's token ids cannot be known."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class ChoiceTokens:
    index: int
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]


@dataclass(frozen=True)
class TokenReconstruction:
    #: The prompt of the first choice (the only prompt unless a completions
    #: request sent several).
    prompt_ids: tuple[int, ...]
    choices: tuple[ChoiceTokens, ...]
    #: True when any id was rebuilt from text with the tokenizer.
    retokenized: bool

    @property
    def outputs(self) -> tuple[tuple[int, ...], ...]:
        return tuple(c.output_ids for c in self.choices)


def reconstruct_tokens(
    record: record_pb2.InferenceRecord, tokenizer_dir: Path | None
) -> TokenReconstruction:
    """Token ids of ``record``'s prompt(s) and choices; TokensUnavailable when impossible."""
    api = record.api
    if not api.choices:
        raise TokensUnavailable("the response has no choices")
    params = _params(api.sampling.params_json)
    n = api.sampling.n if api.sampling.HasField("n") and api.sampling.n > 0 else 1
    retokenized = False
    prompts: list[tuple[int, ...]] | None = None
    choices: list[ChoiceTokens] = []
    for choice in sorted(api.choices, key=lambda c: c.index):
        if choice.HasField("prompt_token_ids"):
            prompt = tuple(choice.prompt_token_ids.ids)
        elif api.HasField("prompt_token_ids"):
            prompt = tuple(api.prompt_token_ids.ids)
        else:
            if prompts is None:
                prompts, rebuilt = _prompts(api, params, tokenizer_dir)
                retokenized |= rebuilt
            slot = choice.index // n
            if slot >= len(prompts):
                raise TokensUnavailable(f"choice {choice.index} has no prompt among {len(prompts)}")
            prompt = prompts[slot]
        if choice.HasField("token_ids"):
            output = tuple(choice.token_ids.ids)
        else:
            output = _retokenize_output(choice, _tokenizer(tokenizer_dir))
            retokenized = True
        choices.append(ChoiceTokens(choice.index, prompt, output))
    if not choices[0].prompt_ids:
        raise TokensUnavailable("empty prompt")
    return TokenReconstruction(choices[0].prompt_ids, tuple(choices), retokenized)


def _params(params_json: str) -> dict[str, Any]:
    if not params_json:
        return {}
    try:
        data = json.loads(params_json)
    except json.JSONDecodeError as exc:
        raise TokensUnavailable(f"request parameters are not JSON: {exc}") from exc
    return data if isinstance(data, dict) else {}


def _prompts(
    api: record_pb2.ApiView, params: dict[str, Any], tokenizer_dir: Path | None
) -> tuple[list[tuple[int, ...]], bool]:
    """The request's prompts as token ids, and whether the tokenizer rebuilt them."""
    try:
        prompt = json.loads(api.prompt_json) if api.prompt_json else None
    except json.JSONDecodeError as exc:
        raise TokensUnavailable(f"prompt is not JSON: {exc}") from exc
    if api.dialect == CHAT:
        return [_chat_prompt(prompt, params, _tokenizer(tokenizer_dir))], True
    if api.dialect != COMPLETIONS:
        raise TokensUnavailable(f"unknown API dialect {api.dialect!r}")
    if _is_ids(prompt):
        return [tuple(prompt)], False
    if isinstance(prompt, list) and prompt and all(_is_ids(p) for p in prompt):
        return [tuple(p) for p in prompt], False
    texts = [prompt] if isinstance(prompt, str) else prompt
    if not (isinstance(texts, list) and texts and all(isinstance(t, str) for t in texts)):
        raise TokensUnavailable("completions prompt is neither text nor token ids")
    tokenizer = _tokenizer(tokenizer_dir)
    special = params.get("add_special_tokens", True)
    return [
        tuple(tokenizer.encode(t, add_special_tokens=special is not False)) for t in texts
    ], True


def _is_ids(value: object) -> TypeGuard[list[int]]:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    )


def _chat_prompt(messages: object, params: dict[str, Any], tokenizer: Any) -> tuple[int, ...]:
    used = [k for k in _TEMPLATE_OPTIONS if params.get(k)]
    if used:
        raise TokensUnavailable(f"chat request uses {', '.join(used)}: template not replayed")
    if params.get("add_generation_prompt", True) is not True:
        raise TokensUnavailable("chat request turned add_generation_prompt off")
    if not (isinstance(messages, list) and messages):
        raise TokensUnavailable("chat messages are not a non-empty list")
    flat = [_flat_message(m) for m in messages]
    text = tokenizer.apply_chat_template(flat, tokenize=False, add_generation_prompt=True)
    return tuple(tokenizer.encode(text, add_special_tokens=False))


def _flat_message(message: object) -> dict[str, str]:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise TokensUnavailable("a chat message has no role")
    content = message.get("content")
    if content is None:
        content = ""
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text"):
                raise TokensUnavailable("non-text chat content is not replayed")
            parts.append(str(part.get("text", "")))
        content = "\n".join(parts)
    if not isinstance(content, str):
        raise TokensUnavailable("chat content is neither text nor text parts")
    return {"role": message["role"], "content": content}


def _retokenize_output(choice: record_pb2.Choice, tokenizer: Any) -> tuple[int, ...]:
    ids: list[int] = list(tokenizer.encode(choice.text, add_special_tokens=False))
    if choice.finish_reason == "stop":
        stop = _stop_reason(choice.stop_reason_json)
        if stop is None:
            if tokenizer.eos_token_id is None:
                raise TokensUnavailable("stopped on end-of-sequence but the tokenizer has none")
            ids.append(int(tokenizer.eos_token_id))
        elif isinstance(stop, int) and not isinstance(stop, bool):
            ids.append(stop)
    return tuple(ids)


def _stop_reason(stop_reason_json: str) -> object:
    if not stop_reason_json:
        return None
    try:
        value: object = json.loads(stop_reason_json)
    except json.JSONDecodeError as exc:
        raise TokensUnavailable(f"stop reason is not JSON: {exc}") from exc
    return value


def _tokenizer(tokenizer_dir: Path | None) -> Any:
    if tokenizer_dir is None:
        raise TokensUnavailable("the response carries no token ids and no tokenizer is committed")
    return _load_tokenizer(str(tokenizer_dir))


@lru_cache(maxsize=8)
def _load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise TokensUnavailable(f"tokenizer at {path} cannot be loaded: {exc}") from exc

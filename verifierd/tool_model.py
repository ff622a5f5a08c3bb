"""A tiny scripted model that reasons and calls a tool, and a Hermes-style tools template.

Random tiny models almost never emit a well-formed tool call, so tests of tool
calling and reasoning need a model that does. `build_scripted_model` writes a
tiny Llama (the `verifierd.tiny_model` layout and tokenizer) whose output is a
fixed script whatever the prompt:

- each script piece is an added (not special) token of the tokenizer, so the
  text of the script tokenizes back to exactly those tokens;
- every decoder layer's output projections are zero, so the last hidden state
  is the current token's embedding, and lm_head adds, for each token of the
  chain (the generation prompt's last token, then the pieces, then
  ``<|im_end|>``), its embedding direction to the row of the token after it:
  the next token's logit leads by about ``_CHAIN_GAIN * sqrt(hidden_size)``,
  far beyond any sampler noise, so seeded sampling follows the script too;
- the generation prompt's last token and ``</think>`` also point at
  ``<tool_call>``, at half that lead: never chosen while the script's own next
  token is allowed, it is what a grammar that forces a tool call
  (``tool_choice`` required or named) leaves the model to pick there, so the
  forced answer is the script's tool call too.

`TOOLS_CHAT_TEMPLATE` renders ``tools`` (a ``<tools>`` system block),
assistant tool calls as ``<tool_call>`` JSON, tool results as
``<tool_response>``, and drops the reasoning of earlier assistant turns
(everything up to ``</think>``), as Hermes and Qwen templates do. It is served
with ``--chat-template`` (the model's own template ignores tools), which is how
tests check that the commitment's serving flags reach the verifier.

This lives apart from `verifierd.tiny_model` because that module's source is
part of the trained models' cache key.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from verifierd.tiny_model import (
    IM_END,
    TinyModel,
    TinyModelError,
    TinyModelSpec,
    random_weights,
    read_tiny_model,
    write_model_files,
    write_weights,
)

THINK_START = "<think>"
THINK_END = "</think>"
TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"

#: The scripted answer: reasoning, a sentence of content, one Hermes tool call.
TOOL_CALL_SCRIPT = (
    THINK_START,
    "The user asks about the weather.",
    THINK_END,
    "Let me check.",
    TOOL_CALL_START,
    '\n{"name": "get_weather", "arguments": {"city": "',
    "Paris",
    '"}}\n',
    TOOL_CALL_END,
)

#: Hermes-style template (see the module docstring), written with explicit string
#: pieces so that Jinja's whitespace handling cannot change the prompt.
TOOLS_CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{ '<|im_start|>system\\n# Tools\\n<tools>' }}"
    "{%- for tool in tools %}{{ '\\n' + (tool | tojson) }}{%- endfor %}"
    '{{ \'\\n</tools>\\nCall a tool as <tool_call>{"name": ..., "arguments": ...}'
    "</tool_call>.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- set content = message['content'] or '' %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\\n' + content.split('</think>')[-1] }}"
    "{%- for call in message.get('tool_calls') or [] %}"
    "{%- set arguments = call['function']['arguments'] %}"
    "{{ '<tool_call>\\n{\"name\": ' + (call['function']['name'] | tojson) + ', \"arguments\": ' }}"
    "{{ arguments if arguments is string else (arguments | tojson) }}"
    "{{ '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{ '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{{ '<|im_start|>user\\n<tool_response>\\n' + content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)

#: The text every generation prompt ends with (the model's template and the tools one).
GENERATION_PROMPT = "<|im_start|>assistant\n"
#: Logit lead of the scripted next token per unit of sqrt(hidden_size).
_CHAIN_GAIN = 6.0
#: The same for ``<tool_call>`` after the prompt and after the reasoning.
_FORCED_CALL_GAIN = 3.0


def build_scripted_model(
    out_dir: Path, spec: TinyModelSpec, script: tuple[str, ...] = TOOL_CALL_SCRIPT
) -> TinyModel:
    """Write a float32 tiny model for ``spec`` that answers every prompt with ``script``."""
    if spec.dtype != "float32" or spec.perturb is not None:
        raise TinyModelError("a scripted model is float32 and unperturbed")
    if len(set(script)) != len(script) or not all(script):
        raise TinyModelError("script pieces must be distinct and non-empty")
    write_model_files(out_dir, spec)
    size, width = _add_pieces(out_dir, spec, script)
    weights = random_weights(spec, width, size)
    for name, w in weights.items():
        if name.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight")):
            w[:] = 0.0
    weights["lm_head.weight"] += _chain_rows(out_dir, script, weights["model.embed_tokens.weight"])
    write_weights(out_dir, spec, weights)
    return read_tiny_model(out_dir)


def write_chat_template(path: Path) -> Path:
    """Write `TOOLS_CHAT_TEMPLATE` to ``path`` (for ``--chat-template``)."""
    path.write_text(TOOLS_CHAT_TEMPLATE, encoding="utf-8")
    return path


def _add_pieces(out_dir: Path, spec: TinyModelSpec, script: tuple[str, ...]) -> tuple[int, int]:
    """Add the pieces as tokens; rewrite config.json's width and tokenizer_config's
    added tokens to match. Returns (len(tokenizer), logits width)."""
    from tokenizers import AddedToken, Tokenizer

    tokenizer = Tokenizer.from_file(str(out_dir / "tokenizer.json"))
    tokenizer.add_tokens([AddedToken(p, normalized=False, special=False) for p in script])
    tokenizer.save(str(out_dir / "tokenizer.json"), pretty=True)
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    width = (size // spec.pad_multiple + 1) * spec.pad_multiple
    config = _read(out_dir / "config.json")
    config["vocab_size"] = width
    _write(out_dir / "config.json", config)
    tokenizer_config = _read(out_dir / "tokenizer_config.json")
    decoder = tokenizer_config["added_tokens_decoder"]
    for piece in script:
        decoder[str(tokenizer.token_to_id(piece))] = {
            "content": piece,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": False,
        }
    _write(out_dir / "tokenizer_config.json", tokenizer_config)
    return size, width


def _chain_rows(
    out_dir: Path, script: tuple[str, ...], embeddings: npt.NDArray[np.float32]
) -> npt.NDArray[np.float32]:
    """lm_head rows that make each chain token predict the next one."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(out_dir / "tokenizer.json"))
    prompt_end = tokenizer.encode(GENERATION_PROMPT, add_special_tokens=False).ids[-1]
    chain = [prompt_end, *(tokenizer.token_to_id(p) for p in script), tokenizer.token_to_id(IM_END)]
    links = [(current, following, _CHAIN_GAIN) for current, following in itertools.pairwise(chain)]
    if TOOL_CALL_START in script:
        call = tokenizer.token_to_id(TOOL_CALL_START)
        before = [prompt_end, *(tokenizer.token_to_id(p) for p in script if p == THINK_END)]
        links += [(current, call, _FORCED_CALL_GAIN) for current in before]
    rows = np.zeros_like(embeddings)
    for current, following, gain in links:
        direction = embeddings[current] / np.linalg.norm(embeddings[current])
        rows[following] += np.float32(gain) * direction
    return rows


def _read(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def _write(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")

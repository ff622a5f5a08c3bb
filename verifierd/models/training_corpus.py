"""The text a trained tiny model learns from, chosen deterministically from the stdlib.

The corpus is the tokenizer's own (``verifierd.tiny_model.corpus_files``: the
running interpreter's standard-library sources in name order, about 1 MB), so
every machine with the same Python version reads the same bytes. It becomes two
kinds of documents:

- each source file as it is (plain language modelling on Python code and its
  docstrings);
- one ChatML exchange per documented function or method: the user asks with the
  first paragraph of the docstring, the assistant answers with the function's
  source and ``<|im_end|>``, so chat prompts get code answers that end the way a
  chat model's do.

Documents are shuffled with the recipe's seed and joined with
``<|endoftext|>`` into one token stream.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

from verifierd.tiny_model import ENDOFTEXT, IM_END, IM_START, TinyModelError, corpus_files


def chat_exchange(question: str, answer: str) -> str:
    """One user/assistant exchange as CHAT_TEMPLATE renders it, the answer closed."""
    return f"{IM_START}user\n{question}{IM_END}\n{IM_START}assistant\n{answer}{IM_END}\n"


def documented_functions(source: str) -> Iterator[tuple[str, str]]:
    """(first docstring paragraph, dedented source) of every documented function or
    method in ``source``, in ast.walk order; nothing for a file that does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):  # ValueError: a null byte
        return
    lines = source.splitlines(keepends=True)
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        doc = ast.get_docstring(node)
        if not doc or node.end_lineno is None:
            continue
        question = doc.split("\n\n", 1)[0].strip()
        answer = textwrap.dedent("".join(lines[node.lineno - 1 : node.end_lineno]))
        yield question, answer.rstrip("\n")


def training_documents() -> list[str]:
    """Every source file of the corpus, then every chat exchange, in corpus order."""
    sources = [p.read_text(encoding="utf-8", errors="replace") for p in corpus_files()]
    chats = [chat_exchange(q, a) for src in sources for q, a in documented_functions(src)]
    return [*sources, *chats]


def token_stream(documents: list[str], tokenizer_json: str, seed: int) -> npt.NDArray[np.int64]:
    """The documents shuffled by ``seed``, tokenized and joined by ``<|endoftext|>``."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(tokenizer_json)
    separator = tokenizer.token_to_id(ENDOFTEXT)
    if separator is None:
        raise TinyModelError(f"the tokenizer has no {ENDOFTEXT} token")
    order = np.random.default_rng(seed).permutation(len(documents))
    encoded = tokenizer.encode_batch([documents[i] for i in order], add_special_tokens=False)
    ids: list[int] = []
    for enc in encoded:
        ids.extend(enc.ids)
        ids.append(separator)
    return np.asarray(ids, dtype=np.int64)

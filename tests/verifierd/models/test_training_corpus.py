"""The trained model's corpus: stdlib sources and chat exchanges, in a reproducible order."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st
from tokenizers import Tokenizer

from tests.cpu_bound import budget, cpu_bound
from verifierd.models.training_corpus import (
    chat_exchange,
    documented_functions,
    token_stream,
    training_documents,
)
from verifierd.tiny_model import ENDOFTEXT, IM_START, TinyModel, corpus_files, train_tokenizer_json

SOURCE = '''
def documented(a, b):
    """Add a and b.

    More detail that is not the question.
    """
    return a + b


def undocumented():
    return 1


class Box:
    """A class: its docstring asks nothing."""

    async def method(self):
        """Wait for the box."""

        def nested():
            """Inner help."""
'''


def test_chat_exchange_is_what_the_chat_template_renders(tiny_model: TinyModel) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model.path))
    messages = [
        {"role": "user", "content": "Add a and b."},
        {"role": "assistant", "content": "def f(a, b):\n    return a + b"},
    ]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    assert rendered == chat_exchange("Add a and b.", "def f(a, b):\n    return a + b")


def test_documented_functions_ask_with_the_first_paragraph_and_answer_dedented() -> None:
    found = list(documented_functions(SOURCE))
    assert [q for q, _ in found] == ["Add a and b.", "Wait for the box.", "Inner help."]
    assert found[0][1].startswith("def documented(a, b):\n") and found[0][1].endswith("a + b")
    assert found[1][1].startswith('async def method(self):\n    """Wait')
    assert found[2][1] == 'def nested():\n    """Inner help."""'


def test_source_that_does_not_parse_gives_nothing() -> None:
    assert list(documented_functions("def f(:\n")) == []
    assert list(documented_functions("x = 1\0")) == []


@given(st.text(max_size=400))
def test_documented_functions_accepts_any_text(text: str) -> None:
    with cpu_bound(budget(len(text.encode()))):
        for question, answer in documented_functions(text):
            assert isinstance(question, str) and answer


def test_documents_are_the_tokenizer_corpus_then_its_chat_exchanges() -> None:
    files = corpus_files()
    docs = training_documents()
    assert docs[: len(files)] == [p.read_text(encoding="utf-8") for p in files]
    chats = docs[len(files) :]
    assert len(chats) > 500
    assert all(c.startswith(f"{IM_START}user\n") for c in chats)
    assert training_documents() == docs


def test_token_stream_is_a_seeded_shuffle_joined_by_endoftext() -> None:
    tokenizer_json = train_tokenizer_json(400)
    docs = ["def a():\n    pass\n", "x = 1\n", chat_exchange("Say hi.", "print('hi')"), "y = 2\n"]
    a = token_stream(docs, tokenizer_json, seed=0)
    assert list(a) == list(token_stream(docs, tokenizer_json, seed=0))
    others = [list(token_stream(docs, tokenizer_json, seed=s)) for s in range(1, 6)]
    assert any(o != list(a) for o in others)
    assert all(Counter(o) == Counter(a.tolist()) for o in others)
    separator = Tokenizer.from_str(tokenizer_json).token_to_id(ENDOFTEXT)
    assert a[-1] == separator
    assert Counter(a.tolist())[separator] == len(docs)

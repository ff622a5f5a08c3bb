"""Token reconstruction: exact ids from the record, else the committed tokenizer."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from veritap.v1 import record_pb2

from verifierd.tiny_model import TinyModel
from verifierd.tokens import TokensUnavailable, reconstruct_tokens

IDS = st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=40)


def _record(
    dialect: str,
    prompt: object,
    choices: list[dict[str, object]],
    *,
    prompt_ids: list[int] | None = None,
    n: int | None = None,
    params: dict[str, object] | None = None,
) -> record_pb2.InferenceRecord:
    rec = record_pb2.InferenceRecord(record_id="r1")
    api = rec.api
    api.dialect = dialect
    api.prompt_json = json.dumps(prompt)
    if prompt_ids is not None:
        api.prompt_token_ids.ids.extend(prompt_ids)
    if n is not None:
        api.sampling.n = n
    api.sampling.params_json = json.dumps(params or {})
    for i, c in enumerate(choices):
        choice = api.choices.add(index=i, text=str(c.get("text", "")))
        choice.finish_reason = str(c.get("finish_reason", "length"))
        if "token_ids" in c:
            choice.token_ids.ids.extend(c["token_ids"])  # type: ignore[arg-type]
        if "prompt_token_ids" in c:
            choice.prompt_token_ids.ids.extend(c["prompt_token_ids"])  # type: ignore[arg-type]
        if "stop_reason" in c:
            choice.stop_reason_json = json.dumps(c["stop_reason"])
    return rec


@settings(max_examples=50, deadline=None)
@given(IDS, st.lists(st.lists(st.integers(0, 2**32 - 1), max_size=30), min_size=1, max_size=4))
def test_ids_in_the_record_are_used_as_they_are(prompt: list[int], outs: list[list[int]]) -> None:
    rec = _record("openai-chat", [], [{"token_ids": o} for o in outs], prompt_ids=prompt)
    got = reconstruct_tokens(rec, None)
    assert got.prompt_ids == tuple(prompt)
    assert got.outputs == tuple(tuple(o) for o in outs)
    assert not got.retokenized


def test_chat_without_ids_is_rebuilt_with_the_template(tiny_model: TinyModel) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model.path))
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    ]
    rec = _record(
        "openai-chat",
        messages,
        [
            {"text": "import os", "finish_reason": "stop"},
            {"text": "def f", "finish_reason": "stop", "stop_reason": 2},
            {"text": "x = 1", "finish_reason": "stop", "stop_reason": "\n\n"},
            {"text": "for i in", "finish_reason": "length"},
        ],
        n=4,
    )
    got = reconstruct_tokens(rec, tiny_model.path)
    flat = [messages[0], {"role": "user", "content": "a\nb"}]
    text = tok.apply_chat_template(flat, tokenize=False, add_generation_prompt=True)
    assert got.prompt_ids == tuple(tok.encode(text, add_special_tokens=False))
    enc = [tuple(tok.encode(t, add_special_tokens=False)) for t in ("import os", "def f", "x = 1")]
    assert got.outputs[0] == (*enc[0], tiny_model.eos_token_id)  # EOS: stop without a reason
    assert got.outputs[1] == (*enc[1], 2)  # a stop token id is in token_ids, not the text
    assert got.outputs[2] == enc[2]  # a stop string is cut from the text: nothing to add
    assert got.outputs[3] == tuple(tok.encode("for i in", add_special_tokens=False))
    assert got.retokenized


def test_completions_prompts(tiny_model: TinyModel) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model.path))
    by_ids = _record("openai-completions", [5, 6, 7], [{"token_ids": [1]}])
    assert reconstruct_tokens(by_ids, None).prompt_ids == (5, 6, 7)
    assert not reconstruct_tokens(by_ids, None).retokenized
    several = _record(
        "openai-completions",
        ["def a", "class B"],
        [{"token_ids": [i]} for i in range(4)],
        n=2,
    )
    got = reconstruct_tokens(several, tiny_model.path)
    first, second = (tuple(tok.encode(t)) for t in ("def a", "class B"))
    assert [c.prompt_ids for c in got.choices] == [first, first, second, second]
    assert got.retokenized
    per_choice = _record(
        "openai-completions", ["x", "y"], [{"token_ids": [1], "prompt_token_ids": [9, 9]}]
    )
    assert reconstruct_tokens(per_choice, None).prompt_ids == (9, 9)


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (_record("openai-chat", [], [], prompt_ids=[1]), "no choices"),
        (_record("openai-chat", [{"role": "user", "content": "hi"}], [{"text": "x"}]), "tokenizer"),
        (_record("grpc-thing", "x", [{"token_ids": [1]}]), "dialect"),
    ],
)
def test_unavailable_without_a_tokenizer(record: record_pb2.InferenceRecord, reason: str) -> None:
    with pytest.raises(TokensUnavailable, match=reason):
        reconstruct_tokens(record, None)


@pytest.mark.parametrize(
    ("dialect", "prompt", "params", "reason"),
    [
        ("openai-chat", [{"role": "user", "content": "x"}], {"tools": [{"t": 1}]}, "tools"),
        (
            "openai-chat",
            [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
            {},
            "non-text",
        ),
        ("openai-chat", "not a list", {}, "non-empty list"),
        ("openai-completions", {"weird": 1}, {}, "neither text nor token ids"),
        ("grpc-thing", "x", {}, "dialect"),
    ],
)
def test_unavailable_with_a_tokenizer(
    tiny_model: TinyModel, dialect: str, prompt: object, params: dict[str, object], reason: str
) -> None:
    rec = _record(dialect, prompt, [{"token_ids": [1]}], params=params)
    with pytest.raises(TokensUnavailable, match=reason):
        reconstruct_tokens(rec, tiny_model.path)

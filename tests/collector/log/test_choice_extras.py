"""Tool calls and reasoning read from whatever response body the prover wrote."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st
from veritap.v1 import record_pb2

from collector.log.choice_extras import ChoiceExtras, choice_extras

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)
#: Choices shaped nearly right, so the reader goes deep into them.
near_choices = st.lists(
    st.fixed_dictionaries(
        {"index": st.integers(-1, 2) | json_values},
        optional={"message": json_values, "delta": json_values},
    ),
    max_size=3,
)


def chat_record(body: bytes, *, stream: bool) -> record_pb2.InferenceRecord:
    record = record_pb2.InferenceRecord()
    record.api.dialect = "openai-chat"
    record.api.sampling.stream = stream
    record.response.status = 200
    record.response.body = body
    return record


@given(st.binary(max_size=300), st.booleans())
def test_any_body_gives_extras_or_none_without_raising(body: bytes, stream: bool) -> None:
    for extras in choice_extras(chat_record(body, stream=stream)).values():
        assert isinstance(extras, ChoiceExtras)


@given(st.lists(near_choices, max_size=4), st.booleans())
def test_nearly_right_chunks_and_documents_never_raise(chunks: list[object], stream: bool) -> None:
    if stream:
        body = b"".join(b"data: " + json.dumps({"choices": c}).encode() + b"\n\n" for c in chunks)
    else:
        body = json.dumps({"choices": chunks[0] if chunks else []}).encode()
    choice_extras(chat_record(body, stream=stream))


def test_an_error_response_and_a_completion_have_no_extras() -> None:
    body = json.dumps({"choices": [{"index": 0, "message": {"reasoning": "r"}}]}).encode()
    assert choice_extras(chat_record(body, stream=False)) == {0: ChoiceExtras("r", None)}
    refused = chat_record(body, stream=False)
    refused.response.status = 500
    completion = chat_record(body, stream=False)
    completion.api.dialect = "openai-completions"
    assert choice_extras(refused) == {} and choice_extras(completion) == {}


def test_a_stream_ends_for_the_reader_where_it_ends_for_the_sdk() -> None:
    def event(reasoning: str) -> bytes:
        chunk = {"choices": [{"index": 0, "delta": {"reasoning_content": reasoning}}]}
        return b"data: " + json.dumps(chunk).encode() + b"\n\n"

    error = b'data: {"error": {"message": "boom"}}\n\n'
    body = event("seen ") + event("too") + error + event(" never")
    assert choice_extras(chat_record(body, stream=True)) == {0: ChoiceExtras("seen too", None)}

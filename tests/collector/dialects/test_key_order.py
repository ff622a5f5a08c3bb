"""A request whose tools or output schema the server reads in key order keeps its body.

A chat template writes each tool with ``tojson`` in the order the client sent
its keys, and a grammar takes a JSON schema's properties in order; canonical
JSON sorts keys. So such a request body is stored as sent, and ``request_body``
gives back those bytes, not the view's canonical rebuild.
"""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st
from veritap.request_body import request_body
from veritap.v1 import record_pb2

from collector.dialects.json_values import keys_sorted_everywhere, load
from tests.collector.dialects.dialect_records import MESSAGES, records
from tests.cpu_bound import budget, cpu_bound
from tests.openai_traffic import Call, words

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def _record(extra: dict[str, object]) -> tuple[record_pb2.InferenceRecord, Call]:
    call = Call("/v1/chat/completions", "m", MESSAGES, extra, [words(3)])
    (rec,) = records((call.request(), call.response()))
    return rec, call


def test_tools_in_the_sent_key_order_keep_the_body() -> None:
    rec, call = _record({"tools": [TOOL], "seed": 1})
    assert rec.request.body == call.request_json()
    sent = json.loads(call.request_json())["tools"][0]["function"]["parameters"]
    got = json.loads(request_body(rec))["tools"][0]["function"]["parameters"]
    assert list(got) == list(sent) == ["type", "properties"]


def test_sorted_tools_and_no_tools_are_held_by_the_view() -> None:
    sorted_tool = json.loads(json.dumps(TOOL, sort_keys=True))
    for extra in ({"tools": [sorted_tool], "seed": 1}, {"seed": 1}):
        rec, call = _record(extra)
        assert rec.request.body == b""
        assert json.loads(request_body(rec)) == json.loads(call.request_json())


def test_key_order_is_read_at_any_depth() -> None:
    assert keys_sorted_everywhere({"a": [{"b": 1, "c": {"d": 2}}]})
    assert not keys_sorted_everywhere({"a": [{"c": 1, "b": 2}]})
    deep: object = {}
    for _ in range(100_000):
        deep = [deep]
    assert keys_sorted_everywhere(deep)
    assert keys_sorted_everywhere("text") and keys_sorted_everywhere(None)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=4), inner, max_size=6)
    ),
    max_leaves=60,
)


@settings(deadline=None)
@given(_JSON)
def test_any_body_is_judged_within_a_cpu_bound(value: object) -> None:
    data = json.dumps(value).encode()
    loaded = load(data)
    with cpu_bound(budget(len(data))):
        verdict = keys_sorted_everywhere(loaded)
    assert verdict == (json.dumps(loaded, sort_keys=True) == json.dumps(loaded))

"""`load`: what `json.loads` gives, or `JsonError` wherever it raises, on any text."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from collector.dialects.json_values import JsonError, load
from tests.cpu_bound import budget, cpu_bound

_JSONISH = st.lists(
    st.sampled_from(
        ['{"a": ', "1", "}", "[", "]", ", ", '"x"', " ", "\n", "NaN", '"\\ud800"', "{"]
    ),
    max_size=12,
).map("".join)


@settings(max_examples=500, deadline=None)
@given(st.one_of(_JSONISH.map(lambda text: "{" + text), _JSONISH, st.text(max_size=40)))
def test_load_is_json_loads_with_one_error_type(text: str) -> None:
    try:
        expected: object = json.loads(text)
    except (ValueError, RecursionError) as exc:
        expected = JsonError(str(exc))
    with cpu_bound(budget(len(text))):
        try:
            got: object = load(text)
        except JsonError as exc:
            got = exc
    if isinstance(expected, JsonError):
        assert isinstance(got, JsonError) and str(got) == str(expected)
    else:
        assert repr(got) == repr(expected)


def test_deep_nesting_and_long_integers_are_json_errors() -> None:
    for text in ['{"a": ' + "[" * 100_000, '{"a": ' + "1" * 5000 + "}"]:
        try:
            load(text)
        except JsonError:
            continue
        raise AssertionError(text[:20])

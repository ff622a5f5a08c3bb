"""`load` (and `load_short_text`, the SSE chunks' shortcut for short text): what
`json.loads` gives, or `JsonError` wherever it raises, on any text."""

from __future__ import annotations

import json
import math
import struct
import sys
from collections.abc import Callable

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.dialects import json_values
from collector.dialects.json_values import (
    MAX_FAST_NESTING,
    SHORT_TEXT,
    JsonError,
    load,
    load_short_text,
)
from tests.cpu_bound import budget, cpu_bound

_JSONISH = st.lists(
    st.sampled_from(
        ['{"a": ', "1", "}", "[", "]", ", ", '"x"', " ", "\n", "NaN", '"\\ud800"', "{"]
    ),
    max_size=12,
).map("".join)


def _load_beside_json_loads(
    text: str, loader: Callable[[str], object] = load
) -> tuple[object, object]:
    """(`loader`'s value or JsonError, `json.loads`'s value or its error as a JsonError)."""
    try:
        expected: object = json.loads(text)
    except (ValueError, RecursionError) as exc:
        expected = JsonError(str(exc))
    with cpu_bound(budget(len(text))):
        try:
            got: object = loader(text)
        except JsonError as exc:
            got = exc
    return got, expected


@settings(max_examples=500, deadline=None)
@given(st.one_of(_JSONISH.map(lambda text: "{" + text), _JSONISH, st.text(max_size=40)))
def test_load_is_json_loads_with_one_error_type(text: str) -> None:
    got, expected = _load_beside_json_loads(text)
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


def _same(a: object, b: object) -> bool:
    """Equal in type and value all the way down: float bits (NaN equal to NaN), key order."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        assert isinstance(b, float)
        return struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict):
        assert isinstance(b, dict)
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        assert isinstance(b, list)
        return len(a) == len(b) and all(map(_same, a, b))
    return a == b


_NUMBERS = st.one_of(
    st.from_regex(r"-?(0|[1-9][0-9]{0,40})(\.[0-9]{1,40})?([eE][+-]?[0-9]{1,4})?", fullmatch=True),
    st.floats().map(repr),
    st.integers(min_value=-(2**200), max_value=2**200).map(str),
    st.sampled_from(
        [
            "1e308",
            "1.7976931348623157e308",
            "1.7976931348623159e308",
            "4.9e-324",
            "2.4703282292062328e-324",
            "1e-400",
            "-0",
            "-0.0",
            "-0e0",
            "1E+2",
            "9223372036854775808",
            "-9223372036854775809",
            "18446744073709551616",
            "1" * 4300,
            "1" * 4301,
            "1" * 4300 + ".5",
            "1." + "0" * 5000,
            "1" + "0" * 400 + ".0",
            "0." + "0" * 400 + "1e400",
            "1" + "0" * 5000 + "e-5000",
            "2.4703282292062327e-324",
            "1e99999999999",
            "1e-99999999999",
            "0" * 2 + "1",
        ]
    ),
)
_STRINGS = st.text(st.characters(codec=None), max_size=8).map(
    lambda text: json.dumps(text, ensure_ascii=False)
) | st.lists(
    st.sampled_from(
        [
            "a",
            "\\ud800",
            "\\udc00",
            "\\ud83d\\ude00",
            "\\u0000",
            "\\n",
            "\\x",
            "\\/",
            "\x00",
            "\x1f",
            "\x7f",
            "\u2028",
            "\ud800",
            "é",
            "\\",
            "\t",
        ]
    ),
    max_size=5,
).map(lambda parts: '"' + "".join(parts) + '"')
_VALUES = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(st.characters(codec=None)),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(st.characters(codec=None), max_size=3), inner, max_size=4)
    ),
    max_leaves=12,
)
_TOKENS = st.lists(
    st.one_of(
        _NUMBERS,
        _STRINGS,
        st.sampled_from(
            [
                "{",
                "}",
                "[",
                "]",
                ",",
                ":",
                " ",
                "\n",
                "\r",
                "\t",
                "\x0c",
                "\ufeff",
                "\xa0",
                "true",
                "false",
                "null",
                "NaN",
                "Infinity",
                "-Infinity",
                "tru",
                "+",
                ".",
                "e",
                '"k":',
                '{"a":1,"a":2}',
                '{"a":1,"b":0,"a":[2]}',
            ]
        ),
    ),
    max_size=10,
).map("".join)
_JSON_TEXTS = st.one_of(
    _VALUES.map(lambda v: json.dumps(v, ensure_ascii=False)),
    _VALUES.map(json.dumps),
    _NUMBERS,
    _STRINGS,
    _TOKENS,
    st.text(max_size=40),
)


@settings(max_examples=3000, deadline=None)
@given(_JSON_TEXTS)
def test_msgspec_decodes_text_only_where_json_loads_gives_the_same_value(text: str) -> None:
    """The reason `load` may take msgspec's value: it never differs from json's."""
    with cpu_bound(budget(len(text))):
        try:
            fast = msgspec.json.decode(text)
        except (ValueError, RecursionError):
            return
    assert _same(fast, json.loads(text)), text


@settings(max_examples=1000, deadline=None)
@given(_JSON_TEXTS)
def test_load_gives_json_loads_value_exactly(text: str) -> None:
    loaders = [load, load_short_text] if len(text) <= SHORT_TEXT else [load]
    for loader in loaders:
        got, expected = _load_beside_json_loads(text, loader)
        if isinstance(expected, JsonError):
            assert isinstance(got, JsonError) and str(got) == str(expected)
        else:
            assert _same(got, expected), (loader.__name__, text)


def test_text_that_might_nest_deep_is_left_to_json_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """msgspec allows one level more than json's scanner from the same frame: no value
    of text nesting deeper than `MAX_FAST_NESTING` is msgspec's (a whole value that
    deep is longer than twice that; a shorter one is cut, and refused)."""
    seen: list[str] = []

    def spy(text: str) -> object:
        value = msgspec.json.decode(text)
        seen.append(text)
        return value

    monkeypatch.setattr(json_values, "_decode_text", spy)
    for open_, close in [("[", "]"), ('{"a":', "}"), ("[", "")]:
        for depth in [MAX_FAST_NESTING + 1, 600, 5000, 100_000]:
            text = open_ * depth + "0" + close * depth
            try:
                expected: object = json.loads(text)
            except (ValueError, RecursionError) as exc:
                expected = JsonError(str(exc))
            try:
                got: object = load(text)
            except JsonError as exc:
                got = exc
            assert repr(got) == repr(expected), (open_, depth)
    assert not seen
    load("[" * MAX_FAST_NESTING + "]" * MAX_FAST_NESTING)
    assert seen


def test_shallow_text_decodes_even_from_a_deep_stack() -> None:
    """`MAX_FAST_NESTING` is far below the limit: from a caller hundreds of frames deep,
    the deepest text msgspec is given still decodes, so depth never separates the two."""
    text = "[" * MAX_FAST_NESTING + "{}" + "]" * MAX_FAST_NESTING

    def from_depth(frames: int) -> object:
        return load(text) if frames == 0 else from_depth(frames - 1)

    assert _same(from_depth(sys.getrecursionlimit() - 2 * MAX_FAST_NESTING), json.loads(text))

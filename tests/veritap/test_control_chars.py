"""Escaping captured text: nothing a terminal acts on survives, and nothing is lost."""

from __future__ import annotations

import json
import unicodedata

from hypothesis import given
from hypothesis import strategies as st
from veritap.control_chars import escape_controls, json_text

#: The bidirectional formatting characters, which reorder the text around them.
BIDI = {chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C)}

#: Any text, with the characters that matter drawn often.
hostile_text = st.text(
    st.one_of(
        st.characters(codec=None),
        st.sampled_from(["\x1b", "\x9b", "\x7f", "\r", "\\", "\n", "\t", "x", "[", *BIDI]),
    )
)


def acts_on_a_terminal(char: str) -> bool:
    if char in "\n\t":
        return False
    return unicodedata.category(char) in ("Cc", "Cs") or char in BIDI


def decode(escaped: str) -> str:
    """Python's own reading of backslash escapes (an independent decoder)."""
    return escaped.encode("latin-1", "backslashreplace").decode("unicode_escape")


@given(hostile_text)
def test_escaped_text_holds_no_character_a_terminal_acts_on(text: str) -> None:
    assert not any(acts_on_a_terminal(c) for c in escape_controls(text))


@given(hostile_text)
def test_escaping_is_unambiguous_it_decodes_back_to_the_original(text: str) -> None:
    assert decode(escape_controls(text)) == text


def test_escapes_read_as_what_they_stand_for() -> None:
    assert escape_controls("\x1b[31mred\x1b[0m") == "\\x1b[31mred\\x1b[0m"
    assert escape_controls("admin\u202etxt.exe") == "admin\\u202etxt.exe"
    assert escape_controls("C:\\x1b") == "C:\\\\x1b"
    assert escape_controls("two\nlines\tand a tab, é, 漢字") == "two\nlines\tand a tab, é, 漢字"


@given(st.recursive(hostile_text, lambda inner: st.dictionaries(hostile_text, inner)))
def test_json_text_is_valid_json_of_the_same_value_without_raw_controls(value: object) -> None:
    text = json_text(value)
    assert json.loads(text) == value
    assert not any(acts_on_a_terminal(c) or c == "\n" for c in text)


def test_json_text_keeps_readable_text_and_sorts_keys_on_request() -> None:
    assert json_text({"b": "漢字\u202e", "a": 1}, sort_keys=True) == '{"a":1,"b":"漢字\\u202e"}'

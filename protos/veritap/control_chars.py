"""Captured text made safe to show: the characters a terminal would act on, escaped.

The prover writes every string the tap captures (model names, prompts, responses, error
messages). Shown raw, some characters act instead of being read: ESC and the other C0
controls start terminal sequences, C1 controls (U+0080-U+009F) are the same in 8-bit
form, DEL erases, and the bidirectional overrides and marks (U+202A-U+202E,
U+2066-U+2069, U+200E, U+200F, U+061C) reorder what follows so a line reads otherwise
than it is. Lone surrogates cannot be written as UTF-8 at all.

:func:`escape_controls` is for people: each such character becomes a visible escape
(``\\x1b``, ``\\u202e``) and a backslash becomes ``\\\\``, so the escaped text is
unambiguous (it decodes back to exactly the original) and holds nothing a terminal acts
on but newline and tab. :func:`json_text` is for programs: JSON whose strings carry the
same characters as ``\\uXXXX`` escapes, so the data is unchanged and valid JSON.
"""

from __future__ import annotations

import json
import re

#: Every character a terminal could act on or that reorders text, newline and tab aside.
_UNSAFE_CLASS = (
    "\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff"
)
_SHOWN_ESCAPED = re.compile(f"[{_UNSAFE_CLASS}\\\\]")
#: JSON escapes the C0 controls (newline and tab included) by itself.
_JSON_ESCAPED = re.compile(f"[{_UNSAFE_CLASS}]")


def _visible_escape(match: re.Match[str]) -> str:
    char = match.group()
    if char == "\\":
        return "\\\\"
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def escape_controls(text: str) -> str:
    """``text`` with its control, bidi and surrogate characters (and backslashes) written
    as backslash escapes; newline and tab are kept."""
    return _SHOWN_ESCAPED.sub(_visible_escape, text)


def _json_escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def json_text(value: object, *, sort_keys: bool = False) -> str:
    """Compact JSON of ``value``, readable non-ASCII text kept, every character
    :func:`escape_controls` would escape written as a JSON ``\\uXXXX`` escape.

    JSON's structure is ASCII, so those characters can only stand inside strings, where
    the escape means the same character: the parsed value is exactly ``value``.
    """
    raw = json.dumps(value, ensure_ascii=False, sort_keys=sort_keys, separators=(",", ":"))
    return _JSON_ESCAPED.sub(_json_escape, raw)

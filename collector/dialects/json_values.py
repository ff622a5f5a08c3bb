"""JSON as the dialects read it: every failure one exception, every string fit for protobuf.

The prover writes the response bodies and any client may write a request, so
whatever the bytes hold must end as a value or a `JsonError`, never another
exception: Python's json raises RecursionError on deep nesting and ValueError
on integers longer than `sys.get_int_max_str_digits()`; both become
`JsonError`. Protobuf refuses strings holding lone surrogates (a `"\\ud800"`
escape, or the raw bytes json's `surrogatepass` decoding lets through):
`canonical_json` writes them back as `\\uXXXX` escapes, which is still JSON
and loses nothing, and `proto_text` replaces them with U+FFFD for plain text
fields (the caller reports that the text was changed).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

_SURROGATE = re.compile("[\ud800-\udfff]")
REPLACEMENT = "\ufffd"
# How every escape `canonical_json` writes begins (a literal backslash-u-d may too).
ESCAPED_SURROGATE = "\\ud"


# What `json.loads` runs after its checks (typeshed does not declare the attribute).
_scan_once: Callable[[str, int], tuple[object, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


class JsonError(ValueError):
    """The bytes are not JSON that Python can hold (syntax, depth, integer size)."""


def load(data: bytes | str) -> object:
    """`json.loads`, with every way it can fail raised as `JsonError`.

    A text that starts with `{` is scanned directly (what `json.loads` does after its
    checks, without them: one SSE chunk each); unless the object ends the text, the
    text goes through `json.loads` for its whitespace, errors and messages.
    """
    try:
        if type(data) is str and data[:1] == "{":
            try:
                value, end = _scan_once(data, 0)
            except StopIteration:  # a value missing at the end: json.loads words the error
                end = -1
            if end == len(data):
                return value
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise JsonError(str(exc)) from None


def has_lone_surrogate(text: str) -> bool:
    """Whether `text` cannot be encoded as UTF-8 (the only strings protobuf refuses)."""
    if text.isascii():
        return False
    try:
        text.encode()
    except UnicodeEncodeError:
        return True
    return False


def keys_sorted_everywhere(value: object) -> bool:
    """Whether every object inside `value` lists its keys in sorted order, so that
    `canonical_json` keeps the order they were sent in (iterative: any depth)."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            keys = list(item)
            if keys != sorted(keys):
                return False
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return True


def canonical_json(value: object) -> str:
    """Sorted keys, no spaces, UTF-8 text; lone surrogates as `\\uXXXX` escapes.

    A surrogate can only stand inside a JSON string, where its escape means the
    same code point, so the text loads back to exactly `value`. The escapes are
    written in lower case, so a text without `ESCAPED_SURROGATE` escaped none.
    """
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (ValueError, RecursionError) as exc:
        raise JsonError(str(exc)) from None
    if has_lone_surrogate(text):
        return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    return text


def proto_text(text: str) -> str:
    """`text` with each lone surrogate replaced by U+FFFD (see `has_lone_surrogate`)."""
    return _SURROGATE.sub(REPLACEMENT, text) if has_lone_surrogate(text) else text

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

`load` decodes text with msgspec first (3x faster than json's scanner on an SSE
chunk) and takes its value only where it is json's: on text, msgspec succeeds only
where `json.loads` gives the same value (tests/collector/dialects/test_json_values.py
checks it differentially on arbitrary JSON-ish text): what msgspec refuses (NaN and
Infinity, numbers beyond float range, lone surrogate escapes or characters, integers
past `sys.get_int_max_str_digits()`) goes to `json.loads`, which decides it, and
duplicate keys keep the last value at the first key's place in both. The one limit
that depends on where it is called, the recursion limit (msgspec allows one level
more than json's scanner from the same frame), is kept out of reach: a text that
might nest deeper than `MAX_FAST_NESTING` goes to `json.loads` as well.
"""

from __future__ import annotations

import json
import re

import msgspec

_SURROGATE = re.compile("[\ud800-\udfff]")
REPLACEMENT = "\ufffd"
# How every escape `canonical_json` writes begins (a literal backslash-u-d may too).
ESCAPED_SURROGATE = "\\ud"


_decode_text = msgspec.json.Decoder().decode
#: Far below any recursion limit a caller meets: no text this shallow fails on depth.
MAX_FAST_NESTING = 256
#: A text this short cannot nest deeper than `MAX_FAST_NESTING` (each level takes a bracket).
SHORT_TEXT = 2 * MAX_FAST_NESTING


class JsonError(ValueError):
    """The bytes are not JSON that Python can hold (syntax, depth, integer size)."""


def load_short_text(text: str) -> object:
    """`load` of a text no longer than `SHORT_TEXT` (an SSE chunk, on the hot path):
    msgspec's value where it gives one, else `json.loads`' (one call less than `load`)."""
    try:
        return _decode_text(text)
    except (ValueError, RecursionError):
        pass
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise JsonError(str(exc)) from None


def load(data: bytes | str) -> object:
    """`json.loads`, with every way it can fail raised as `JsonError`.

    Text that cannot nest deeper than `MAX_FAST_NESTING` (a container opens with a
    bracket) goes through msgspec first (see the module's docstring); whatever it
    refuses, deeper text and all bytes (json.loads detects their encoding) through
    `json.loads`, for its values, errors and messages.
    """
    if type(data) is str and (
        len(data) <= SHORT_TEXT or data.count("[") + data.count("{") <= MAX_FAST_NESTING
    ):
        try:
            return _decode_text(data)
        except (ValueError, RecursionError):
            pass
    try:
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

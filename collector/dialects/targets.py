"""The path a request target routes to, the way vLLM's server (uvicorn + Starlette) finds it.

uvicorn parses the target with httptools: an absolute-form target
(`POST http://host/v1/chat/completions`) keeps only its path, the query and the
fragment are split off, and a path holding `%` is percent-decoded once
(`urllib.parse.unquote`, so `/v1/%63hat/completions` and `/v1%2Fchat/completions`
are `/v1/chat/completions`); Starlette matches routes against that decoded
path. Dialect paths are matched against the same, so no spelling the server
serves escapes them. A trailing `/` is also dropped: a prover may serve that
spelling too, and recording one exchange too many is better than one too few.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

# Scheme and authority of an absolute-form target (RFC 9112 section 3.2.2).
_ABSOLUTE_FORM = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^/?#]*")


def route_path(target: str) -> str:
    """The decoded path uvicorn hands Starlette for `target` ("" when it has none)."""
    absolute = _ABSOLUTE_FORM.match(target)
    if absolute is not None:
        target = target[absolute.end() :]
    end = len(target)
    for mark in "?#":
        found = target.find(mark, 0, end)
        if found >= 0:
            end = found
    path = target[:end]
    return unquote(path) if "%" in path else path


def route_key(path: str) -> str:
    """`path` without its trailing `/` (the module docstring says why): the lookup key."""
    return path.rstrip("/") or "/"

"""Errors inside the HTTP layer; readers turn them into message problems, never raise them out."""

from __future__ import annotations


class HttpError(Exception):
    """Bytes that cannot be HTTP/1.1 as the reader expected it."""


class ChunkFramingError(HttpError):
    """A chunk-size line that is not hexadecimal, or one that is far too long."""


class ContentDecodingError(HttpError):
    """A body that does not decode with its Content-Encoding, or decodes past the size cap."""

"""Reading a Subscribe response's entry batch straight from its bytes.

Parsing a 64-entry batch into protobuf messages copies every envelope into the message
and again when each `envelope` field is read; `read_batch` walks the same bytes once
and slices each envelope out. It only takes the shape protobuf writes (fields in number
order, each once, SubscribeResponse.batch = 1, EntryBatch.entries = 1, StreamedEntry
seq = 1 then envelope = 2 or filtered_hash = 3) and returns None for anything else, which
the caller then parses with protobuf, so what is accepted and refused does not change.
"""

from __future__ import annotations

# (seq, whether the entry is a filtered hash, envelope or hash bytes)
EntryPart = tuple[int, bool, bytes]

_MAX_U64 = (1 << 64) - 1


class _UnexpectedShapeError(Exception):
    """The bytes are not in the one shape read here."""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    byte = data[pos]
    if byte < 0x80:
        return byte, pos + 1
    value = byte & 0x7F
    shift = 7
    pos += 1
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            if value > _MAX_U64:
                raise _UnexpectedShapeError
            return value, pos
        shift += 7
        if shift > 63:
            raise _UnexpectedShapeError


def read_batch(data: bytes) -> list[EntryPart] | None:
    """The entries of a serialized SubscribeResponse carrying a batch, or None when the
    bytes are anything else (a checkpoint, a heartbeat, another encoding)."""
    try:
        if not data.startswith(b"\x0a"):
            return None
        length, pos = _varint(data, 1)
        end = len(data)
        if pos + length != end:
            return None
        parts: list[EntryPart] = []
        append = parts.append
        while pos < end:
            if data[pos] != 0x0A:
                return None
            size, pos = _varint(data, pos + 1)
            stop = pos + size
            if data[pos] != 0x08:
                return None
            seq, pos = _varint(data, pos + 1)
            tag = data[pos]
            if tag not in (0x12, 0x1A):
                return None
            size, pos = _varint(data, pos + 1)
            if pos + size != stop or stop > end:
                return None
            append((seq, tag == 0x1A, data[pos:stop]))
            pos = stop
        return parts
    except (_UnexpectedShapeError, IndexError):
        return None

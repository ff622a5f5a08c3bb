"""A Subscribe batch written straight to bytes, the envelopes copied once.

Building an `EntryBatch` through protobuf copies every 4 KB envelope into the message and
again when it is serialized; `encode_batch_response` joins the same bytes by hand (fields
in number order, as protobuf writes them: SubscribeResponse.batch = 1, EntryBatch.entries
= 1, StreamedEntry seq = 1, envelope = 2, filtered_hash = 3). The tests hold it to
protobuf's own serialization. The Subscribe handler sends these bytes as they are.
"""

from __future__ import annotations

from collections.abc import Sequence

from veritap.envelope import varint
from veritap.v1 import ledger_pb2


def encode_batch_response(first_seq: int, bodies: Sequence[tuple[bool, bytes]]) -> bytes:
    """A serialized SubscribeResponse carrying a batch of entries first_seq, first_seq+1, ...

    Each body is (filtered, data): an envelope, or for a filtered entry its entry hash.
    """
    parts: list[bytes] = []
    append = parts.append
    for offset, (filtered, data) in enumerate(bodies):
        fields = b"\x08" + varint(first_seq + offset) + (b"\x1a" if filtered else b"\x12")
        fields += varint(len(data))
        append(b"\x0a")
        append(varint(len(fields) + len(data)))
        append(fields)
        append(data)
    batch = b"".join(parts)
    return b"\x0a" + varint(len(batch)) + batch


def serialize_response(response: ledger_pb2.SubscribeResponse | bytes) -> bytes:
    """The Subscribe stream's serializer: messages are serialized, bytes already are."""
    if isinstance(response, bytes):
        return response
    return response.SerializeToString()

"""The log entry envelope: building its bytes, hashing them and decoding them.

An envelope is a serialized `veritap.v1.Entry`: seq, prev_hash, captured_at_ns,
origin, key_id and the InferenceRecord bytes stored verbatim. Its *entry hash*
is SHA-256(0x00 || envelope bytes), which is at once the RFC 6962 leaf hash of
the log's Merkle tree and the link the next entry carries in prev_hash.

`encode_envelope` writes the bytes by hand (fields in number order, proto3
defaults omitted), which is byte for byte what protobuf's own serializer
produces for this message (the tests hold it to that) at a fraction of the
cost. Consumers must hash the bytes they received, never a re-serialization.
"""

from __future__ import annotations

import hashlib
import re

from google.protobuf.message import DecodeError

from veritap.v1 import log_pb2, record_pb2

HASH_SIZE = 32
ZERO_HASH = bytes(HASH_SIZE)
KEY_ID_SIZE = 4
_MAX_U64 = (1 << 64) - 1


class EnvelopeError(Exception):
    """Envelope or record bytes that do not decode, or fields out of range."""


def varint(n: int) -> bytes:
    """Protobuf base-128 varint of a non-negative int (fast paths for small values)."""
    if n < 0x80:
        return bytes((n,))
    if n < 0x4000:
        return bytes((n & 0x7F | 0x80, n >> 7))
    if n < 0x200000:
        return bytes((n & 0x7F | 0x80, n >> 7 & 0x7F | 0x80, n >> 14))
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _length_delimited(tag: int, data: bytes) -> bytes:
    return bytes([tag]) + varint(len(data)) + data if data else b""


def record_header(record: bytes) -> bytes:
    """Tag and length of the record field (field 6), to go right before the record bytes."""
    return b"\x32" + varint(len(record)) if record else b""


class EnvelopeEncoder:
    """Builds the envelopes of one log; origin and key id are encoded once.

    `encode` checks its arguments and suits one-off use. A writer appending
    many entries calls `tail(captured_at_ns)` once per batch and
    `encode_parts` per entry, with `record_header(record)` computed ahead
    (e.g. in the thread that serialized the record). Field tags are those of
    log.proto: 1 seq, 2 prev_hash, 3 captured_at_ns, 4 origin, 5 key_id, 6 record.
    """

    __slots__ = ("_fixed", "key_id", "origin")

    def __init__(self, origin: str, key_id: bytes) -> None:
        if key_id and len(key_id) != KEY_ID_SIZE:
            raise EnvelopeError(f"key id must be {KEY_ID_SIZE} bytes or empty")
        self.origin = origin
        self.key_id = key_id
        self._fixed = _length_delimited(0x22, origin.encode()) + _length_delimited(0x2A, key_id)

    def tail(self, captured_at_ns: int) -> bytes:
        """Fields 3 to 5: the same for every entry of a batch."""
        if not 0 <= captured_at_ns <= _MAX_U64:
            raise EnvelopeError("captured_at_ns must be in [0, 2^64)")
        stamp = b"\x18" + varint(captured_at_ns) if captured_at_ns else b""
        return stamp + self._fixed

    @staticmethod
    def encode_parts(
        seq: int, prev_hash: bytes, tail: bytes, record_header: bytes, record: bytes
    ) -> bytes:
        """Envelope bytes from checked parts (seq >= 1, 32-byte prev_hash)."""
        return b"".join((b"\x08", varint(seq), b"\x12\x20", prev_hash, tail, record_header, record))

    @staticmethod
    def encode_leaf_input(
        seq: int, prev_hash: bytes, tail: bytes, record_header: bytes, record: bytes
    ) -> bytes:
        """0x00 || envelope: what the entry hash is taken over, built in one copy.

        The envelope itself is ``memoryview(result)[1:]``.
        """
        return b"".join(
            (b"\x00\x08", varint(seq), b"\x12\x20", prev_hash, tail, record_header, record)
        )

    def encode(self, seq: int, prev_hash: bytes, captured_at_ns: int, record: bytes) -> bytes:
        if not 0 < seq <= _MAX_U64:
            raise EnvelopeError("seq must be in [1, 2^64)")
        if len(prev_hash) != HASH_SIZE:
            raise EnvelopeError("prev_hash must be 32 bytes")
        tail = self.tail(captured_at_ns)
        return self.encode_parts(seq, prev_hash, tail, record_header(record), record)


def encode_envelope(
    *,
    seq: int,
    prev_hash: bytes,
    captured_at_ns: int,
    origin: str,
    key_id: bytes,
    record: bytes,
) -> bytes:
    """One envelope's bytes (see EnvelopeEncoder for building many)."""
    return EnvelopeEncoder(origin, key_id).encode(seq, prev_hash, captured_at_ns, record)


#: A fresh SHA-256 with the leaf prefix 0x00 already absorbed: update it with an envelope
#: to hash the entry without a 0x00 + envelope copy of a 4 KB envelope. Each call copies a
#: private state, so no caller can change the prefix every later entry hash starts from.
leaf_hasher = hashlib.sha256(b"\x00").copy


def entry_hash(envelope: bytes) -> bytes:
    """SHA-256(0x00 || envelope): the entry's chain link and Merkle leaf hash."""
    h = leaf_hasher()
    h.update(envelope)
    return h.digest()


# Field 3 (captured_at_ns) as protobuf writes it, when present: a minimal, non-zero varint
# below 2^64.
_STAMP_FIELD = rb"(?:\x18(?:[\x80-\xff]{0,8}[\x01-\x7f]|[\x80-\xff]{9}\x01))?"
# The tag and length varint of field 6 (record), when present; the length is checked by
# re-encoding it.
_RECORD_HEAD = rb"(?:\x32([\x80-\xff]{0,4}[\x00-\x7f]))?"


class EnvelopeMatcher:
    """Recognizes, without decoding, the exact bytes a log of (origin, key id) writes.

    `matches(data, seq, prev_hash)` is true only when `data` is the canonical
    serialization of an Entry with that seq, prev_hash, origin and key id, any
    captured_at_ns and any record: what `decode_envelope` plus field comparisons
    would accept, minus envelopes carrying unknown fields. False says nothing
    more; callers decode to learn why.
    """

    __slots__ = ("_after_link",)

    def __init__(self, origin: str, key_id: bytes) -> None:
        fixed = _length_delimited(0x22, origin.encode()) + _length_delimited(0x2A, key_id)
        # A key id no collector can write matches nothing (decoding then explains).
        never = len(key_id) not in (0, KEY_ID_SIZE)
        self._after_link = re.compile(
            rb"(?!)" if never else _STAMP_FIELD + re.escape(fixed) + _RECORD_HEAD
        )

    def matches(self, data: bytes, seq: int, prev_hash: bytes) -> bool:
        if not 0 < seq <= _MAX_U64 or len(prev_hash) != HASH_SIZE:
            return False
        head = b"\x08" + varint(seq) + b"\x12\x20" + prev_hash
        if not data.startswith(head):
            return False
        rest = self._after_link.match(data, len(head))
        if rest is None:
            return False
        length = rest.group(1)
        if length is None:
            return rest.end() == len(data)
        record_size = len(data) - rest.end()
        return record_size > 0 and length == varint(record_size)


def decode_envelope(data: bytes) -> log_pb2.Entry:
    """Parse envelope bytes, rejecting anything a collector cannot have written."""
    entry = log_pb2.Entry()
    try:
        entry.ParseFromString(data)
    except DecodeError as exc:
        raise EnvelopeError(f"envelope does not parse as veritap.v1.Entry: {exc}") from exc
    if entry.seq == 0:
        raise EnvelopeError("envelope has no seq")
    if len(entry.prev_hash) != HASH_SIZE:
        raise EnvelopeError(f"envelope prev_hash is {len(entry.prev_hash)} bytes, not 32")
    if entry.key_id and len(entry.key_id) != KEY_ID_SIZE:
        raise EnvelopeError(f"envelope key_id is {len(entry.key_id)} bytes, not 4")
    if entry.SerializeToString() != data:
        raise EnvelopeError("envelope bytes are not in canonical form (reordered or extra fields)")
    return entry


def decode_record(entry: log_pb2.Entry) -> record_pb2.InferenceRecord:
    """The InferenceRecord an envelope carries."""
    record = record_pb2.InferenceRecord()
    try:
        record.ParseFromString(entry.record)
    except DecodeError as exc:
        raise EnvelopeError(
            f"record in envelope {entry.seq} does not parse as InferenceRecord: {exc}"
        ) from exc
    return record

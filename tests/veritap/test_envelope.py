"""veritap.envelope: hand-built bytes equal protobuf's, round trips, strict decoding."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st
from veritap.envelope import (
    EnvelopeEncoder,
    EnvelopeError,
    decode_envelope,
    decode_record,
    encode_envelope,
    entry_hash,
    record_header,
    varint,
)
from veritap.v1 import log_pb2, record_pb2

u64s = st.integers(0, 2**64 - 1)


@given(
    seq=st.integers(1, 2**64 - 1),
    prev_hash=st.binary(min_size=32, max_size=32),
    captured_at_ns=u64s,
    origin=st.text(max_size=40),
    key_id=st.sampled_from([b"", b"\x00\x01\x02\x03", b"\xff\xfe\xfd\xfc"]),
    record=st.binary(max_size=300),
)
def test_envelope_bytes_are_protobufs_and_round_trip(
    *, seq: int, prev_hash: bytes, captured_at_ns: int, origin: str, key_id: bytes, record: bytes
) -> None:
    data = encode_envelope(
        seq=seq,
        prev_hash=prev_hash,
        captured_at_ns=captured_at_ns,
        origin=origin,
        key_id=key_id,
        record=record,
    )
    reference = log_pb2.Entry(
        seq=seq,
        prev_hash=prev_hash,
        captured_at_ns=captured_at_ns,
        origin=origin,
        key_id=key_id,
        record=record,
    )
    assert data == reference.SerializeToString()
    assert decode_envelope(data) == reference
    assert entry_hash(data) == hashlib.sha256(b"\x00" + data).digest()


@given(u64s)
def test_varint_matches_protobuf(n: int) -> None:
    # Field 3 (captured_at_ns) of an otherwise empty Entry is tag 0x18 and the varint.
    assert log_pb2.Entry(captured_at_ns=n).SerializeToString() == (
        b"\x18" + varint(n) if n else b""
    )


def test_batch_encoding_equals_one_off_encoding() -> None:
    encoder = EnvelopeEncoder("collector.test/edge", b"abcd")
    record = record_pb2.InferenceRecord(record_id="01J", origin="collector.test/edge")
    payload = record.SerializeToString()
    tail = encoder.tail(123)
    assert encoder.encode_parts(7, bytes(32), tail, record_header(payload), payload) == (
        encoder.encode(7, bytes(32), 123, payload)
    )
    entry = decode_envelope(encoder.encode(7, bytes(32), 123, payload))
    assert decode_record(entry) == record


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        (log_pb2.Entry(prev_hash=bytes(32)), "no seq"),
        (log_pb2.Entry(seq=1, prev_hash=bytes(31)), "prev_hash"),
        (log_pb2.Entry(seq=1, prev_hash=bytes(32), key_id=b"abc"), "key_id"),
    ],
)
def test_invalid_envelopes_name_the_field(entry: log_pb2.Entry, reason: str) -> None:
    with pytest.raises(EnvelopeError, match=reason):
        decode_envelope(entry.SerializeToString())


def test_non_canonical_bytes_are_refused() -> None:
    good = encode_envelope(
        seq=1, prev_hash=bytes(32), captured_at_ns=5, origin="o", key_id=b"", record=b"r"
    )
    # The same fields twice (the last would win): not what a collector writes.
    with pytest.raises(EnvelopeError, match="canonical"):
        decode_envelope(good + b"\x08\x02")


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(EnvelopeError):
        EnvelopeEncoder("o", b"abc")
    encoder = EnvelopeEncoder("o", b"")
    with pytest.raises(EnvelopeError):
        encoder.encode(0, bytes(32), 0, b"")
    with pytest.raises(EnvelopeError):
        encoder.encode(1, bytes(31), 0, b"")
    with pytest.raises(EnvelopeError):
        encoder.encode(1, bytes(32), -1, b"")


def test_record_that_does_not_parse() -> None:
    entry = log_pb2.Entry(seq=3, prev_hash=bytes(32), record=b"\xff\xff\xff")
    with pytest.raises(EnvelopeError, match="envelope 3"):
        decode_record(entry)


@given(st.binary(max_size=200))
def test_arbitrary_bytes_decode_or_fail_cleanly(data: bytes) -> None:
    try:
        entry = decode_envelope(data)
    except EnvelopeError:
        return
    assert entry.SerializeToString() == data

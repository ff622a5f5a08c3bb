"""EnvelopeMatcher must accept exactly what decoding plus field comparison accepts."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from veritap.envelope import (
    EnvelopeError,
    EnvelopeMatcher,
    decode_envelope,
    encode_envelope,
)

ORIGIN = "tap.example/a"
KEY_ID = b"\x01\x02\x03\x04"
PREV = bytes(range(32))


def _decoded_ok(data: bytes, seq: int, prev_hash: bytes) -> bool:
    try:
        entry = decode_envelope(data)
    except EnvelopeError:
        return False
    return (entry.seq, entry.prev_hash, entry.origin, entry.key_id) == (
        seq,
        prev_hash,
        ORIGIN,
        KEY_ID,
    )


@given(
    seq=st.integers(1, (1 << 64) - 1),
    captured=st.integers(0, (1 << 64) - 1),
    record=st.binary(max_size=300),
)
def test_a_collectors_envelope_matches(seq: int, captured: int, record: bytes) -> None:
    data = encode_envelope(
        seq=seq,
        prev_hash=PREV,
        captured_at_ns=captured,
        origin=ORIGIN,
        key_id=KEY_ID,
        record=record,
    )
    assert EnvelopeMatcher(ORIGIN, KEY_ID).matches(data, seq, PREV)


@given(
    seq=st.integers(1, 1 << 20),
    captured=st.integers(0, 1 << 40),
    record=st.binary(max_size=40),
    cut=st.integers(0, 200),
    splice=st.binary(max_size=12),
)
def test_a_match_is_never_something_decoding_refuses(
    seq: int, captured: int, record: bytes, cut: int, splice: bytes
) -> None:
    good = encode_envelope(
        seq=seq,
        prev_hash=PREV,
        captured_at_ns=captured,
        origin=ORIGIN,
        key_id=KEY_ID,
        record=record,
    )
    data = good[:cut] + splice + good[cut + len(splice) :]
    if EnvelopeMatcher(ORIGIN, KEY_ID).matches(data, seq, PREV):
        assert _decoded_ok(data, seq, PREV)


def test_other_seq_link_origin_key_and_noncanonical_forms_do_not_match() -> None:
    matcher = EnvelopeMatcher(ORIGIN, KEY_ID)
    data = encode_envelope(
        seq=7, prev_hash=PREV, captured_at_ns=5, origin=ORIGIN, key_id=KEY_ID, record=b"r"
    )
    assert matcher.matches(data, 7, PREV)
    assert not matcher.matches(data, 8, PREV)
    assert not matcher.matches(data, 7, bytes(32))
    assert not EnvelopeMatcher("other", KEY_ID).matches(data, 7, PREV)
    assert not EnvelopeMatcher(ORIGIN, b"\x09\x09\x09\x09").matches(data, 7, PREV)
    assert not EnvelopeMatcher(ORIGIN, b"\x01\x02").matches(data, 7, PREV)
    padded_stamp = data.replace(b"\x18\x05", b"\x18\x85\x00")
    assert not matcher.matches(padded_stamp, 7, PREV)
    assert not matcher.matches(data + b"\x38\x01", 7, PREV)  # an unknown field after the record
    assert not matcher.matches(data[:-1], 7, PREV)
    empty_record = data[: -len(b"\x32\x01r")] + b"\x32\x00"
    assert not matcher.matches(empty_record, 7, PREV)

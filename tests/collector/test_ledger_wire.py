"""The hand-written Subscribe batch must be byte for byte protobuf's serialization."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from veritap.v1 import ledger_pb2

from collector.ledger.wire import encode_batch_response, serialize_response


@given(
    first=st.integers(1, (1 << 64) - 200),
    bodies=st.lists(st.tuples(st.booleans(), st.binary(max_size=300)), max_size=40),
)
def test_batch_bytes_are_protobufs(first: int, bodies: list[tuple[bool, bytes]]) -> None:
    message = ledger_pb2.SubscribeResponse()
    message.batch.SetInParent()
    for offset, (filtered, data) in enumerate(bodies):
        if filtered:
            message.batch.entries.add(seq=first + offset, filtered_hash=data)
        else:
            message.batch.entries.add(seq=first + offset, envelope=data)
    encoded = encode_batch_response(first, bodies)
    assert encoded == message.SerializeToString()
    assert ledger_pb2.SubscribeResponse.FromString(encoded) == message


def test_the_serializer_passes_bytes_through_and_serializes_messages() -> None:
    heartbeat = ledger_pb2.SubscribeResponse(heartbeat=ledger_pb2.Heartbeat(head_seq=3))
    assert serialize_response(heartbeat) == heartbeat.SerializeToString()
    assert serialize_response(b"\x0a\x00") == b"\x0a\x00"

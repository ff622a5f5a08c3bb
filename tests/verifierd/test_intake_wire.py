"""read_batch must agree with protobuf on every batch it reads, and read every batch."""

from __future__ import annotations

from google.protobuf.message import DecodeError
from hypothesis import given
from hypothesis import strategies as st
from veritap.v1 import ledger_pb2, log_pb2

from verifierd.intake.wire import EntryPart, read_batch

# Collectors send seq >= 1; seq 0 is omitted from the wire and left to protobuf.
entries = st.lists(
    st.tuples(st.integers(1, (1 << 64) - 1), st.booleans(), st.binary(max_size=300)),
    max_size=30,
)


def _message(parts: list[EntryPart]) -> ledger_pb2.SubscribeResponse:
    message = ledger_pb2.SubscribeResponse()
    message.batch.SetInParent()
    for seq, filtered, data in parts:
        entry = message.batch.entries.add(seq=seq)
        if filtered:
            entry.filtered_hash = data
        else:
            entry.envelope = data
    return message


def _as_parts(message: ledger_pb2.SubscribeResponse) -> list[EntryPart]:
    return [
        (e.seq, e.WhichOneof("body") == "filtered_hash", e.filtered_hash or e.envelope)
        for e in message.batch.entries
    ]


@given(parts=entries)
def test_every_serialized_batch_is_read(parts: list[EntryPart]) -> None:
    assert read_batch(_message(parts).SerializeToString()) == parts


@given(parts=entries, cut=st.integers(0, 400), splice=st.binary(max_size=8))
def test_what_is_read_is_what_protobuf_reads(
    parts: list[EntryPart], cut: int, splice: bytes
) -> None:
    good = _message(parts).SerializeToString()
    data = good[:cut] + splice + good[cut + len(splice) :]
    read = read_batch(data)
    if read is None:
        return
    try:
        message = ledger_pb2.SubscribeResponse.FromString(data)
    except DecodeError:
        raise AssertionError("read a batch protobuf refuses") from None
    assert message.WhichOneof("kind") == "batch"
    assert all(e.WhichOneof("body") is not None for e in message.batch.entries)
    assert read == _as_parts(message)


def test_other_responses_are_left_to_protobuf() -> None:
    checkpoint = ledger_pb2.SubscribeResponse(checkpoint=log_pb2.Checkpoint(tree_size=4))
    heartbeat = ledger_pb2.SubscribeResponse(heartbeat=ledger_pb2.Heartbeat(head_seq=4))
    assert read_batch(checkpoint.SerializeToString()) is None
    assert read_batch(heartbeat.SerializeToString()) is None
    no_body = ledger_pb2.SubscribeResponse()
    no_body.batch.entries.add(seq=3)
    assert read_batch(no_body.SerializeToString()) is None
    assert read_batch(b"\x0a\x05\x0a\x03\x08\x01") is None

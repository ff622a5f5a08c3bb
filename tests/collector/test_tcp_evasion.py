"""TCP reassembly against an active prover: TTL, conflicting copies, RST/FIN windows, bounds."""

from __future__ import annotations

import hashlib
import random
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from collector.tcp_reassembly import (
    SEGMENT_OVERHEAD,
    SERVER_TO_CLIENT,
    Reassembler,
    ReassemblyLimits,
    StreamAmbiguity,
)
from tests.collector.reassembly_runs import run, seg
from tests.collector.stream_recorder import Recorders
from tests.cpu_bound import cpu_bound
from tests.pcapgen import ACK, CLIENT, FIN, RST, SERVER, Conversation, Packet, retimed


def sha(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def feed(
    conv: Conversation,
    packets: list[tuple[Packet, int]],
    limits: ReassemblyLimits | None = None,
    flush: bool = True,
) -> tuple[Reassembler, Recorders]:
    """Run (packet, ttl) pairs through a reassembler."""
    recorders = Recorders()
    reassembler = Reassembler(recorders, limits)
    for packet, ttl in packets:
        reassembler.receive(seg(conv, packet, ttl))
    if flush:
        reassembler.flush()
    return reassembler, recorders


def test_a_copy_with_another_ttl_never_decides_the_bytes() -> None:
    conv = Conversation().handshake()
    (real,) = conv.send(SERVER, b"the real answer")
    conv.close()
    fake = replace(real, payload=b"a forged answer", ts=real.ts - 0.0005)
    packets = [(p, 64) for p in conv.packets]
    packets.insert(conv.packets.index(real), (fake, 3))
    r, rec = feed(conv, packets)
    assert bytes(rec.flows[0].data[SERVER_TO_CLIENT]) == b"the real answer"
    assert r.stats.ttl_departures == 1 and r.stats.overlap_conflicts == 0
    assert rec.flows[0].ambiguities == []


def test_a_rst_with_another_ttl_does_not_end_the_flow() -> None:
    conv = Conversation().handshake()
    conv.send(CLIENT, b"request")
    reset = conv.rst(SERVER)
    conv.packets.remove(reset)
    conv.send(SERVER, b"answer")
    conv.close()
    packets = [(p, 64) for p in conv.packets]
    packets.insert(5, (reset, 10))
    r, rec = feed(conv, packets)
    assert rec.flows[0].closed == "fin" and r.stats.ttl_departures == 1


def test_a_retransmission_that_differs_from_delivered_bytes_is_ambiguous() -> None:
    conv = Conversation().handshake()
    (first,) = conv.send(SERVER, b"AAAAAAAAAA")
    conv.close()
    pkts = list(conv.packets)
    pkts.insert(pkts.index(first) + 1, replace(first, payload=b"AAAABBBBAA"))
    r, rec = run(conv, pkts)
    flow = rec.flows[0]
    assert bytes(flow.data[SERVER_TO_CLIENT]) == b"AAAAAAAAAA"
    assert flow.ambiguities == [
        StreamAmbiguity(SERVER_TO_CLIENT, 0, 10, (sha(b"AAAAAAAAAA"), sha(b"AAAABBBBAA")))
    ]
    assert r.stats.overlap_conflicts == 1 and r.stats.ambiguous_bytes == 10


def test_conflicting_buffered_copies_are_reported_before_their_bytes_are_delivered() -> None:
    conv = Conversation().handshake()
    a, b = conv.send(SERVER, b"x" * 200, sizes=[100, 100])
    conv.close()
    pkts = [p for p in conv.packets if p is not a]
    i = pkts.index(b)
    pkts[i + 1 : i + 1] = [replace(b, payload=b"y" * 100), a]
    _, rec = run(conv, pkts)
    flow = rec.flows[0]
    assert bytes(flow.data[SERVER_TO_CLIENT]) == b"x" * 200
    events = [e for e in flow.events if e[1] == SERVER_TO_CLIENT and e[0] != "start"]
    # The first data event carries byte 0..100; the ambiguity over 100..200 comes before
    # the data event that carries those bytes.
    ambiguous = events.index(("ambiguous", SERVER_TO_CLIENT, 100, 200))
    assert events[ambiguous + 1] == ("data", SERVER_TO_CLIENT, 100)
    assert flow.ambiguities[0].variants == (sha(b"x" * 100), sha(b"y" * 100))


def test_an_exact_duplicate_of_a_buffered_segment_is_not_buffered_twice() -> None:
    conv = Conversation().handshake()
    a, b = conv.send(SERVER, b"x" * 200, sizes=[100, 100])
    pkts = [p for p in conv.packets if p is not a]
    pkts.insert(pkts.index(b) + 1, b)
    r, _ = run(conv, pkts, flush=False)
    assert r.stats.buffered_bytes == 100 + SEGMENT_OVERHEAD
    assert r.stats.retransmitted_bytes == 100


def test_an_out_of_window_rst_is_ignored_and_the_flow_goes_on() -> None:
    conv = Conversation().handshake()
    conv.send(CLIENT, b"first request")
    conv.packets.append(
        Packet(conv.ts, SERVER, (conv.next_seq[SERVER] + 5000) & 0xFFFFFFFF, 0, RST)
    )
    conv.send(SERVER, b"first answer")
    conv.send(CLIENT, b"second request")
    conv.send(SERVER, b"second answer")
    conv.close()
    r, rec = run(conv)
    flow = rec.flows[0]
    assert bytes(flow.data[SERVER_TO_CLIENT]) == b"first answersecond answer"
    assert flow.closed == "fin" and r.stats.ignored_resets == 1 and r.stats.resets == 0


def test_a_rst_inside_the_window_but_not_at_the_next_byte_is_ignored() -> None:
    conv = Conversation().handshake()
    conv.send(SERVER, b"answer")
    conv.packets.append(Packet(conv.ts, SERVER, (conv.next_seq[SERVER] + 1) & 0xFFFFFFFF, 0, RST))
    r, rec = run(conv, flush=False)
    assert r.stats.ignored_resets == 1 and rec.flows[0].closed is None


def test_a_rst_answering_a_syn_ends_the_flow() -> None:
    conv = Conversation()
    conv.packets.append(Packet(conv.ts, CLIENT, conv.client_isn, 0, 0x02))
    conv.packets.append(Packet(conv.ts + 0.001, SERVER, 0, conv.client_isn + 1, RST | ACK))
    r, rec = run(conv, flush=False)
    assert rec.flows[0].closed == "rst" and r.stats.resets == 1


def test_a_forged_fin_inside_delivered_bytes_is_ignored() -> None:
    conv = Conversation().handshake()
    conv.send(CLIENT, b"request")
    head, _ = conv.send(SERVER, b"data: one\n\ndata: two\n\n", sizes=[11, 11])
    conv.packets.append(Packet(conv.ts + 0.0001, SERVER, head.seq + 5, head.ack, FIN | ACK))
    conv.ts += 0.001
    conv.send(SERVER, b"data: three\n\n")
    conv.close()
    r, rec = run(conv)
    flow = rec.flows[0]
    assert bytes(flow.data[SERVER_TO_CLIENT]) == b"data: one\n\ndata: two\n\ndata: three\n\n"
    assert ("end", SERVER_TO_CLIENT, "fin") in flow.events
    assert r.stats.ignored_fins == 1


def test_a_fin_nobody_acknowledged_does_not_end_the_direction() -> None:
    conv = Conversation().handshake()
    conv.send(CLIENT, b"request")
    conv.send(SERVER, b"data: partial\n\n", ack=False)
    conv.fin(SERVER)
    _, rec = run(conv)
    flow = rec.flows[0]
    assert ("end", SERVER_TO_CLIENT, "shutdown") in flow.events
    assert ("end", SERVER_TO_CLIENT, "fin") not in flow.events


def test_bytes_past_an_unacknowledged_fin_make_the_end_ambiguous() -> None:
    conv = Conversation().handshake()
    conv.send(CLIENT, b"request")
    conv.send(SERVER, b"data: one\n\n", ack=False)
    forged = conv.fin(SERVER)
    conv.next_seq[SERVER] -= 1  # the honest server never sent that FIN
    conv.send(SERVER, b"data: two\n\n")
    conv.close()
    _, rec = run(conv)
    flow = rec.flows[0]
    assert bytes(flow.data[SERVER_TO_CLIENT]) == b"data: one\n\ndata: two\n\n"
    fin_at = forged.seq - conv.server_isn - 1
    assert flow.ambiguities == [
        StreamAmbiguity(SERVER_TO_CLIENT, fin_at, fin_at + 11, (sha(b"data: two\n\n"), sha(b"")))
    ]
    assert flow.closed == "fin"


def test_a_fin_before_bytes_already_buffered_is_ambiguous() -> None:
    conv = Conversation().handshake()
    a, b = conv.send(SERVER, b"1" * 100 + b"2" * 100, sizes=[100, 100], ack=False)
    forged = Packet(b.ts, SERVER, a.seq + 100, a.ack, FIN | ACK)
    pkts = [p for p in conv.packets if p is not a] + [forged, a]
    conv.close()
    pkts += conv.packets[-3:]
    _, rec = run(conv, pkts)
    flow = rec.flows[0]
    assert flow.ambiguities == [
        StreamAmbiguity(SERVER_TO_CLIENT, 100, 200, (sha(b"2" * 100), sha(b"")))
    ]
    assert bytes(flow.data[SERVER_TO_CLIENT]) == b"1" * 100 + b"2" * 100


def test_a_segment_three_seconds_late_is_not_a_gap() -> None:
    conv = Conversation().handshake()
    segs = conv.send(SERVER, b"z" * 3000, sizes=[1000] * 3)
    late = segs[1]
    pkts = [p for p in conv.packets if p is not late]
    conv.close()
    pkts = [
        *pkts,
        replace(late, ts=late.ts + 3.0),
        *(replace(p, ts=p.ts + 3.0) for p in conv.packets[-3:]),
    ]
    r, rec = run(conv, pkts)
    assert bytes(rec.flows[0].data[SERVER_TO_CLIENT]) == b"z" * 3000
    assert r.stats.gaps == 0


def test_each_buffered_segment_costs_its_overhead_against_the_window() -> None:
    conv = Conversation().handshake()
    segs = conv.send(SERVER, b"q" * 50, sizes=[1] * 50, ack=False)
    pkts = [p for p in conv.packets if p is not segs[0]]
    window = 10 * (1 + SEGMENT_OVERHEAD)
    r, rec = run(conv, pkts, ReassemblyLimits(window_bytes=window), flush=False)
    assert r.stats.window_gaps == 1 and rec.flows[0].gaps(SERVER_TO_CLIENT) == [1]


def test_payload_far_past_the_window_is_ignored() -> None:
    conv = Conversation().handshake()
    (real,) = conv.send(SERVER, b"answer")
    far = replace(real, seq=(real.seq + 100_000_000) & 0xFFFFFFFF, payload=b"x")
    conv.packets.insert(conv.packets.index(real), far)
    r, rec = run(conv, flush=False)
    assert r.stats.out_of_window_segments == 1 and r.stats.buffered_bytes == 0
    assert bytes(rec.flows[0].data[SERVER_TO_CLIENT]) == b"answer"


def test_many_tiny_segments_in_reverse_order_reassemble_in_bounded_time() -> None:
    count = 40_000
    conv = Conversation().handshake()
    segs = conv.send(SERVER, bytes(range(256)) * (count // 256 + 1), sizes=[1] * count, ack=False)
    segs = segs[:count]
    pkts = [*conv.packets[:3], segs[0], *reversed(segs[1:])]
    limits = ReassemblyLimits(window_bytes=1 << 30, max_buffered_bytes=1 << 30)
    # A quadratic buffer takes minutes here; O(log n) per segment takes about a second.
    with cpu_bound(15.0):
        r, rec = run(conv, pkts, limits, flush=False)
    assert len(rec.flows[0].data[SERVER_TO_CLIENT]) == count and r.stats.gaps == 0


@st.composite
def hostile_segments(draw: st.DrawFn) -> tuple[bytes, list[tuple[int, bytes]]]:
    """The true stream and a shuffled list of (offset, bytes) copies: some altered."""
    data = draw(st.binary(min_size=1, max_size=2000))
    copies: list[tuple[int, bytes]] = []
    pos = 0
    while pos < len(data):
        size = draw(st.integers(min_value=1, max_value=300))
        copies.append((pos, data[pos : pos + size]))
        pos += size
    for _ in range(draw(st.integers(min_value=0, max_value=12))):
        start = draw(st.integers(min_value=0, max_value=len(data) - 1))
        size = draw(st.integers(min_value=1, max_value=400))
        piece = bytearray(data[start : start + size])
        if draw(st.booleans()):
            flip = draw(st.integers(min_value=0, max_value=len(piece) - 1))
            piece[flip] ^= 0xFF
        copies.append((start, bytes(piece)))
    order = draw(st.permutations(range(len(copies))))
    return data, [copies[i] for i in order]


@settings(max_examples=150, deadline=None)
@given(case=hostile_segments(), isn=st.integers(min_value=0, max_value=0xFFFFFFFF))
def test_delivered_bytes_are_always_some_copy_and_every_difference_is_ambiguous(
    case: tuple[bytes, list[tuple[int, bytes]]], isn: int
) -> None:
    data, copies = case
    conv = Conversation(server_isn=isn).handshake()
    base = (isn + 1) & 0xFFFFFFFF
    pkts = conv.packets[:3] + [
        Packet(
            1.0 + i * 1e-6, SERVER, (base + offset) & 0xFFFFFFFF, conv.client_isn + 1, ACK, piece
        )
        for i, (offset, piece) in enumerate(copies)
    ]
    with cpu_bound(2.0):
        r, rec = run(conv, pkts)
    flow = rec.flows[0]
    delivered = bytes(flow.data[SERVER_TO_CLIENT])
    assert flow.gaps(SERVER_TO_CLIENT) == [] and delivered == delivered[: len(data)]
    assert len(delivered) == len(data)
    covered = set()
    for ambiguity in flow.ambiguities:
        assert ambiguity.start < ambiguity.end and len(ambiguity.variants) == 2
        covered.update(range(ambiguity.start, ambiguity.end))
    for i, byte in enumerate(delivered):
        assert any(o <= i < o + len(p) and p[i - o] == byte for o, p in copies)
        if byte != data[i]:
            assert i in covered
    altered = any(p != data[o : o + len(p)] for o, p in copies)
    assert bool(flow.ambiguities) == (r.stats.overlap_conflicts > 0)
    if not altered:
        assert delivered == data and not flow.ambiguities


def test_random_hostile_flows_never_raise() -> None:
    rng = random.Random(15)
    with cpu_bound(20.0):
        for _ in range(200):
            conv = Conversation(server_isn=rng.getrandbits(32)).handshake()
            packets = list(conv.packets)
            for _ in range(rng.randint(1, 60)):
                flags = rng.choice([ACK, ACK, ACK, FIN | ACK, RST, RST | ACK, 0x02, 0x12])
                direction = rng.choice([CLIENT, SERVER])
                seq = (conv.next_seq[direction] + rng.randint(-3000, 3000)) & 0xFFFFFFFF
                ack = (conv.next_seq[1 - direction] + rng.randint(-5, 5)) & 0xFFFFFFFF
                payload = rng.randbytes(rng.choice([0, 0, 1, 10, 500]))
                packets.append(
                    Packet(conv.ts + len(packets) * 0.01, direction, seq, ack, flags, payload)
                )
            recorders = Recorders()
            reassembler = Reassembler(recorders, ReassemblyLimits(window_bytes=4096))
            for packet in packets:
                reassembler.receive(seg(conv, packet, rng.choice([64, 64, 64, 63])))
            reassembler.flush()
            assert reassembler.stats.buffered_bytes == 0 and reassembler.open_flows == 0


def test_a_close_whose_last_ack_was_filtered_out_still_ends_with_fin() -> None:
    conv = Conversation().handshake()
    conv.exchange(b"request", b"answer")
    conv.close()
    _, rec = run(conv, conv.packets[:-1])  # a BPF filter without pure ACKs drops the last one
    assert rec.flows[0].closed == "fin"


def test_a_rst_just_past_a_fin_ends_the_flow() -> None:
    conv = Conversation().handshake()
    conv.send(SERVER, b"answer", ack=False)
    conv.fin(SERVER)
    conv.packets.append(Packet(conv.ts, SERVER, conv.next_seq[SERVER] & 0xFFFFFFFF, 0, RST))
    r, rec = run(conv, flush=False)
    assert rec.flows[0].closed == "rst" and r.stats.resets == 1


def test_a_segment_planted_far_ahead_does_not_time_out_a_flowing_stream() -> None:
    conv = Conversation(step=0.1).handshake()
    segs = conv.send(SERVER, b"s" * 50_000, sizes=[1000] * 50, ack=False)
    planted = replace(segs[0], seq=(segs[0].seq + 1_000_000) & 0xFFFFFFFF, payload=b"!")
    pkts = list(conv.packets)
    pkts.insert(pkts.index(segs[0]), planted)
    limits = ReassemblyLimits(gap_timeout_ns=1_000_000_000)
    r, rec = run(conv, pkts, limits, flush=False)
    assert r.stats.timeout_gaps == 0
    assert bytes(rec.flows[0].data[SERVER_TO_CLIENT]) == b"s" * 50_000


def test_after_losing_more_than_a_window_the_stream_resumes() -> None:
    conv = Conversation(step=0.1).handshake()
    data = bytes(range(250)) * 200
    segs = conv.send(SERVER, data, sizes=[1000] * 50, ack=False)
    pkts = retimed([p for p in conv.packets if p not in segs[1:21]], 1.0, 0.1)
    limits = ReassemblyLimits(gap_timeout_ns=1_000_000_000, window_bytes=10_000)
    r, rec = run(conv, pkts, limits, flush=False)
    delivered = bytes(rec.flows[0].data[SERVER_TO_CLIENT])
    assert r.stats.out_of_window_segments > 0 and r.stats.gaps == 1
    assert delivered[:1000] == data[:1000] and data.endswith(delivered[1000:])
    assert len(delivered) > 1000 + 10 * 1000

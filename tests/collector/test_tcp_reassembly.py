"""TCP reassembly: ordering, retransmission, overlaps, gaps, midstream, wrap, ends, caps."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from collector.tcp_reassembly import (
    CLIENT_TO_SERVER,
    SERVER_TO_CLIENT,
    Reassembler,
    ReassemblyLimits,
)
from tests.collector.reassembly_runs import run, seg
from tests.collector.stream_recorder import Recorders
from tests.pcapgen import ACK, CLIENT, FIN, SERVER, SYN, Conversation, Packet

REQUEST = b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello" * 7
RESPONSE = bytes(range(256)) * 40


def simple(**kw: object) -> Conversation:
    conv = Conversation(**kw).handshake()  # type: ignore[arg-type]
    conv.exchange(REQUEST, RESPONSE, request_sizes=[100, 50, 200], response_sizes=[1000] * 11)
    return conv.close()


def test_in_order_stream_and_fin_close() -> None:
    conv = simple()
    r, rec = run(conv, flush=False)
    (flow,) = rec.flows
    assert bytes(flow.data[CLIENT_TO_SERVER]) == REQUEST
    assert bytes(flow.data[SERVER_TO_CLIENT]) == RESPONSE
    assert flow.events[0] == ("start", 0, False)
    assert ("end", 0, "fin") in flow.events and ("end", 1, "fin") in flow.events
    assert flow.closed == "fin"
    assert flow.info.client_port == 40000 and flow.info.server_port == 8000
    assert r.open_flows == 0 and r.stats.gaps == 0


def test_out_of_order_and_retransmissions_reassemble() -> None:
    conv = simple()
    pkts = list(conv.packets)
    data = [i for i, p in enumerate(pkts) if p.payload and p.direction == 1]
    a, b = data[2], data[3]
    pkts[a], pkts[b] = pkts[b], pkts[a]
    pkts.insert(data[6], pkts[data[5]])  # duplicate
    r, rec = run(conv, pkts)
    assert bytes(rec.flows[0].data[1]) == RESPONSE
    assert r.stats.out_of_order_segments == 1
    assert r.stats.retransmitted_bytes == 1000
    assert r.stats.overlap_conflicts == 0 and r.stats.gaps == 0


def test_overlap_first_copy_wins_and_conflicts_are_counted() -> None:
    conv = Conversation().handshake()
    (p1, _p2, p3) = conv.send(1, b"A" * 300, sizes=[100, 100, 100])
    conv.close()
    pkts = list(conv.packets)
    # A buffered conflicting copy of p3 arrives first, then a conflicting overlap of p1+p2 later.
    bad3 = replace(p3, payload=b"Z" * 100)
    bad12 = replace(p1, payload=b"Y" * 150)
    i = pkts.index(p1)
    pkts[i:i] = [bad3]
    pkts.insert(pkts.index(p3) + 1, bad12)
    r, rec = run(conv, pkts)
    assert bytes(rec.flows[0].data[1]) == b"A" * 200 + b"Z" * 100
    assert r.stats.overlap_conflicts == 2


def test_hole_becomes_gap_after_timeout_and_stream_goes_on() -> None:
    conv = Conversation(step=0.5).handshake()
    segs = conv.send(1, b"x" * 5000, sizes=[1000] * 5)
    conv.close()
    pkts = [p for p in conv.packets if p is not segs[1]]
    r, rec = run(conv, pkts, ReassemblyLimits(gap_timeout_ns=1_000_000_000))
    flow = rec.flows[0]
    assert flow.gaps(1) == [1000]
    assert len(flow.data[1]) == 4000
    assert r.stats.timeout_gaps == 1 and r.stats.gap_bytes == 1000
    # The gap sits exactly where the bytes are missing.
    order = [e for e in flow.events if e[1] == 1 and e[0] in ("data", "gap")]
    assert order[:2] == [("data", 1, 1000), ("gap", 1, 1000)]


def test_window_overflow_declares_gap_before_timeout() -> None:
    conv = Conversation().handshake()
    segs = conv.send(1, b"y" * 10000, sizes=[1000] * 10)
    pkts = [p for p in conv.packets if p is not segs[0]]
    r, rec = run(conv, pkts, ReassemblyLimits(window_bytes=3000), flush=False)
    assert rec.flows[0].gaps(1) == [1000]
    assert len(rec.flows[0].data[1]) == 9000
    assert r.stats.window_gaps == 1


def test_total_memory_cap_flushes_the_biggest_buffer() -> None:
    conv = Conversation().handshake()
    segs = conv.send(1, b"z" * 6000, sizes=[1000] * 6)
    pkts = [p for p in conv.packets if p is not segs[0]]
    r, rec = run(conv, pkts, ReassemblyLimits(max_buffered_bytes=2500), flush=False)
    assert r.stats.memory_cap_hits == 1
    assert rec.flows[0].gaps(1) == [1000]
    assert r.stats.buffered_bytes == 0


def test_lost_tail_before_fin_is_a_gap_at_close() -> None:
    conv = Conversation().handshake()
    segs = conv.send(1, b"q" * 3000, sizes=[1000] * 3)
    conv.close()
    pkts = [p for p in conv.packets if p is not segs[2]]
    _, rec = run(conv, pkts)
    flow = rec.flows[0]
    assert flow.gaps(1) == [1000]
    assert ("end", 1, "fin") in flow.events


def test_midstream_pickup_starts_at_first_byte_seen() -> None:
    conv = simple()
    pkts = [p for p in conv.packets if not p.flags & SYN]
    first_data = next(i for i, p in enumerate(pkts) if p.payload)
    r, rec = run(conv, pkts[first_data + 1 :])
    flow = rec.flows[0]
    assert ("start", 0, True) in flow.events and ("start", 1, True) in flow.events
    assert bytes(flow.data[0]) == REQUEST[100:]
    assert bytes(flow.data[1]) == RESPONSE
    assert flow.info.server_port == 8000  # server chosen by the configured port
    assert r.stats.midstream_directions == 2


def test_lost_syn_ack_learns_server_start_from_client_ack() -> None:
    conv = simple()
    pkts = [p for p in conv.packets if p.flags != SYN | ACK]
    _, rec = run(conv, pkts)
    assert ("start", 1, False) in rec.flows[0].events
    assert bytes(rec.flows[0].data[1]) == RESPONSE


def test_sequence_wraparound() -> None:
    conv = simple(client_isn=0xFFFFFFFF - 150, server_isn=0xFFFFFFFF - 3500)
    pkts = list(conv.packets)
    data = [i for i, p in enumerate(pkts) if p.payload and p.direction == 1]
    pkts[data[3]], pkts[data[4]] = pkts[data[4]], pkts[data[3]]
    r, rec = run(conv, pkts)
    assert bytes(rec.flows[0].data[0]) == REQUEST
    assert bytes(rec.flows[0].data[1]) == RESPONSE
    assert r.stats.gaps == 0


def test_rst_closes_both_directions() -> None:
    conv = Conversation().handshake()
    conv.send(0, b"abc")
    conv.rst(1)
    conv.send(0, b"late")
    r, rec = run(conv)
    flow = rec.flows[0]
    assert flow.closed == "rst"
    assert ("end", 0, "rst") in flow.events and ("end", 1, "rst") in flow.events
    assert r.stats.late_segments == 2 and len(rec.flows) == 1  # the data and its ACK


def test_idle_flows_close_and_new_flows_are_evicted_at_the_cap() -> None:
    recorders = Recorders()
    limits = ReassemblyLimits(idle_timeout_ns=10_000_000_000, max_flows=2)
    r = Reassembler(recorders, limits)
    for i in range(3):
        conv = Conversation(client=("10.0.0.1", 41000 + i), ts=1000.0 + i).handshake()
        conv.send(0, b"hi")
        for p in conv.packets:
            r.receive(seg(conv, p))
    assert r.stats.flows_evicted == 1 and recorders.flows[0].closed == "evicted"
    r.advance(int(1100e9))
    assert r.stats.idle_closed == 2 and r.open_flows == 0


def _ack_of(conv: Conversation, direction: int) -> Packet:
    """The ACK `direction` sends for everything its peer sent so far."""
    packet = Packet(
        conv.ts + conv.step,
        direction,
        conv.next_seq[direction] & 0xFFFFFFFF,
        conv.next_seq[1 - direction] & 0xFFFFFFFF,
        ACK,
    )
    conv.ts += conv.step
    conv.packets.append(packet)
    return packet


def test_port_reuse_after_the_client_closed_opens_a_new_flow() -> None:
    first = Conversation().handshake()
    first.send(0, b"one")
    first.fin(CLIENT)
    _ack_of(first, SERVER)
    second = Conversation(client_isn=90_000, ts=first.ts + 1).handshake()
    second.send(0, b"two")
    recorders = Recorders()
    r = Reassembler(recorders)
    for p in [*first.packets, *second.packets]:
        r.receive(seg(first, p))
    assert [bytes(f.data[0]) for f in recorders.flows] == [b"one", b"two"]
    assert recorders.flows[0].closed == "reused" and r.stats.ignored_syns == 0


def test_syn_with_another_isn_on_an_open_flow_is_ignored() -> None:
    conv = Conversation().handshake()
    conv.send(CLIENT, b"request")
    conv.packets.append(Packet(conv.ts + 0.001, CLIENT, 77_777, 0, SYN))
    conv.packets.append(Packet(conv.ts + 0.002, SERVER, 88_888, 77_778, SYN | ACK))
    conv.ts += 0.003
    conv.send(SERVER, b"response")
    conv.close()
    r, rec = run(conv)
    (flow,) = rec.flows
    assert bytes(flow.data[SERVER_TO_CLIENT]) == b"response" and flow.closed == "fin"
    assert r.stats.ignored_syns == 2


def test_a_syn_after_the_flow_was_quiet_for_the_linger_time_is_a_new_connection() -> None:
    first = Conversation().handshake()
    first.send(0, b"one")
    second = Conversation(client_isn=90_000, ts=first.ts + 31).handshake()
    second.send(0, b"two")
    recorders = Recorders()
    r = Reassembler(recorders, ReassemblyLimits(closed_linger_ns=30_000_000_000))
    for p in [*first.packets, *second.packets]:
        r.receive(seg(first, p))
    assert [bytes(f.data[0]) for f in recorders.flows] == [b"one", b"two"]


def test_pure_acks_of_unknown_flows_are_ignored() -> None:
    conv = Conversation().handshake()
    r, rec = run(conv, [Packet(1.0, 0, 5, 5, ACK), Packet(1.1, 1, 9, 9, FIN | ACK)])
    assert rec.flows == [] and r.stats.ignored_segments == 2


@settings(max_examples=60, deadline=None)
@given(
    data=st.binary(min_size=1, max_size=3000),
    cuts=st.lists(st.integers(min_value=1, max_value=400), min_size=1, max_size=30),
    seed=st.randoms(use_true_random=False),
    dups=st.lists(st.integers(min_value=0, max_value=100), max_size=10),
    isn=st.integers(min_value=0, max_value=0xFFFFFFFF),
)
def test_any_permutation_and_duplication_reassembles_the_same_bytes(
    data: bytes, cuts: list[int], seed: object, dups: list[int], isn: int
) -> None:
    conv = Conversation(server_isn=isn).handshake()
    segs = conv.send(1, data, sizes=cuts, ack=False)
    shuffled = list(segs) + [segs[i % len(segs)] for i in dups]
    # Also overlapping re-segmentations of the same bytes.
    if len(segs) > 1:
        a, b = segs[0], segs[1]
        shuffled.append(replace(a, payload=a.payload + b.payload))
    seed.shuffle(shuffled)  # type: ignore[attr-defined]
    conv.close()
    pkts = conv.packets[:3] + shuffled + conv.packets[-3:]
    pkts = [replace(p, ts=1.0 + i * 1e-6) for i, p in enumerate(pkts)]
    r, rec = run(conv, pkts)
    assert bytes(rec.flows[0].data[1]) == data
    assert r.stats.gaps == 0 and r.stats.overlap_conflicts == 0

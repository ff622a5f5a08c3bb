"""TCP segments decoded from a generated conversation, run through a reassembler that
records each direction's stream."""

from __future__ import annotations

from collections.abc import Sequence

from collector.capture.decode import TcpSegment
from collector.tcp_reassembly import Reassembler, ReassemblyLimits
from tests.collector.stream_recorder import Recorders
from tests.pcapgen import CLIENT, Conversation, Packet

C_IP, S_IP = bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2])


def seg(conv: Conversation, p: Packet, ttl: int = 64) -> TcpSegment:
    if p.direction == CLIENT:
        src, dst, sport, dport = C_IP, S_IP, conv.client[1], conv.server[1]
    else:
        src, dst, sport, dport = S_IP, C_IP, conv.server[1], conv.client[1]
    return TcpSegment(
        int(p.ts * 1e9), src, dst, sport, dport, p.seq, p.ack, p.flags, p.payload, (), ttl
    )


def run(
    conv: Conversation,
    packets: Sequence[Packet] | None = None,
    limits: ReassemblyLimits | None = None,
    flush: bool = True,
) -> tuple[Reassembler, Recorders]:
    recorders = Recorders()
    reassembler = Reassembler(recorders, limits)
    for p in conv.packets if packets is None else packets:
        reassembler.receive(seg(conv, p))
    if flush:
        reassembler.flush()
    return reassembler, recorders

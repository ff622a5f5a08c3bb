"""A segment forged with other bytes, and a keep-alive connection where such a copy of an
answer arrives after the answer's record was written."""

from __future__ import annotations

from dataclasses import replace

from tests.collector.capture_scenarios import chat
from tests.pcapgen import CLIENT, SERVER, Conversation, Packet


def forged(packet: Packet) -> Packet:
    """The same segment with other bytes (same length)."""
    return replace(packet, payload=packet.payload.replace(b"e", b"E"), ts=packet.ts - 0.00001)


def late_copy_of_a_written_answer() -> tuple[Conversation, list[Packet], Packet, Packet]:
    """Two keep-alive exchanges; a differing copy of the first answer's segment arrives
    with the second request, after the first record was written. Also returns the
    answer's segment and its copy."""
    first, second = chat("first", 30), chat("second", 30)
    conv = Conversation().handshake()
    conv.send(CLIENT, first.request())
    (answer,) = conv.send(SERVER, first.response())
    (request,) = conv.send(CLIENT, second.request())
    conv.send(SERVER, second.response())
    conv.close()
    late = replace(forged(answer), ts=request.ts + 0.00001)
    return conv, sorted([*conv.packets, late], key=lambda p: p.ts), answer, late

"""IP datagrams carrying one TCP segment, cut into IPv4 or IPv6 fragments as a capture sees
them."""

from __future__ import annotations

import struct

from tests.pcapgen import Conversation, Packet, tcp_ip_bytes

PAYLOAD = bytes(range(256)) * 12 + b"tail"


def datagram(conv: Conversation, payload: bytes = PAYLOAD) -> bytes:
    return tcp_ip_bytes(conv, Packet(1.0, 0, 1234, 99, 0x18, payload))


def v4_fragment(ip: bytes, offset: int, piece: bytes, more: bool, ttl: int = 64) -> bytes:
    header = bytearray(ip[:20])
    struct.pack_into("!HHH", header, 2, 20 + len(piece), 0x4242, (offset // 8) | (more << 13))
    header[8] = ttl
    struct.pack_into("!H", header, 10, 0)
    total = sum(struct.unpack("!10H", header))
    while total > 0xFFFF:
        total = (total & 0xFFFF) + (total >> 16)
    struct.pack_into("!H", header, 10, ~total & 0xFFFF)
    return bytes(header) + piece


def v6_fragment(ip: bytes, offset: int, piece: bytes, more: bool, ttl: int = 64) -> bytes:
    header = bytearray(ip[:40])
    struct.pack_into("!H", header, 4, 8 + len(piece))
    header[6] = 44
    header[7] = ttl
    return bytes(header) + struct.pack("!BBHI", 6, 0, offset | more, 0x42424242) + piece


def fragments(conv: Conversation, size: int, payload: bytes = PAYLOAD) -> list[bytes]:
    """The datagram carrying `payload` cut into fragments of `size` bytes (a multiple of 8)."""
    ip = datagram(conv, payload)
    header = 20 if ip[0] >> 4 == 4 else 40
    body = ip[header:]
    build = v4_fragment if header == 20 else v6_fragment
    cuts = range(0, len(body), size)
    return [build(ip, at, body[at : at + size], at + size < len(body)) for at in cuts]

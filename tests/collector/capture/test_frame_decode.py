"""Frame decoding: link types, VLAN stacks, IPv6 extension headers, odd frames."""

from __future__ import annotations

import struct

import pytest

from collector.capture.decode import FrameDecoder
from collector.capture.errors import UnsupportedLinkTypeError
from tests.pcapgen import (
    LINK_ETHERNET,
    LINK_RAW,
    LINK_SLL,
    LINK_SLL2,
    Conversation,
    Packet,
    frame,
)

PAYLOAD = b"GET / HTTP/1.1\r\n\r\n"


def _packet() -> Packet:
    return Packet(1.5, 0, 1234, 99, 0x18, PAYLOAD)


@pytest.mark.parametrize(
    ("link", "dlt"), [(LINK_ETHERNET, 1), (LINK_SLL, 113), (LINK_SLL2, 276), (LINK_RAW, 101)]
)
@pytest.mark.parametrize("client", [("10.1.2.3", 5555), ("fd00::1", 5555)])
def test_link_types_and_ip_versions(link: str, dlt: int, client: tuple[str, int]) -> None:
    server = ("10.1.2.4", 8000) if ":" not in client[0] else ("fd00::2", 8000)
    conv = Conversation(client=client, server=server)
    seg = FrameDecoder(dlt).decode(7, frame(conv, _packet(), link=link))
    assert seg is not None
    assert (seg.sport, seg.dport, seg.seq, seg.ack, seg.flags) == (5555, 8000, 1234, 99, 0x18)
    assert seg.payload == PAYLOAD and seg.ts_ns == 7 and seg.vlans == ()
    assert len(seg.src) == (4 if "." in client[0] else 16)


def test_vlan_and_qinq_tags_are_kept_in_order() -> None:
    conv = Conversation()
    decoder = FrameDecoder(1)
    seg = decoder.decode(0, frame(conv, _packet(), vlans=[100, 200]))
    assert seg is not None and seg.vlans == (100, 200) and seg.payload == PAYLOAD
    seg = decoder.decode(0, frame(conv, _packet(), vlans=[7]), vlans=(3,))
    assert seg is not None and seg.vlans == (3, 7)


def test_ethernet_padding_is_trimmed_by_ip_length() -> None:
    conv = Conversation()
    tiny = Packet(1.0, 0, 1, 1, 0x10, b"")
    seg = FrameDecoder(1).decode(0, frame(conv, tiny, pad_to=60))
    assert seg is not None and seg.payload == b""


def test_ipv6_extension_headers_are_walked() -> None:
    conv = Conversation(client=("fd00::1", 5555), server=("fd00::2", 8000))
    raw = bytearray(frame(conv, _packet(), link=LINK_RAW))
    tcp = bytes(raw[40:])
    hop_by_hop = bytes([6, 0]) + b"\x01\x04\x00\x00\x00\x00"  # next=TCP, PadN
    header = bytearray(raw[:40])
    header[6] = 0  # next header: hop-by-hop
    struct.pack_into("!H", header, 4, len(tcp) + 8)
    seg = FrameDecoder(101).decode(0, bytes(header) + hop_by_hop + tcp)
    assert seg is not None and seg.payload == PAYLOAD


def test_tso_super_frames_with_zero_ip_length_are_accepted() -> None:
    conv = Conversation()
    big = Packet(1.0, 0, 1, 1, 0x18, b"x" * 9000)
    data = bytearray(frame(conv, big))
    struct.pack_into("!H", data, 16, 0)  # IPv4 total length 0, as TSO leaves it
    seg = FrameDecoder(1).decode(0, bytes(data))
    assert seg is not None and len(seg.payload) == 9000


def test_non_tcp_fragments_and_garbage_are_counted() -> None:
    conv = Conversation()
    decoder = FrameDecoder(1)
    good = bytearray(frame(conv, _packet()))
    arp = bytes(12) + b"\x08\x06" + bytes(28)
    udp = bytearray(good)
    udp[14 + 9] = 17
    frag = bytearray(good)
    struct.pack_into("!H", frag, 14 + 6, 0x2000)  # more fragments
    for data in (arp, bytes(udp), bytes(frag), good[:30], b"", bytes(good[: 14 + 20 + 10])):
        assert decoder.decode(0, bytes(data)) is None
    stats = decoder.stats
    assert (stats.non_ip, stats.non_tcp, stats.ip_fragments) == (1, 1, 1)
    assert stats.malformed == 3 and stats.segments == 0 and stats.frames == 6


def test_unknown_link_type_is_refused() -> None:
    with pytest.raises(UnsupportedLinkTypeError):
        FrameDecoder(147)


def test_bad_checksums_are_not_a_reason_to_drop() -> None:
    data = bytearray(frame(Conversation(), _packet()))
    data[14 + 10 : 14 + 12] = b"\xde\xad"  # IPv4 header checksum
    data[14 + 20 + 16 : 14 + 20 + 18] = b"\xbe\xef"  # TCP checksum
    seg = FrameDecoder(1).decode(0, bytes(data))
    assert seg is not None and seg.payload == PAYLOAD

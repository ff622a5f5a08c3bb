"""Frame decoding: link types, VLAN stacks, IPv6 extension headers, odd frames."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.capture.decode import ChecksumPolicy, FrameDecoder
from collector.capture.errors import UnsupportedLinkTypeError
from tests.cpu_bound import cpu_bound
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


def test_tso_super_frames_with_zero_ip_length_are_accepted_when_checksums_are_ignored() -> None:
    conv = Conversation()
    big = Packet(1.0, 0, 1, 1, 0x18, b"x" * 9000)
    data = bytearray(frame(conv, big))
    struct.pack_into("!H", data, 16, 0)  # IPv4 total length 0, as TSO leaves it
    seg = FrameDecoder(1, ChecksumPolicy.IGNORE).decode(0, bytes(data))
    assert seg is not None and len(seg.payload) == 9000
    verifying = FrameDecoder(1)
    assert verifying.decode(0, bytes(data)) is None and verifying.stats.bad_length == 1


def test_non_tcp_fragments_and_garbage_are_counted() -> None:
    conv = Conversation()
    decoder = FrameDecoder(1)
    good = bytearray(frame(conv, _packet()))
    arp = bytes(12) + b"\x08\x06" + bytes(28)
    udp = bytearray(good)
    udp[14 + 9] = 17
    for data in (arp, bytes(udp), good[:30], b"", bytes(good[: 14 + 20 + 10])):
        assert decoder.decode(0, bytes(data)) is None
    stats = decoder.stats
    assert (stats.non_ip, stats.non_tcp) == (1, 1)
    assert stats.malformed + stats.bad_length == 3 and stats.segments == 0 and stats.frames == 5


def test_unknown_link_type_is_refused() -> None:
    with pytest.raises(UnsupportedLinkTypeError):
        FrameDecoder(147)


def test_bad_checksums_drop_the_frame_unless_ignored() -> None:
    good = frame(Conversation(), _packet())
    bad_ip = bytearray(good)
    bad_ip[14 + 10 : 14 + 12] = b"\xde\xad"  # IPv4 header checksum
    bad_tcp = bytearray(good)
    bad_tcp[14 + 20 + 16 : 14 + 20 + 18] = b"\xbe\xef"  # TCP checksum
    decoder = FrameDecoder(1)
    assert decoder.decode(0, good) is not None
    assert decoder.decode(0, bytes(bad_ip)) is None and decoder.decode(0, bytes(bad_tcp)) is None
    assert (decoder.stats.bad_ip_checksum, decoder.stats.bad_tcp_checksum) == (1, 1)
    lenient = FrameDecoder(1, ChecksumPolicy.IGNORE)
    for data in (bad_ip, bad_tcp):
        seg = lenient.decode(0, bytes(data))
        assert seg is not None and seg.payload == PAYLOAD


@pytest.mark.parametrize("link", [LINK_ETHERNET, LINK_SLL2, LINK_RAW])
@pytest.mark.parametrize("client", [("10.1.2.3", 5555), ("fd00::1", 5555)])
def test_a_flipped_payload_bit_fails_the_tcp_checksum(link: str, client: tuple[str, int]) -> None:
    server = ("10.1.2.4", 8000) if ":" not in client[0] else ("fd00::2", 8000)
    conv = Conversation(client=client, server=server)
    odd = Packet(1.5, 0, 1234, 99, 0x18, b"odd length payload!")
    data = bytearray(frame(conv, odd, link=link))
    decoder = FrameDecoder({LINK_ETHERNET: 1, LINK_SLL2: 276, LINK_RAW: 101}[link])
    assert decoder.decode(0, bytes(data)) is not None
    data[-1] ^= 0x01
    assert decoder.decode(0, bytes(data)) is None and decoder.stats.bad_tcp_checksum == 1


def test_an_ip_length_past_the_frame_is_refused_and_padding_is_trimmed() -> None:
    data = bytearray(frame(Conversation(), _packet()))
    total = struct.unpack_from("!H", data, 16)[0]
    longer = bytearray(data)
    struct.pack_into("!H", longer, 16, total + 8)
    _fix_ipv4_checksum(longer, 14)
    decoder = FrameDecoder(1)
    assert decoder.decode(0, bytes(longer)) is None and decoder.stats.bad_length == 1
    seg = decoder.decode(0, bytes(data) + b"\x00" * 8)  # trailer past the IP length
    assert seg is not None and seg.payload == PAYLOAD


def test_segments_carry_the_ttl_or_hop_limit() -> None:
    v4 = FrameDecoder(1).decode(0, frame(Conversation(), _packet()))
    conv6 = Conversation(client=("fd00::1", 5555), server=("fd00::2", 8000))
    v6 = FrameDecoder(1).decode(0, frame(conv6, _packet()))
    assert v4 is not None and v6 is not None and v4.ttl == 64 and v6.ttl == 64


def _fix_ipv4_checksum(data: bytearray, offset: int) -> None:
    ihl = (data[offset] & 0x0F) * 4
    struct.pack_into("!H", data, offset + 10, 0)
    total = sum(struct.unpack_from(f"!{ihl // 2}H", data, offset))
    while total > 0xFFFF:
        total = (total & 0xFFFF) + (total >> 16)
    struct.pack_into("!H", data, offset + 10, ~total & 0xFFFF)


def _valid_frames() -> list[bytes]:
    v4, v6 = Conversation(), Conversation(client=("fd00::1", 5555), server=("fd00::2", 8000))
    packet = Packet(1.5, 0, 1234, 99, 0x18, PAYLOAD * 3)
    return [
        frame(conv, packet, link=link) for conv in (v4, v6) for link in (LINK_ETHERNET, LINK_RAW)
    ]


@settings(max_examples=300, deadline=None)
@given(
    base=st.sampled_from(_valid_frames()),
    edits=st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)), max_size=8),
    cut=st.integers(0, 400),
    dlt=st.sampled_from([1, 101]),
)
def test_mutated_frames_never_raise_and_decode_in_bounded_time(
    base: bytes, edits: list[tuple[int, int]], cut: int, dlt: int
) -> None:
    data = bytearray(base[:cut] if cut < len(base) else base)
    for at, value in edits:
        if at < len(data):
            data[at] = value
    with cpu_bound(0.5):
        for policy in ChecksumPolicy:
            decoder = FrameDecoder(dlt, policy)
            seg = decoder.decode(0, bytes(data))
            stats = decoder.stats
            assert stats.frames == 1
            assert (seg is None) != (stats.segments == 1)


def _ones_complement_ok(data: bytes) -> bool:
    """RFC 1071: the 16-bit words (the last padded with a zero byte) sum to 0xFFFF."""
    padded = data + b"\x00" * (len(data) & 1)
    total = sum(struct.unpack(f"!{len(padded) // 2}H", padded))
    while total > 0xFFFF:
        total = (total & 0xFFFF) + (total >> 16)
    return total == 0xFFFF


@settings(max_examples=400, deadline=None)
@given(
    payload=st.binary(max_size=1500),
    edits=st.lists(st.tuples(st.integers(0, 1600), st.integers(0, 0xFFFF)), max_size=3),
)
def test_checksum_verification_agrees_with_rfc_1071(
    payload: bytes, edits: list[tuple[int, int]]
) -> None:
    """Edits that may compensate each other (an IP header word up, a segment word down)
    are caught exactly as the RFC's word-by-word sums catch them."""
    data = bytearray(frame(Conversation(), Packet(1.5, 0, 1234, 99, 0x18, payload)))
    for at, delta in edits:
        word = 14 + at % (len(data) - 14 - 1)
        value = (struct.unpack_from("!H", data, word)[0] + delta) & 0xFFFF
        struct.pack_into("!H", data, word, value)
    ip = bytes(data[14:34])
    total = struct.unpack_from("!H", ip, 2)[0]
    segment = bytes(data[34 : 14 + total])
    pseudo = ip[12:20] + struct.pack("!HH", 6, len(segment))
    decoder = FrameDecoder(1)
    seg = decoder.decode(0, bytes(data))
    if ip[0] == 0x45 and ip[9] == 6 and 40 <= total <= len(data) - 14:
        if _ones_complement_ok(ip) and _ones_complement_ok(pseudo + segment):
            assert decoder.stats.bad_ip_checksum == decoder.stats.bad_tcp_checksum == 0
        else:
            assert seg is None


@pytest.mark.parametrize("payload", [PAYLOAD, PAYLOAD + b"!"], ids=["even", "odd"])
@pytest.mark.parametrize("header_word", [2, 4, 6, 8])  # id, TTL, source, destination
def test_a_bad_ip_header_checksum_compensated_in_the_segment_is_caught(
    payload: bytes, header_word: int
) -> None:
    """An IPv4 header word raised and a segment word lowered by as much: the sum over the
    whole datagram is unchanged, but the header's own sum is not."""
    data = bytearray(frame(Conversation(), Packet(1.5, 0, 1234, 99, 0x18, payload)))
    for at, delta in ((14 + 2 * header_word, 0x0100), (34 + 20, -0x0100)):
        value = (struct.unpack_from("!H", data, at)[0] + delta) % 0x10000
        struct.pack_into("!H", data, at, value)
    decoder = FrameDecoder(1)
    assert decoder.decode(0, bytes(data)) is None
    assert decoder.stats.bad_ip_checksum + decoder.stats.bad_tcp_checksum == 1

"""Link-layer, IP and TCP decoding of captured frames, with struct on the hot path.

A frame goes in, a `TcpSegment` (or None) comes out; anything that is not a
TCP segment is counted by reason in `DecodeStats` and dropped. Checksums are
never validated: copies taken on egress (mirror ports, TSO/GSO) carry unfilled
checksums, and a tap cannot ask for a retransmission anyway. Frames larger
than any MTU (offload super-packets) are accepted as they are; an IP length
of zero (TSO) or one past the captured bytes means "up to the end of the frame".
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import NamedTuple

from collector.capture.errors import UnsupportedLinkTypeError
from collector.capture.linktypes import (
    DLT_EN10MB,
    DLT_IPV4,
    DLT_IPV6,
    DLT_LINUX_SLL,
    DLT_LINUX_SLL2,
    DLT_NULL,
    DLT_RAW,
    RAW_ALIASES,
    SUPPORTED_LINKTYPES,
)

ETH_IPV4 = 0x0800
ETH_IPV6 = 0x86DD
VLAN_TPIDS = frozenset({0x8100, 0x88A8, 0x9100})
IPPROTO_TCP = 6
# IPv6 extension headers walked to reach TCP: hop-by-hop, routing, destination options.
_IPV6_SKIPPABLE = frozenset({0, 43, 60})
_IPV6_FRAGMENT = 44
_IPV6_AH = 51
# BSD loopback address families that mean IPv6 on the platforms that write DLT_NULL.
_AF_INET = 2
_AF_INET6 = frozenset({10, 24, 28, 30})

TCP_FIN = 0x01
TCP_SYN = 0x02
TCP_RST = 0x04
TCP_PSH = 0x08
TCP_ACK = 0x10

_U16 = struct.Struct("!H")
_TCP = struct.Struct("!HHIIBB")
_IPV4_LEN_FRAG = struct.Struct("!HHHBB")
# Ethernet + option-less IPv4 + TCP in one unpack (the common case): version/IHL, total
# length, flags/fragment offset, protocol, addresses, then the TCP header.
_ETH_IPV4_TCP = struct.Struct("!12xHBxHxxHxBxx4s4sHHIIBB")
_SLL2_PROTO = struct.Struct("!H")


class TcpSegment(NamedTuple):
    """One TCP segment as seen on the wire (a named tuple: built once per packet)."""

    ts_ns: int
    src: bytes
    dst: bytes
    sport: int
    dport: int
    seq: int
    ack: int
    flags: int
    payload: bytes
    vlans: tuple[int, ...]


# Named tuples are built with tuple.__new__ on hot paths: half the cost of calling the class.
_new_segment = tuple.__new__


@dataclass(slots=True)
class DecodeStats:
    """Why frames were not turned into TCP segments, counted."""

    frames: int = 0
    segments: int = 0
    non_ip: int = 0
    non_tcp: int = 0
    ip_fragments: int = 0
    malformed: int = 0


class FrameDecoder:
    """Decodes frames of one link type into TCP segments."""

    def __init__(self, linktype: int) -> None:
        if linktype not in SUPPORTED_LINKTYPES:
            raise UnsupportedLinkTypeError(f"link type {linktype} is not supported")
        self.linktype = DLT_RAW if linktype in RAW_ALIASES else linktype
        self.stats = DecodeStats()

    def decode(self, ts_ns: int, frame: bytes, vlans: tuple[int, ...] = ()) -> TcpSegment | None:
        """The TCP segment inside `frame`, or None (counted in `stats`).

        `vlans` carries tags the kernel already stripped (live capture with VLAN
        offload); tags still in the frame are appended after them.
        """
        stats = self.stats
        stats.frames += 1
        linktype = self.linktype
        size = len(frame)
        if linktype == DLT_EN10MB and size >= 54:
            (
                ethertype,
                ver_ihl,
                total,
                frag,
                proto,
                src,
                dst,
                sport,
                dport,
                seq,
                ack,
                off,
                flags,
            ) = _ETH_IPV4_TCP.unpack_from(frame, 0)
            if (
                ethertype == ETH_IPV4
                and ver_ihl == 0x45
                and proto == IPPROTO_TCP
                and not frag & 0x3FFF
                and (total == 0 or total >= 40)
            ):
                end = 14 + total if 0 < total <= size - 14 else size
                data = 34 + (off >> 4) * 4
                if data >= 54 and data <= end:
                    stats.segments += 1
                    return _new_segment(
                        TcpSegment,
                        (ts_ns, src, dst, sport, dport, seq, ack, flags, frame[data:end], vlans),
                    )
        try:
            if linktype == DLT_EN10MB:
                ethertype = _U16.unpack_from(frame, 12)[0]
                offset = 14
            elif linktype == DLT_LINUX_SLL:
                ethertype = _U16.unpack_from(frame, 14)[0]
                offset = 16
            elif linktype == DLT_LINUX_SLL2:
                ethertype = _SLL2_PROTO.unpack_from(frame, 0)[0]
                offset = 20
            elif linktype == DLT_RAW:
                ethertype = ETH_IPV4 if frame[0] >> 4 == 4 else ETH_IPV6
                offset = 0
            elif linktype == DLT_IPV4:
                ethertype, offset = ETH_IPV4, 0
            elif linktype == DLT_IPV6:
                ethertype, offset = ETH_IPV6, 0
            else:
                family = (
                    int.from_bytes(frame[:4], "little")
                    if linktype == DLT_NULL
                    else int.from_bytes(frame[:4], "big")
                )
                if family == _AF_INET:
                    ethertype = ETH_IPV4
                elif family in _AF_INET6:
                    ethertype = ETH_IPV6
                else:
                    stats.non_ip += 1
                    return None
                offset = 4
            if ethertype in VLAN_TPIDS:
                tags = list(vlans)
                while ethertype in VLAN_TPIDS:
                    tags.append(_U16.unpack_from(frame, offset)[0] & 0x0FFF)
                    ethertype = _U16.unpack_from(frame, offset + 2)[0]
                    offset += 4
                vlans = tuple(tags)
            if ethertype == ETH_IPV4:
                ihl = (frame[offset] & 0x0F) * 4
                total, _ident, frag, _ttl, proto = _IPV4_LEN_FRAG.unpack_from(frame, offset + 2)
                if frag & 0x3FFF:
                    stats.ip_fragments += 1
                    return None
                if proto != IPPROTO_TCP:
                    stats.non_tcp += 1
                    return None
                if ihl < 20 or (total and total < ihl + 20):
                    stats.malformed += 1
                    return None
                end = offset + total if total and offset + total <= size else size
                src = frame[offset + 12 : offset + 16]
                dst = frame[offset + 16 : offset + 20]
                tcp = offset + ihl
            elif ethertype == ETH_IPV6:
                plen = _U16.unpack_from(frame, offset + 4)[0]
                nxt = frame[offset + 6]
                src = frame[offset + 8 : offset + 24]
                dst = frame[offset + 24 : offset + 40]
                end = offset + 40 + plen if plen and offset + 40 + plen <= size else size
                tcp = offset + 40
                while nxt != IPPROTO_TCP:
                    if nxt in _IPV6_SKIPPABLE:
                        nxt, hlen = frame[tcp], (frame[tcp + 1] + 1) * 8
                    elif nxt == _IPV6_FRAGMENT:
                        if _U16.unpack_from(frame, tcp + 2)[0] & 0xFFF9:
                            stats.ip_fragments += 1
                            return None
                        nxt, hlen = frame[tcp], 8
                    elif nxt == _IPV6_AH:
                        nxt, hlen = frame[tcp], (frame[tcp + 1] + 2) * 4
                    else:
                        stats.non_tcp += 1
                        return None
                    tcp += hlen
            else:
                stats.non_ip += 1
                return None
            sport, dport, seq, ack, off, flags = _TCP.unpack_from(frame, tcp)
        except (struct.error, IndexError):
            stats.malformed += 1
            return None
        data = tcp + (off >> 4) * 4
        if data < tcp + 20 or data > end or len(src) != len(dst):
            stats.malformed += 1
            return None
        stats.segments += 1
        return _new_segment(
            TcpSegment, (ts_ns, src, dst, sport, dport, seq, ack, flags, frame[data:end], vlans)
        )

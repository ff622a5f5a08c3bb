"""Link-layer, IP and TCP decoding of captured frames, with struct on the hot path.

A frame goes in, a `TcpSegment` (or None) comes out; anything that is not a
TCP segment is counted by reason in `DecodeStats` and dropped. The policies
against a prover that sends packets only the tap accepts (Ptacek & Newsham's
insertion attacks) are decided here, before any byte reaches a stream:

- **Checksums** (`ChecksumPolicy.VERIFY`, the default): a frame whose IPv4
  header checksum or TCP checksum is wrong is dropped and counted
  (`bad_ip_checksum`, `bad_tcp_checksum`): the client's stack drops it too.
  The sums are taken as one big integer modulo 0xFFFF (2**16 is 1 modulo
  0xFFFF, so that is the ones'-complement sum of the 16-bit words), which
  keeps verification to a few C calls per packet. `IGNORE` is only for
  captures where offload leaves checksums unfilled: capturing on the sending
  host (the demo on `lo`), or egress copies of a tc mirror.
- **IP lengths** (with VERIFY): the IP total length (IPv6 payload length)
  must fit inside the captured frame; bytes past it are link padding and
  trimmed, as the receiving host trims them. A length of zero or one past the
  frame is counted as `bad_length` and dropped. With IGNORE both mean "up to
  the end of the frame", as TSO/GSO super-frames on the sending host carry.
- **TTL / hop limit** is carried on each segment; the reassembler compares it
  with the value its direction established (see `collector.tcp_reassembly`).
- **Fragments** of TCP datagrams (IPv4, and IPv6 fragment headers) are
  reassembled by `collector.capture.fragments` (bounded, overlaps drop the
  datagram); the TCP checksum is verified over the whole datagram.

Frames larger than any MTU (offload super-packets) are accepted as they are.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import NamedTuple

from collector.capture.errors import UnsupportedLinkTypeError
from collector.capture.fragments import (
    Fragment,
    FragmentLimits,
    FragmentOutcome,
    FragmentReassembler,
)
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
_U32 = struct.Struct("!I")
_TCP = struct.Struct("!HHIIBB")
_IPV4_LEN_FRAG = struct.Struct("!HHHBB")
# Ethernet + option-less IPv4 + TCP in one unpack (the common case): version/IHL, total
# length, flags/fragment offset, TTL, protocol, addresses, then the TCP header.
_ETH_IPV4_TCP = struct.Struct("!12xHBxHxxHBBxx4s4sHHIIBB")
_SLL2_PROTO = struct.Struct("!H")
_IP_MORE_FRAGMENTS = 0x2000
_IP_OFFSET = 0x1FFF
_SUM_MODULUS = 0xFFFF


class ChecksumPolicy(enum.Enum):
    """Whether IPv4 header and TCP checksums decide if a frame is a segment."""

    VERIFY = "verify"
    IGNORE = "ignore"


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
    #: The IPv4 TTL or IPv6 hop limit as the tap saw it.
    ttl: int


# Named tuples are built with tuple.__new__ on hot paths: half the cost of calling the class.
_new_segment = tuple.__new__


@dataclass(slots=True)
class DecodeStats:
    """Why frames were not turned into TCP segments, counted."""

    frames: int = 0
    segments: int = 0
    non_ip: int = 0
    non_tcp: int = 0
    #: Fragments of TCP datagrams received (each also counted below by what became of it).
    ip_fragments: int = 0
    fragments_reassembled: int = 0
    fragment_conflicts: int = 0
    fragments_over_cap: int = 0
    fragments_expired: int = 0
    fragments_evicted: int = 0
    malformed: int = 0
    bad_ip_checksum: int = 0
    bad_tcp_checksum: int = 0
    bad_length: int = 0


class FrameDecoder:
    """Decodes frames of one link type into TCP segments."""

    def __init__(
        self,
        linktype: int,
        checksums: ChecksumPolicy = ChecksumPolicy.VERIFY,
        fragments: FragmentLimits | None = None,
    ) -> None:
        if linktype not in SUPPORTED_LINKTYPES:
            raise UnsupportedLinkTypeError(f"link type {linktype} is not supported")
        self.linktype = DLT_RAW if linktype in RAW_ALIASES else linktype
        self.verify = checksums is ChecksumPolicy.VERIFY
        self.stats = DecodeStats()
        self.fragments = FragmentReassembler(fragments)

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
                ttl,
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
                and 40 <= total <= size - 14
            ):
                end = 14 + total
                data = 34 + (off >> 4) * 4
                if data >= 54 and data <= end:
                    if self.verify:
                        # The datagram as one integer: its top 20 bytes are the IPv4
                        # header, whose words must sum to 0; then the whole sums to the
                        # segment alone (times 256 when padded to whole words), and the
                        # header's last 8 bytes are the pseudo-header's addresses.
                        # 0xFFFF is _SUM_MODULUS, a constant instead of a global lookup.
                        datagram = int.from_bytes(frame[14:end])
                        header = datagram >> ((total - 20) << 3)
                        if header % 0xFFFF:
                            return self._slow(ts_ns, frame, vlans)
                        segment = datagram % 0xFFFF
                        if total & 1:
                            segment <<= 8
                        addresses = header & 0xFFFFFFFFFFFFFFFF
                        if (segment + addresses + IPPROTO_TCP + total - 20) % 0xFFFF:
                            return self._slow(ts_ns, frame, vlans)
                    stats.segments += 1
                    return _new_segment(
                        TcpSegment,
                        (
                            ts_ns,
                            src,
                            dst,
                            sport,
                            dport,
                            seq,
                            ack,
                            flags,
                            frame[data:end],
                            vlans,
                            ttl,
                        ),
                    )
        return self._slow(ts_ns, frame, vlans)

    def _slow(self, ts_ns: int, frame: bytes, vlans: tuple[int, ...]) -> TcpSegment | None:
        """Every frame the one-unpack path does not take, and every one it doubts."""
        stats = self.stats
        linktype = self.linktype
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
                return self._ipv4(ts_ns, frame, offset, vlans)
            if ethertype == ETH_IPV6:
                return self._ipv6(ts_ns, frame, offset, vlans)
            stats.non_ip += 1
            return None
        except (struct.error, IndexError):
            stats.malformed += 1
            return None

    def _ip_end(self, offset: int, length: int, size: int) -> int:
        """Where the IP datagram starting at `offset` with `length` ends, or -1 (counted)."""
        if length and offset + length <= size:
            return offset + length
        if self.verify:
            self.stats.bad_length += 1
            return -1
        return size

    def _ipv4(
        self, ts_ns: int, frame: bytes, offset: int, vlans: tuple[int, ...]
    ) -> TcpSegment | None:
        stats = self.stats
        ihl = (frame[offset] & 0x0F) * 4
        total, ident, frag, ttl, proto = _IPV4_LEN_FRAG.unpack_from(frame, offset + 2)
        if proto != IPPROTO_TCP:
            stats.non_tcp += 1
            return None
        fragment = frag & 0x3FFF
        if (
            ihl < 20
            or len(frame) < offset + ihl
            or (total and total < ihl + (0 if fragment else 20))
        ):
            stats.malformed += 1
            return None
        end = self._ip_end(offset, total, len(frame))
        if end < 0:
            return None
        if self.verify and int.from_bytes(frame[offset : offset + ihl]) % _SUM_MODULUS:
            stats.bad_ip_checksum += 1
            return None
        src = frame[offset + 12 : offset + 16]
        dst = frame[offset + 16 : offset + 20]
        if not fragment:
            return self._tcp(
                frame, offset + ihl, end, ts_ns=ts_ns, src=src, dst=dst, ttl=ttl, vlans=vlans
            )
        stats.ip_fragments += 1
        datagram = self._fragment(
            Fragment(
                (4, src, dst, ident, vlans),
                ts_ns,
                (frag & _IP_OFFSET) * 8,
                bool(frag & _IP_MORE_FRAGMENTS),
                ttl,
                frame[offset + ihl : end],
            )
        )
        if datagram is None:
            return None
        return self._tcp(
            datagram, 0, len(datagram), ts_ns=ts_ns, src=src, dst=dst, ttl=ttl, vlans=vlans
        )

    def _ipv6(
        self, ts_ns: int, frame: bytes, offset: int, vlans: tuple[int, ...]
    ) -> TcpSegment | None:
        stats = self.stats
        plen = _U16.unpack_from(frame, offset + 4)[0]
        nxt = frame[offset + 6]
        hop_limit = frame[offset + 7]
        src = frame[offset + 8 : offset + 24]
        dst = frame[offset + 24 : offset + 40]
        if len(dst) != 16:
            stats.malformed += 1
            return None
        end = self._ip_end(offset + 40, plen, len(frame))
        if end < 0:
            return None
        buf: bytes = frame
        pos = offset + 40
        fragmented = False
        while nxt != IPPROTO_TCP:
            if nxt in _IPV6_SKIPPABLE:
                nxt, hlen = buf[pos], (buf[pos + 1] + 1) * 8
            elif nxt == _IPV6_AH:
                nxt, hlen = buf[pos], (buf[pos + 1] + 2) * 4
            elif nxt == _IPV6_FRAGMENT and not fragmented:
                nxt = buf[pos]
                field = _U16.unpack_from(buf, pos + 2)[0]
                if not field & 0xFFF9:
                    # An atomic fragment (offset 0, no more): the payload is all there.
                    pos += 8
                    fragmented = True
                    continue
                if nxt != IPPROTO_TCP and nxt not in _IPV6_SKIPPABLE:
                    stats.non_tcp += 1
                    return None
                stats.ip_fragments += 1
                ident = _U32.unpack_from(buf, pos + 4)[0]
                datagram = self._fragment(
                    Fragment(
                        (6, src, dst, ident, vlans),
                        ts_ns,
                        field & 0xFFF8,
                        bool(field & 1),
                        hop_limit,
                        buf[pos + 8 : end],
                    )
                )
                if datagram is None:
                    return None
                buf, pos, end, fragmented = datagram, 0, len(datagram), True
                continue
            else:
                stats.non_tcp += 1
                return None
            pos += hlen
            if pos > end:
                stats.malformed += 1
                return None
        return self._tcp(buf, pos, end, ts_ns=ts_ns, src=src, dst=dst, ttl=hop_limit, vlans=vlans)

    def _fragment(self, fragment: Fragment) -> bytes | None:
        """The reassembled payload once `data` completes its datagram, else None (counted)."""
        stats = self.stats
        reassembler = self.fragments
        outcome, datagram = reassembler.add(fragment)
        stats.fragments_expired = reassembler.expired
        stats.fragments_evicted = reassembler.evicted
        if outcome is FragmentOutcome.CONFLICT:
            stats.fragment_conflicts += 1
        elif outcome is FragmentOutcome.OVER_CAP:
            stats.fragments_over_cap += 1
        elif outcome is FragmentOutcome.MALFORMED:
            stats.malformed += 1
        if datagram is None:
            return None
        stats.fragments_reassembled += 1
        return datagram.payload

    def _tcp(
        self,
        buf: bytes,
        tcp: int,
        end: int,
        *,
        ts_ns: int,
        src: bytes,
        dst: bytes,
        ttl: int,
        vlans: tuple[int, ...],
    ) -> TcpSegment | None:
        """The segment whose TCP header starts at `tcp` in `buf` and which ends at `end`."""
        stats = self.stats
        try:
            sport, dport, seq, ack, off, flags = _TCP.unpack_from(buf, tcp)
        except struct.error:
            stats.malformed += 1
            return None
        data = tcp + (off >> 4) * 4
        if data < tcp + 20 or data > end:
            stats.malformed += 1
            return None
        if self.verify:
            length = end - tcp
            pseudo = int.from_bytes(src) + int.from_bytes(dst) + IPPROTO_TCP + length
            if (pseudo + (int.from_bytes(buf[tcp:end]) << ((length & 1) << 3))) % _SUM_MODULUS:
                stats.bad_tcp_checksum += 1
                return None
        stats.segments += 1
        return _new_segment(
            TcpSegment,
            (ts_ns, src, dst, sport, dport, seq, ack, flags, buf[data:end], vlans, ttl),
        )

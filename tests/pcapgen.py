"""Builds TCP conversations packet by packet and writes them as pcap/pcapng files.

IP and TCP headers are built with dpkt (an implementation independent of the
collector's decoder) and files are written with dpkt's pcap and pcapng writers.
A `Conversation` tracks both sequence spaces so tests describe traffic
("client sends this request in 3 segments") and then impair the packet list
(drop, reorder, duplicate, overlap) before writing it.
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import dpkt

CLIENT = 0
SERVER = 1

FIN, SYN, RST, PSH, ACK = 0x01, 0x02, 0x04, 0x08, 0x10

LINK_ETHERNET = "ethernet"
LINK_SLL = "sll"
LINK_SLL2 = "sll2"
LINK_RAW = "raw"
_DLT = {LINK_ETHERNET: 1, LINK_SLL: 113, LINK_SLL2: 276, LINK_RAW: 101}


@dataclass(frozen=True)
class Packet:
    """One TCP segment of a conversation, before link-layer framing."""

    ts: float
    direction: int
    seq: int
    ack: int
    flags: int
    payload: bytes = b""


@dataclass
class Conversation:
    """Both sides of one TCP connection; methods append packets in order."""

    client: tuple[str, int] = ("10.0.0.1", 40000)
    server: tuple[str, int] = ("10.0.0.2", 8000)
    client_isn: int = 1_000
    server_isn: int = 500_000
    ts: float = 1_700_000_000.0
    step: float = 0.001
    mss: int = 1448

    def __post_init__(self) -> None:
        self.packets: list[Packet] = []
        self.next_seq = [self.client_isn, self.server_isn]

    def _tick(self) -> float:
        self.ts += self.step
        return self.ts

    def _ack_for(self, direction: int) -> int:
        return self.next_seq[1 - direction] & 0xFFFFFFFF

    def handshake(self) -> Conversation:
        self.packets.append(Packet(self._tick(), CLIENT, self.client_isn & 0xFFFFFFFF, 0, SYN))
        self.next_seq[CLIENT] += 1
        self.packets.append(
            Packet(
                self._tick(), SERVER, self.server_isn & 0xFFFFFFFF, self._ack_for(SERVER), SYN | ACK
            )
        )
        self.next_seq[SERVER] += 1
        self.packets.append(
            Packet(
                self._tick(), CLIENT, self.next_seq[CLIENT] & 0xFFFFFFFF, self._ack_for(CLIENT), ACK
            )
        )
        return self

    def send(
        self, direction: int, data: bytes, *, sizes: Sequence[int] | None = None, ack: bool = True
    ) -> list[Packet]:
        """Send `data` in segments of `sizes` (default: MSS-sized); returns the new packets."""
        out: list[Packet] = []
        pos = 0
        chunks: list[int] = list(sizes) if sizes else []
        while pos < len(data):
            size = chunks.pop(0) if chunks else self.mss
            piece = data[pos : pos + size]
            packet = Packet(
                self._tick(),
                direction,
                self.next_seq[direction] & 0xFFFFFFFF,
                self._ack_for(direction),
                PSH | ACK,
                piece,
            )
            out.append(packet)
            self.next_seq[direction] += len(piece)
            pos += len(piece)
        self.packets.extend(out)
        if ack and out:
            self.packets.append(
                Packet(
                    self._tick(),
                    1 - direction,
                    self.next_seq[1 - direction] & 0xFFFFFFFF,
                    self._ack_for(1 - direction),
                    ACK,
                )
            )
        return out

    def fin(self, direction: int) -> Packet:
        packet = Packet(
            self._tick(),
            direction,
            self.next_seq[direction] & 0xFFFFFFFF,
            self._ack_for(direction),
            FIN | ACK,
        )
        self.next_seq[direction] += 1
        self.packets.append(packet)
        return packet

    def close(self) -> Conversation:
        """FIN from the client, FIN from the server, final ACK."""
        self.fin(CLIENT)
        self.fin(SERVER)
        self.packets.append(
            Packet(
                self._tick(), CLIENT, self.next_seq[CLIENT] & 0xFFFFFFFF, self._ack_for(CLIENT), ACK
            )
        )
        return self

    def rst(self, direction: int) -> Packet:
        packet = Packet(self._tick(), direction, self.next_seq[direction] & 0xFFFFFFFF, 0, RST)
        self.packets.append(packet)
        return packet

    def exchange(
        self,
        request: bytes,
        response: bytes,
        *,
        request_sizes: Sequence[int] | None = None,
        response_sizes: Sequence[int] | None = None,
    ) -> Conversation:
        self.send(CLIENT, request, sizes=request_sizes)
        self.send(SERVER, response, sizes=response_sizes)
        return self


def shift(packets: Iterable[Packet], seconds: float) -> list[Packet]:
    return [replace(p, ts=p.ts + seconds) for p in packets]


def retimed(packets: Sequence[Packet], start: float, step: float = 0.001) -> list[Packet]:
    """The same packets in the given order, with increasing capture times."""
    return [replace(p, ts=start + i * step) for i, p in enumerate(packets)]


def _ip_bytes(address: str) -> bytes:
    return ipaddress.ip_address(address).packed


def tcp_ip_bytes(conv: Conversation, packet: Packet) -> bytes:
    """The IP packet (v4 or v6 by the conversation's addresses) carrying `packet`."""
    src, dst = (
        (conv.client, conv.server) if packet.direction == CLIENT else (conv.server, conv.client)
    )
    tcp = dpkt.tcp.TCP(
        sport=src[1],
        dport=dst[1],
        seq=packet.seq,
        ack=packet.ack,
        flags=packet.flags,
        win=65535,
        data=packet.payload,
    )
    if ipaddress.ip_address(src[0]).version == 4:
        ip = dpkt.ip.IP(
            src=_ip_bytes(src[0]), dst=_ip_bytes(dst[0]), p=dpkt.ip.IP_PROTO_TCP, ttl=64, data=tcp
        )
        ip.len = 20 + len(bytes(tcp))
        return bytes(ip)
    ip6 = dpkt.ip6.IP6(
        src=_ip_bytes(src[0]), dst=_ip_bytes(dst[0]), nxt=dpkt.ip.IP_PROTO_TCP, hlim=64, data=tcp
    )
    ip6.plen = len(bytes(tcp))
    return bytes(ip6)


def frame(
    conv: Conversation,
    packet: Packet,
    *,
    link: str = LINK_ETHERNET,
    vlans: Sequence[int] = (),
    pad_to: int = 0,
) -> bytes:
    """The frame for `packet`: Ethernet (optional 802.1Q/QinQ tags), SLL, SLL2 or raw IP."""
    ip = tcp_ip_bytes(conv, packet)
    ethertype = 0x0800 if ip[0] >> 4 == 4 else 0x86DD
    if link == LINK_ETHERNET:
        src_mac = (
            b"\x02\x00\x00\x00\x00\x01"
            if packet.direction == CLIENT
            else b"\x02\x00\x00\x00\x00\x02"
        )
        dst_mac = (
            b"\x02\x00\x00\x00\x00\x02"
            if packet.direction == CLIENT
            else b"\x02\x00\x00\x00\x00\x01"
        )
        tags = b""
        for i, vid in enumerate(vlans):
            tpid = 0x88A8 if i == 0 and len(vlans) > 1 else 0x8100
            tags += struct.pack("!HH", tpid, vid)
        out = dst_mac + src_mac + tags + struct.pack("!H", ethertype) + ip
        return out.ljust(pad_to, b"\x00")
    if link == LINK_SLL:
        return struct.pack("!HHH8sH", 0, 1, 6, b"\x02\x00\x00\x00\x00\x01\x00\x00", ethertype) + ip
    if link == LINK_SLL2:
        return (
            struct.pack("!HHIHBB8s", ethertype, 0, 1, 1, 0, 6, b"\x02\x00\x00\x00\x00\x01\x00\x00")
            + ip
        )
    if link == LINK_RAW:
        return ip
    raise ValueError(f"unknown link {link}")


def write_pcap(
    path: Path,
    conv: Conversation,
    packets: Sequence[Packet] | None = None,
    *,
    link: str = LINK_ETHERNET,
    vlans: Sequence[int] = (),
    nano: bool = False,
) -> Path:
    with path.open("wb") as out:
        writer = dpkt.pcap.Writer(out, snaplen=262144, linktype=_DLT[link], nano=nano)
        for packet in conv.packets if packets is None else packets:
            writer.writepkt(frame(conv, packet, link=link, vlans=vlans), ts=packet.ts)
    return path


def write_pcapng(
    path: Path,
    conv: Conversation,
    packets: Sequence[Packet] | None = None,
    *,
    link: str = LINK_ETHERNET,
    vlans: Sequence[int] = (),
) -> Path:
    with path.open("wb") as out:
        writer = dpkt.pcapng.Writer(out, snaplen=262144, linktype=_DLT[link])
        for packet in conv.packets if packets is None else packets:
            writer.writepkt(frame(conv, packet, link=link, vlans=vlans), ts=packet.ts)
    return path


def write_frames(path: Path, frames: Iterable[tuple[float, bytes]], *, linktype: int = 1) -> Path:
    """Write ready-made frames (several conversations merged, odd frames) to a pcap file."""
    with path.open("wb") as out:
        writer = dpkt.pcap.Writer(out, snaplen=262144, linktype=linktype)
        for ts, data in frames:
            writer.writepkt(data, ts=ts)
    return path


def merged_frames(
    conversations: Sequence[tuple[Conversation, Sequence[Packet]]],
    *,
    link: str = LINK_ETHERNET,
    vlans: Sequence[int] = (),
) -> list[tuple[float, bytes]]:
    """Frames of several conversations interleaved by capture time."""
    frames = [
        (packet.ts, frame(conv, packet, link=link, vlans=vlans))
        for conv, packets in conversations
        for packet in packets
    ]
    frames.sort(key=lambda item: item[0])
    return frames

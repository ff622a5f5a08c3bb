"""Live capture through an AF_PACKET socket with a PACKET_MMAP TPACKET_V3 ring.

The socket is SOCK_DGRAM, so every frame starts at its network header whatever
the interface's link layer (Ethernet, loopback, veth, tun, or "any": all
interfaces): frames are handed out as raw IP (`DLT_RAW`), and the BPF filter
is compiled for raw IP. VLAN tags, which the kernel strips before packet
sockets see them, come back from the ring's per-packet `tp_vlan_tci`.

Loopback delivers every packet twice (as sent and as received): copies marked
PACKET_OUTGOING are dropped on loopback only. Promiscuous mode (for mirror
ports and taps) is a PACKET_ADD_MEMBERSHIP; PACKET_FANOUT (hash mode keeps a
connection in one socket) spreads load over several workers. Kernel counters
(PACKET_STATISTICS, which reset on every read) are accumulated in `stats()`.
"""

from __future__ import annotations

import mmap
import select
import socket
import struct
from dataclasses import dataclass

from collector.capture.bpf import attach_filter, compile_filter
from collector.capture.errors import LiveCaptureError
from collector.capture.linktypes import DLT_RAW

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_ADD_MEMBERSHIP = 1
PACKET_RX_RING = 5
PACKET_STATISTICS = 6
PACKET_VERSION = 10
PACKET_FANOUT = 18
TPACKET_V3 = 2
PACKET_MR_PROMISC = 1
PACKET_FANOUT_HASH = 0
PACKET_OUTGOING = 4
TP_STATUS_KERNEL = 0
TP_STATUS_USER = 1
TP_STATUS_VLAN_VALID = 1 << 4
_FRAME_SIZE = 2048
_BLOCK_TIMEOUT_MS = 10

# struct tpacket_block_desc: version, offset_to_priv, then tpacket_hdr_v1:
# block_status, num_pkts, offset_to_first_pkt.
_BLOCK = struct.Struct("=IIIII")
# struct tpacket3_hdr: tp_next_offset, tp_sec, tp_nsec, tp_snaplen, tp_len, tp_status,
# tp_mac, tp_net, hv1.tp_rxhash, hv1.tp_vlan_tci; struct sockaddr_ll follows at 48.
_PACKET = struct.Struct("=IIIIIIHHII")
_SLL_IFINDEX = 48 + 4
_SLL_PKTTYPE = 48 + 10


@dataclass(frozen=True, slots=True)
class KernelStats:
    """Totals since the socket was opened."""

    packets: int
    drops: int
    freeze_count: int


class LiveCapture:
    """One AF_PACKET ring on `interface` ("any" for all interfaces)."""

    linktype = DLT_RAW

    def __init__(
        self,
        interface: str,
        *,
        bpf_filter: str = "",
        promiscuous: bool = True,
        snaplen: int = 262_144,
        fanout_group: int = 0,
        block_bytes: int = 4 * 1024 * 1024,
        blocks: int = 64,
    ) -> None:
        self.interface = interface
        self._loopback = _index_of("lo")
        try:
            self._ifindex = 0 if interface == "any" else socket.if_nametoindex(interface)
        except OSError as exc:
            raise LiveCaptureError(f"no interface {interface!r}") from exc
        block_bytes = max(block_bytes, snaplen + 4096)
        block_bytes = (block_bytes + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE
        try:
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(ETH_P_ALL))
        except PermissionError as exc:
            raise LiveCaptureError("live capture needs root or CAP_NET_RAW") from exc
        self._sock = sock
        try:
            if bpf_filter:
                attach_filter(sock, compile_filter(bpf_filter, "RAW"))
            sock.setsockopt(SOL_PACKET, PACKET_VERSION, TPACKET_V3)
            request = struct.pack(
                "=IIIIIII",
                block_bytes,
                blocks,
                _FRAME_SIZE,
                block_bytes * blocks // _FRAME_SIZE,
                _BLOCK_TIMEOUT_MS,
                0,
                0,
            )
            sock.setsockopt(SOL_PACKET, PACKET_RX_RING, request)
            self._ring = mmap.mmap(
                sock.fileno(),
                block_bytes * blocks,
                mmap.MAP_SHARED,
                mmap.PROT_READ | mmap.PROT_WRITE,
            )
            if self._ifindex:
                sock.bind((interface, ETH_P_ALL))
                if promiscuous:
                    membership = struct.pack("=iHH8s", self._ifindex, PACKET_MR_PROMISC, 0, b"")
                    sock.setsockopt(SOL_PACKET, PACKET_ADD_MEMBERSHIP, membership)
            if fanout_group:
                sock.setsockopt(
                    SOL_PACKET, PACKET_FANOUT, fanout_group | (PACKET_FANOUT_HASH << 16)
                )
        except OSError as exc:
            sock.close()
            raise LiveCaptureError(f"cannot set up capture on {interface!r}: {exc}") from exc
        self._block_bytes = block_bytes
        self._blocks = blocks
        self._next = 0
        self._poll = select.poll()
        self._poll.register(sock.fileno(), select.POLLIN | select.POLLERR)
        self._packets = 0
        self._drops = 0
        self._freezes = 0
        self.outgoing_dropped = 0

    def read(self, timeout_s: float) -> list[tuple[int, bytes, tuple[int, ...]]]:
        """Frames of every ready block, or [] after `timeout_s` without one."""
        ring = self._ring
        out: list[tuple[int, bytes, tuple[int, ...]]] = []
        base = self._next * self._block_bytes
        if not _BLOCK.unpack_from(ring, base)[2] & TP_STATUS_USER:
            self._poll.poll(int(timeout_s * 1000))
        loopback = self._loopback
        unpack = _PACKET.unpack_from
        while True:
            base = self._next * self._block_bytes
            _version, _priv, status, count, first = _BLOCK.unpack_from(ring, base)
            if not status & TP_STATUS_USER:
                break
            offset = base + first
            for _ in range(count):
                nxt, sec, nsec, snaplen, _len, pstatus, mac, _net, _hash, tci = unpack(ring, offset)
                if (
                    ring[offset + _SLL_PKTTYPE] == PACKET_OUTGOING
                    and struct.unpack_from("=i", ring, offset + _SLL_IFINDEX)[0] == loopback
                ):
                    self.outgoing_dropped += 1
                else:
                    start = offset + mac
                    vlans = (tci & 0x0FFF,) if pstatus & TP_STATUS_VLAN_VALID else ()
                    out.append((sec * 1_000_000_000 + nsec, ring[start : start + snaplen], vlans))
                offset += nxt
            struct.pack_into("=I", ring, base + 8, TP_STATUS_KERNEL)
            self._next = (self._next + 1) % self._blocks
        return out

    def stats(self) -> KernelStats:
        """Kernel packet and drop counts so far (PACKET_STATISTICS, accumulated)."""
        raw = self._sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 12)
        packets, drops, freezes = struct.unpack("=III", raw)
        self._packets += packets
        self._drops += drops
        self._freezes += freezes
        return KernelStats(self._packets, self._drops, self._freezes)

    def close(self) -> None:
        self._ring.close()
        self._sock.close()


def _index_of(name: str) -> int:
    try:
        return socket.if_nametoindex(name)
    except OSError:
        return -1

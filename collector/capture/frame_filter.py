"""The capture filter of `collector run`, applied to the frames of a capture file.

`run` attaches `[capture] filter` to its AF_PACKET socket compiled for raw IP
(`bpf.compile_filter(expression, "RAW")`): the kernel runs it on the network-layer
packet, with VLAN tags already taken out of the frame. `FrameFilter` runs that same
program on the same bytes of each file frame (its link-layer header and any
802.1Q/802.1ad tags skipped), with libpcap's `bpf_filter` semantics, so a file
replays exactly the packets a live capture with that filter would have read. The
program runs as Python compiled from it once per network-layer offset
(`bpf_python`: no foreign call per frame), or, for a program that compiler does
not take, in libpcap's own interpreter. Frames whose link layer carries no IP
packet do not match.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import struct
from collections.abc import Sequence

from collector.capture.bpf import Instruction, compile_filter
from collector.capture.bpf_python import (
    CompiledFilter,
    UncompilableProgramError,
    compile_program,
)
from collector.capture.errors import CaptureError
from collector.capture.linktypes import (
    DLT_EN10MB,
    DLT_LINUX_SLL,
    DLT_LINUX_SLL2,
    DLT_LOOP,
    DLT_NULL,
)

_ETHERTYPE_VLAN = frozenset({0x8100, 0x88A8, 0x9100})
_ETHERTYPE_IP = frozenset({0x0800, 0x86DD})
# Where the EtherType (or protocol) field and the network layer sit, by link type.
_ETHERTYPE_AT = {DLT_EN10MB: 12, DLT_LINUX_SLL: 14, DLT_LINUX_SLL2: 0}
_HEADER_BYTES = {DLT_EN10MB: 14, DLT_LINUX_SLL: 16, DLT_LINUX_SLL2: 20}
_FAMILY_HEADER_BYTES = 4  # DLT_NULL and DLT_LOOP: a 4-byte address family
_U16 = struct.Struct("!H")
_ETHERNET_IP = (b"\x08\x00", b"\x86\xdd")


class FilterUnavailableError(CaptureError):
    """libpcap, whose BPF interpreter runs the filter on file frames, is not installed."""


def network_offset(linktype: int, frame: bytes) -> int | None:
    """Where the IP packet starts in `frame` (None: the frame carries none)."""
    if linktype in (DLT_NULL, DLT_LOOP):
        return _FAMILY_HEADER_BYTES if len(frame) > _FAMILY_HEADER_BYTES else None
    at = _ETHERTYPE_AT.get(linktype)
    if at is None:
        return 0  # raw IP link types
    offset = _HEADER_BYTES[linktype]
    if len(frame) < offset:
        return None
    ethertype = _U16.unpack_from(frame, at)[0]
    while ethertype in _ETHERTYPE_VLAN and len(frame) >= offset + 4:
        ethertype = _U16.unpack_from(frame, offset + 2)[0]
        offset += 4
    return offset if ethertype in _ETHERTYPE_IP else None


def _interpreter() -> ctypes._NamedFuncPointer:
    name = ctypes.util.find_library("pcap")
    if name is None:
        raise FilterUnavailableError(
            "libpcap is needed to apply a capture filter to a file (apt install libpcap0.8)"
        )
    function = ctypes.CDLL(name).bpf_filter
    function.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint, ctypes.c_uint)
    function.restype = ctypes.c_uint
    return function


def _packed(program: Sequence[Instruction]) -> bytes:
    """`program` as libpcap's array of `struct bpf_insn` (u16 code, u8 jt, u8 jf, u32 k)."""
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in program)


class FrameFilter:
    """A pcap-filter expression compiled once; `matches` tells whether a frame passes."""

    def __init__(self, expression: str) -> None:
        self.expression = expression
        self._program = compile_filter(expression, "RAW")
        self._by_offset: dict[int, CompiledFilter] = {}
        # The program for untagged Ethernet frames, the common case (None: interpreted).
        self._ethernet: CompiledFilter | None = None
        try:
            self._by_offset[0] = compile_program(self._program, 0)
        except UncompilableProgramError:
            self._interpret = _interpreted(self._program)
            self._compiled = False
        else:
            self._compiled = True
            self._ethernet = self._by_offset[14] = compile_program(self._program, 14)
        self.rejected = 0

    def matches(self, linktype: int, frame: bytes) -> bool:
        """Whether the kernel filter `run` attaches would accept this frame's packet."""
        ethernet = self._ethernet
        if ethernet is not None and linktype == DLT_EN10MB and frame[12:14] in _ETHERNET_IP:
            if ethernet(frame):
                return True
            self.rejected += 1
            return False
        offset = network_offset(linktype, frame)
        if offset is None:
            self.rejected += 1
            return False
        if self._compiled:
            run = self._by_offset.get(offset)
            if run is None:
                run = self._by_offset[offset] = compile_program(self._program, offset)
            accepted = run(frame)
        else:
            accepted = self._interpret(frame[offset:] if offset else frame)
        if accepted:
            return True
        self.rejected += 1
        return False


def _interpreted(program: Sequence[Instruction]) -> CompiledFilter:
    """`program` run by libpcap's interpreter on a packet."""
    run = _interpreter()
    packed = _packed(program)

    def interpret(packet: bytes) -> int:
        return int(run(packed, packet, len(packet), len(packet)))

    return interpret

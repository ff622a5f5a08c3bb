"""Reading pcap and pcapng files at full speed (mmap + struct, no per-packet objects
beyond the frame itself).

`open_capture(path)` sniffs the format. Readers yield `Frame` tuples in file
order and expose `position` (the byte after the last whole record or block) and
`frames_read` for progress reporting and for saying where a damaged file stopped.
Pacing (`--realtime`) is the caller's job: frames carry their capture time.

Damage is never skipped silently: a file cut inside a record or block (what a
killed tcpdump leaves), a record whose captured length exceeds the snapshot
length or `MAX_CAPLEN`, a pcapng block whose length is bad or whose trailing
length disagrees, a packet block too short for its fields, and an interface
with a link type the decoder does not know each raise `BadCaptureFileError`
naming the byte offset, after every frame before it was yielded.
"""

from __future__ import annotations

import mmap
import os
import struct
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from collector.capture.errors import BadCaptureFileError
from collector.capture.linktypes import SUPPORTED_LINKTYPES

PCAP_MAGIC_US = 0xA1B2C3D4
PCAP_MAGIC_NS = 0xA1B23C4D
PCAPNG_SHB = 0x0A0D0D0A
PCAPNG_BYTE_ORDER = 0x1A2B3C4D
# The largest captured length accepted whatever a header's snapshot length says (libpcap's
# maximum snapshot length; offload super-packets stay well below it).
MAX_CAPLEN = 262_144
_IDB, _OPB, _SPB, _EPB = 1, 2, 3, 6
_OPT_IF_TSRESOL = 9
_OPT_IF_TSOFFSET = 14


class Frame(NamedTuple):
    """One captured frame: capture time, its link type, the bytes, and the length on the wire."""

    ts_ns: int
    linktype: int
    data: bytes
    wire_len: int


class CaptureReader(ABC):
    """Common surface of the file readers."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = path.open("rb")
        self.size = os.fstat(self._file.fileno()).st_size
        if self.size == 0:
            self._file.close()
            raise BadCaptureFileError(f"{path}: empty file")
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        self.position = 0
        self.frames_read = 0

    @abstractmethod
    def frames(self) -> Iterator[Frame]:
        """Every frame of the file, in file order."""

    def close(self) -> None:
        self._map.close()
        self._file.close()

    def __enter__(self) -> CaptureReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PcapReader(CaptureReader):
    """Classic libpcap files, either byte order, micro- or nanosecond timestamps."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        head = self._map[:24]
        if len(head) < 24:
            self.close()
            raise BadCaptureFileError(f"{path}: truncated pcap header")
        for order in ("<", ">"):
            magic = struct.unpack(order + "I", head[:4])[0]
            if magic in (PCAP_MAGIC_US, PCAP_MAGIC_NS):
                break
        else:
            self.close()
            raise BadCaptureFileError(f"{path}: not a pcap file")
        self._order = order
        self._ts_scale = 1000 if magic == PCAP_MAGIC_US else 1
        self._max_caplen = max(struct.unpack(order + "I", head[16:20])[0], MAX_CAPLEN)
        self.linktype = struct.unpack(order + "I", head[20:24])[0] & 0x0FFFFFFF
        if self.linktype not in SUPPORTED_LINKTYPES:
            self.close()
            raise BadCaptureFileError(f"{path}: link type {self.linktype} is not supported")
        self.position = 24

    def frames(self) -> Iterator[Frame]:
        record = struct.Struct(self._order + "IIII")
        unpack_from = record.unpack_from
        data = self._map
        size = self.size
        linktype = self.linktype
        scale = self._ts_scale
        offset = self.position
        max_caplen = self._max_caplen
        new = tuple.__new__
        while offset + 16 <= size:
            sec, frac, caplen, wire_len = unpack_from(data, offset)
            if caplen > max_caplen:
                raise BadCaptureFileError(
                    f"{self.path}: record at byte {offset} claims {caplen} captured bytes "
                    f"(more than {max_caplen})"
                )
            start = offset + 16
            offset = start + caplen
            if offset > size:
                raise BadCaptureFileError(
                    f"{self.path}: the file ends inside the record at byte {start - 16}"
                )
            self.position = offset
            self.frames_read += 1
            yield new(
                Frame, (sec * 1_000_000_000 + frac * scale, linktype, data[start:offset], wire_len)
            )
        if offset < size:
            raise BadCaptureFileError(
                f"{self.path}: the file ends inside the record header at byte {offset}"
            )


class _Interface(NamedTuple):
    linktype: int
    snaplen: int
    # ns = ticks * num // den + offset_ns
    num: int
    den: int
    offset_ns: int


class PcapngReader(CaptureReader):
    """pcapng sections with any number of interfaces (EPB, SPB and the obsolete OPB)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        if len(self._map) < 12 or struct.unpack("<I", self._map[:4])[0] != PCAPNG_SHB:
            self.close()
            raise BadCaptureFileError(f"{path}: not a pcapng file")

    def _section_order(self, offset: int) -> str:
        magic = self._map[offset + 8 : offset + 12]
        if struct.unpack("<I", magic)[0] == PCAPNG_BYTE_ORDER:
            return "<"
        if struct.unpack(">I", magic)[0] == PCAPNG_BYTE_ORDER:
            return ">"
        raise BadCaptureFileError(f"{self.path}: bad byte-order magic in section at {offset}")

    def _interface(self, order: str, body: bytes, offset: int) -> _Interface:
        if len(body) < 8:
            raise BadCaptureFileError(f"{self.path}: interface block at byte {offset} is too short")
        linktype, _reserved, snaplen = struct.unpack_from(order + "HHI", body, 0)
        num, den, offset_ns = 1000, 1, 0  # default resolution: microseconds
        pos = 8
        while pos + 4 <= len(body):
            code, length = struct.unpack_from(order + "HH", body, pos)
            value = body[pos + 4 : pos + 4 + length]
            if code == 0:
                break
            if code == _OPT_IF_TSRESOL and length == 1:
                exponent = value[0] & 0x7F
                units = 2**exponent if value[0] & 0x80 else 10**exponent
                num, den = 1_000_000_000, units
            elif code == _OPT_IF_TSOFFSET and length == 8:
                offset_ns = struct.unpack(order + "q", value)[0] * 1_000_000_000
            pos += 4 + ((length + 3) & ~3)
        return _Interface(linktype, snaplen, num, den, offset_ns)

    def frames(self) -> Iterator[Frame]:
        data = self._map
        size = self.size
        offset = 0
        order = "<"
        head = struct.Struct("<II")
        trailer = struct.Struct("<I")
        interfaces: list[_Interface] = []
        last_ts = 0
        while offset + 12 <= size:
            block_type = struct.unpack_from("<I", data, offset)[0]
            if block_type == PCAPNG_SHB:
                order = self._section_order(offset)
                head = struct.Struct(order + "II")
                trailer = struct.Struct(order + "I")
                interfaces = []
            block_type, length = head.unpack_from(data, offset)
            if length < 12 or length % 4:
                raise BadCaptureFileError(
                    f"{self.path}: bad block length {length} at byte {offset}"
                )
            if offset + length > size:
                raise BadCaptureFileError(
                    f"{self.path}: the file ends inside the block at byte {offset}"
                )
            if trailer.unpack_from(data, offset + length - 4)[0] != length:
                raise BadCaptureFileError(
                    f"{self.path}: the block at byte {offset} is damaged "
                    "(its trailing length differs)"
                )
            body_start = offset + 8
            body_end = offset + length - 4
            block_at = offset
            offset += length
            if block_type in (_EPB, _OPB) and body_end - body_start < 20:
                raise BadCaptureFileError(
                    f"{self.path}: packet block at byte {block_at} is too short"
                )
            if block_type == _SPB and body_end - body_start < 4:
                raise BadCaptureFileError(
                    f"{self.path}: simple packet block at byte {block_at} is too short"
                )
            if block_type in (_EPB, _OPB):
                if block_type == _EPB:
                    iface, ts_hi, ts_lo, caplen, wire_len = struct.unpack_from(
                        order + "IIIII", data, body_start
                    )
                    start = body_start + 20
                else:
                    iface, _drops, ts_hi, ts_lo, caplen, wire_len = struct.unpack_from(
                        order + "HHIIII", data, body_start
                    )
                    start = body_start + 20
                if iface >= len(interfaces) or start + caplen > body_end:
                    raise BadCaptureFileError(f"{self.path}: bad packet block at byte {block_at}")
                spec = interfaces[iface]
                last_ts = ((ts_hi << 32) | ts_lo) * spec.num // spec.den + spec.offset_ns
                self.position = offset
                self.frames_read += 1
                yield Frame(last_ts, spec.linktype, data[start : start + caplen], wire_len)
            elif block_type == _SPB:
                if not interfaces:
                    raise BadCaptureFileError(
                        f"{self.path}: simple packet block at byte {block_at} before an interface"
                    )
                wire_len = struct.unpack_from(order + "I", data, body_start)[0]
                spec = interfaces[0]
                caplen = min(wire_len, body_end - body_start - 4)
                if spec.snaplen:
                    caplen = min(caplen, spec.snaplen)
                start = body_start + 4
                self.position = offset
                self.frames_read += 1
                yield Frame(last_ts, spec.linktype, data[start : start + caplen], wire_len)
            else:
                if block_type == _IDB:
                    spec = self._interface(order, data[body_start:body_end], block_at)
                    if spec.linktype not in SUPPORTED_LINKTYPES:
                        raise BadCaptureFileError(
                            f"{self.path}: interface {len(interfaces)} (block at byte "
                            f"{block_at}) has unsupported link type {spec.linktype}"
                        )
                    interfaces.append(spec)
                self.position = offset
        if offset < size:
            raise BadCaptureFileError(
                f"{self.path}: the file ends inside the block at byte {offset}"
            )


def open_capture(path: Path) -> CaptureReader:
    """A reader for the pcap or pcapng file at `path`, chosen by its magic number."""
    with path.open("rb") as f:
        magic = f.read(4)
    if len(magic) < 4:
        raise BadCaptureFileError(f"{path}: too short to be a capture file")
    if struct.unpack("<I", magic)[0] == PCAPNG_SHB:
        return PcapngReader(path)
    return PcapReader(path)

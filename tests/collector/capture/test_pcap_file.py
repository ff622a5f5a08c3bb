"""pcap and pcapng readers against files written by dpkt."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collector.capture.errors import BadCaptureFileError
from collector.capture.pcap_file import PcapngReader, PcapReader, open_capture
from tests.cpu_bound import budget, cpu_bound
from tests.pcapgen import Conversation, frame, write_pcap, write_pcapng


def _conv() -> Conversation:
    conv = Conversation(ts=1_700_000_000.25).handshake()
    conv.exchange(b"GET / HTTP/1.1\r\n\r\n", b"HTTP/1.1 204 No Content\r\n\r\n")
    return conv.close()


@pytest.mark.parametrize("nano", [False, True])
def test_pcap_frames_round_trip(tmp_path: Path, nano: bool) -> None:
    conv = _conv()
    path = write_pcap(tmp_path / "a.pcap", conv, nano=nano)
    with open_capture(path) as reader:
        assert isinstance(reader, PcapReader)
        frames = list(reader.frames())
        assert reader.position == reader.size
    assert [f.data for f in frames] == [frame(conv, p) for p in conv.packets]
    assert frames[0].linktype == 1
    assert abs(frames[0].ts_ns - int(conv.packets[0].ts * 1e9)) < 2_000


def test_pcapng_frames_round_trip(tmp_path: Path) -> None:
    conv = _conv()
    path = write_pcapng(tmp_path / "a.pcapng", conv)
    with open_capture(path) as reader:
        assert isinstance(reader, PcapngReader)
        frames = list(reader.frames())
    assert [f.data for f in frames] == [frame(conv, p) for p in conv.packets]
    assert abs(frames[-1].ts_ns - int(conv.packets[-1].ts * 1e9)) < 2_000


def test_big_endian_pcap(tmp_path: Path) -> None:
    data = frame(_conv(), _conv().packets[3])
    head = struct.pack(">IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)
    rec = struct.pack(">IIII", 10, 500, len(data), len(data)) + data
    path = tmp_path / "be.pcap"
    path.write_bytes(head + rec)
    with open_capture(path) as reader:
        (f,) = list(reader.frames())
    assert f.ts_ns == 10_000_500_000 and f.data == data


def test_bad_files_raise(tmp_path: Path) -> None:
    for name, content in (("empty", b""), ("junk", b"not a capture file at all")):
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(BadCaptureFileError):
            open_capture(path)
    conv = _conv()
    path = write_pcap(tmp_path / "cut.pcap", conv)
    path.write_bytes(path.read_bytes()[:-5])
    with open_capture(path) as reader, pytest.raises(BadCaptureFileError):
        list(reader.frames())


def _frames_until_damage(path: Path) -> tuple[list[bytes], str, int, int]:
    """The frames read before the reader raised, its message, position and count."""
    got: list[bytes] = []
    with open_capture(path) as reader:
        with pytest.raises(BadCaptureFileError) as raised:
            got.extend(f.data for f in reader.frames())
        return got, str(raised.value), reader.position, reader.frames_read


def _pcap_records(conv: Conversation) -> list[int]:
    """Byte offsets of each record of `write_pcap(conv)`: after the 24-byte header."""
    offsets, at = [], 24
    for packet in conv.packets:
        offsets.append(at)
        at += 16 + len(frame(conv, packet))
    return offsets


@pytest.mark.parametrize("cut", [5, 16 + 3], ids=["inside-header", "inside-data"])
def test_a_pcap_cut_inside_a_record_stops_there_after_the_frames_before_it(
    tmp_path: Path, cut: int
) -> None:
    conv = _conv()
    records = _pcap_records(conv)
    path = write_pcap(tmp_path / "cut.pcap", conv)
    path.write_bytes(path.read_bytes()[: records[4] + cut])
    got, message, position, count = _frames_until_damage(path)
    assert got == [frame(conv, p) for p in conv.packets[:4]]
    assert (position, count) == (records[4], 4)
    assert f"byte {records[4]}" in message and "ends inside the record" in message


def test_a_bogus_caplen_stops_the_pcap_reader(tmp_path: Path) -> None:
    conv = _conv()
    records = _pcap_records(conv)
    path = write_pcap(tmp_path / "bogus.pcap", conv)
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, records[2] + 8, 0x7FFFFFF0)
    path.write_bytes(bytes(data))
    got, message, position, _ = _frames_until_damage(path)
    assert len(got) == 2 and position == records[2]
    assert f"record at byte {records[2]} claims 2147483632 captured bytes" in message


def _pcapng_blocks(path: Path) -> list[tuple[int, int, int]]:
    """(offset, type, length) of each block of a little-endian pcapng file."""
    data = path.read_bytes()
    blocks, at = [], 0
    while at < len(data):
        kind, length = struct.unpack_from("<II", data, at)
        blocks.append((at, kind, length))
        at += length
    return blocks


def _damage_pcapng(path: Path, change: str) -> int:
    """Damage the third packet block of `path` as `change` says; returns its offset."""
    data = bytearray(path.read_bytes())
    packets = [b for b in _pcapng_blocks(path) if b[1] == 6]
    at, _, length = packets[2]
    if change == "cut":
        del data[at + length // 2 :]
    elif change == "trailer":
        struct.pack_into("<I", data, at + length - 4, length + 4)
    elif change == "length":
        struct.pack_into("<I", data, at + 4, 7)
    elif change == "caplen":
        struct.pack_into("<I", data, at + 20, length)
    path.write_bytes(bytes(data))
    return at


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ("cut", "ends inside the block"),
        ("trailer", "damaged (its trailing length differs)"),
        ("length", "bad block length 7"),
        ("caplen", "bad packet block"),
    ],
)
def test_a_damaged_pcapng_block_stops_the_reader_where_it_is(
    tmp_path: Path, change: str, says: str
) -> None:
    conv = _conv()
    path = write_pcapng(tmp_path / "damaged.pcapng", conv)
    at = _damage_pcapng(path, change)
    got, message, position, count = _frames_until_damage(path)
    assert got == [frame(conv, p) for p in conv.packets[:2]]
    assert (position, count) == (at, 2)
    assert f"at byte {at}" in message and says in message


def test_a_pcapng_interface_with_an_unknown_link_type_stops_the_reader(tmp_path: Path) -> None:
    conv = _conv()
    path = write_pcapng(tmp_path / "usb.pcapng", conv)
    data = bytearray(path.read_bytes())
    (idb,) = [b for b in _pcapng_blocks(path) if b[1] == 1]
    struct.pack_into("<H", data, idb[0] + 8, 189)  # LINKTYPE_USB_LINUX
    path.write_bytes(bytes(data))
    got, message, position, _ = _frames_until_damage(path)
    assert got == [] and position == idb[0]
    assert f"interface 0 (block at byte {idb[0]}) has unsupported link type 189" in message


def _read_all(path: Path) -> int:
    """Frames read before the end or the damage; any other exception fails the caller."""
    try:
        reader = open_capture(path)
    except BadCaptureFileError:
        return 0
    with reader:
        try:
            for _ in reader.frames():
                pass
        except BadCaptureFileError:
            pass
        assert reader.position <= reader.size
        return reader.frames_read


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.sampled_from(["pcap", "pcapng"]),
    st.lists(st.tuples(st.integers(0, 4095), st.integers(0, 255)), max_size=8),
    st.integers(0, 4096),
)
def test_mutated_files_yield_frames_or_a_damage_error_within_a_cpu_bound(
    tmp_path: Path, kind: str, flips: list[tuple[int, int]], cut: int
) -> None:
    conv = _conv()
    writer = write_pcap if kind == "pcap" else write_pcapng
    path = writer(tmp_path / f"fuzz.{kind}", conv)
    data = bytearray(path.read_bytes())
    for at, value in flips:
        data[at % len(data)] = value
    path.write_bytes(bytes(data[: max(1, len(data) - cut % len(data))]))
    with cpu_bound(budget(len(data))):
        assert _read_all(path) <= len(conv.packets)

"""pcap and pcapng readers against files written by dpkt."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from collector.capture.errors import BadCaptureFileError
from collector.capture.pcap_file import PcapngReader, PcapReader, open_capture
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

"""`collector replay` of damaged and cut files: it says where it stopped, keeps what it read.

What a killed tcpdump leaves (a file cut inside a record or block), a damaged
pcapng block and a bogus captured length: the exchange in flight at the damage
becomes a record, the summary is printed with the byte where reading stopped,
the exit status is 1, and no traceback escapes.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from collector.cli import main
from tests.openai_traffic import Call, words
from tests.pcapgen import CLIENT, SERVER, Conversation, frame, write_pcap, write_pcapng


def streamed() -> Call:
    return Call(
        "/v1/chat/completions",
        "cut",
        [{"role": "user", "content": "hello"}],
        {"stream": True, "seed": 3},
        [words(60, seed=3)],
    )


def conversation() -> tuple[Conversation, int]:
    """A finished exchange, then one whose response is in flight; returns the packet index
    of a segment in the middle of that response."""
    done = Call("/v1/chat/completions", "done", [{"role": "user", "content": "hi"}], {}, [words(4)])
    conv = Conversation().handshake().exchange(done.request(), done.response())
    c = streamed()
    conv.send(CLIENT, c.request())
    sent = conv.send(SERVER, c.response(), sizes=[150] * 100)
    conv.close()
    return conv, conv.packets.index(sent[len(sent) // 2])


def pcap_offset(conv: Conversation, index: int) -> int:
    return 24 + sum(16 + len(frame(conv, p)) for p in conv.packets[:index])


def pcapng_packet_blocks(path: Path) -> list[tuple[int, int]]:
    data = path.read_bytes()
    blocks, at = [], 0
    while at + 8 <= len(data):
        kind, length = struct.unpack_from("<II", data, at)
        if kind == 6:
            blocks.append((at, length))
        at += length
    return blocks


def damaged_file(tmp_path: Path, damage: str) -> tuple[Path, int]:
    """A capture damaged at the in-flight response; returns it and the damage's offset."""
    conv, index = conversation()
    if damage.startswith("pcap"):
        path = write_pcap(tmp_path / "damaged.pcap", conv)
        data = bytearray(path.read_bytes())
        at = pcap_offset(conv, index)
        if damage == "pcap-cut":
            del data[at + 20 :]
        else:
            struct.pack_into("<I", data, at + 8, 0xFFFFFFFF)
    else:
        path = write_pcapng(tmp_path / "damaged.pcapng", conv)
        data = bytearray(path.read_bytes())
        at, length = pcapng_packet_blocks(path)[index]
        if damage == "pcapng-cut":
            del data[at + length // 2 :]
        else:
            struct.pack_into("<I", data, at + length - 4, 4)
    path.write_bytes(bytes(data))
    return path, at


@pytest.mark.parametrize("damage", ["pcap-cut", "pcap-caplen", "pcapng-cut", "pcapng-block"])
def test_a_damaged_file_keeps_what_was_read_and_says_where_it_stopped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str
) -> None:
    path, at = damaged_file(tmp_path, damage)
    log = tmp_path / "log"
    summary = tmp_path / "summary.json"
    code = main(["replay", str(path), "--log", str(log), "--summary-json", str(summary)])
    out, err = capsys.readouterr()
    assert code == 1
    assert "Traceback" not in out + err
    assert f"stopped at byte {at} of {path.stat().st_size}" in out
    assert "records         2" in out
    assert f"byte {at}" in err and "stopped after" in err
    read = json.loads(summary.read_text())["read"]
    assert read["offset"] == at and read["damage"]
    assert main(["log", "export", str(log), "--format", "jsonl"]) == 0
    records = {r["model"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert records["done"]["quality"] == "complete"
    assert records["cut"]["quality"] in ("truncated", "response_gap")
    assert records["cut"]["http_status"] == 200


def test_an_unsupported_pcapng_link_type_is_reported_not_raised(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conv, _ = conversation()
    path = write_pcapng(tmp_path / "usb.pcapng", conv)
    data = bytearray(path.read_bytes())
    struct.pack_into("<H", data, 28 + 8, 189)  # the interface block follows a 28-byte SHB
    path.write_bytes(bytes(data))
    assert main(["replay", str(path), "--log", str(tmp_path / "log")]) == 1
    out, err = capsys.readouterr()
    assert "unsupported link type 189" in err and "Traceback" not in out + err
    assert "read            0 packets, stopped at byte 28" in out

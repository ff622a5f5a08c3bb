"""The default capture filter, and the example config's and inventory's, are dual-stack.

One expression everywhere: it keeps the API port's SYNs, FINs, RSTs and data
segments over IPv4 and IPv6, drops their pure ACKs, keeps IP fragments, and a
replay through it still records IPv4 and IPv6 exchanges complete.
"""

from __future__ import annotations

import json
import struct
import tomllib
from pathlib import Path

import pytest
import yaml

from collector.capture.frame_filter import FrameFilter
from collector.cli import main
from collector.config import DEFAULT_FILTER
from tests.collector.capture.fragment_frames import fragments
from tests.openai_traffic import Call, words
from tests.pcapgen import ACK, Conversation, Packet, frame, merged_frames, write_frames

REPO = Path(__file__).resolve().parents[2]
ETHERNET, RAW = 1, 101
V4 = (("10.0.0.1", 40000), ("10.0.0.2", 8000))
V6 = (("fd00::1", 40000), ("fd00::2", 8000))


def _yaml_filter(path: Path) -> str:
    return str(yaml.safe_load(path.read_text())["collector_bpf_filter"])


def _normalised(expression: str) -> str:
    return " ".join(expression.split())


def test_the_example_config_inventory_and_role_use_the_default() -> None:
    example = tomllib.loads((REPO / "appliance/config/collector.toml").read_text())
    inventory = _yaml_filter(REPO / "ansible/inventories/example/group_vars/collectors.yml")
    role = _yaml_filter(REPO / "ansible/roles/collector/defaults/main.yml")
    assert {_normalised(f) for f in (example["capture"]["filter"], inventory, role)} == {
        DEFAULT_FILTER
    }


def _api(addresses: tuple[tuple[str, int], tuple[str, int]], port: int = 8000) -> Conversation:
    client, (server_host, _) = addresses
    conv = Conversation(client=client, server=(server_host, port)).handshake()
    conv.exchange(b"POST /v1/completions HTTP/1.1\r\n\r\n", b"HTTP/1.1 204 \r\n\r\n")
    return conv.close()


def _is_pure_ack(packet: Packet) -> bool:
    return packet.flags == ACK and not packet.payload


@pytest.mark.parametrize("addresses", [V4, V6], ids=["ipv4", "ipv6"])
def test_segments_pass_and_pure_acks_are_dropped(
    addresses: tuple[tuple[str, int], tuple[str, int]],
) -> None:
    kernel = FrameFilter(DEFAULT_FILTER)
    conv = _api(addresses)
    kept = [p for p in conv.packets if kernel.matches(ETHERNET, frame(conv, p))]
    assert kept == [p for p in conv.packets if not _is_pure_ack(p)]
    assert len(kept) == 6 and kernel.rejected == 4  # SYN, SYN-ACK, 2 data, 2 FINs
    other = _api(addresses, port=22)
    assert not any(kernel.matches(ETHERNET, frame(other, p)) for p in other.packets)


def test_an_ipv4_header_with_options_is_measured_by_its_length() -> None:
    kernel = FrameFilter(DEFAULT_FILTER)
    conv = _api(V4)
    for packet in conv.packets:
        ip = bytearray(frame(conv, packet, link="raw"))
        ip[0] = 0x46  # a 24-byte header: NOP NOP NOP EOL after the fixed 20 bytes
        ip[20:20] = b"\x01\x01\x01\x00"
        struct.pack_into("!H", ip, 2, len(ip))
        assert kernel.matches(RAW, bytes(ip)) == (not _is_pure_ack(packet)), packet


@pytest.mark.parametrize("addresses", [V4, V6], ids=["ipv4", "ipv6"])
def test_every_fragment_passes(addresses: tuple[tuple[str, int], tuple[str, int]]) -> None:
    kernel = FrameFilter(DEFAULT_FILTER)
    client, server = addresses
    pieces = fragments(Conversation(client=client, server=server), 512)
    assert len(pieces) > 2 and all(kernel.matches(RAW, piece) for piece in pieces)


def test_a_replay_through_the_example_filter_records_both_families(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "collector.toml"
    config.write_text((REPO / "appliance/config/collector.toml").read_text())
    conversations = []
    for i, (client, server) in enumerate((V4, V6)):
        call = Call("/v1/completions", f"family-{i}", "say hi", {"seed": 1}, [words(40)])
        conv = Conversation(client=client, server=server, ts=1_700_000_000.0 + i)
        conv.handshake().exchange(call.request(), call.response(), response_sizes=[200] * 20)
        conversations.append((conv, conv.close().packets))
    pcap = write_frames(tmp_path / "dual.pcap", merged_frames(conversations))
    log = tmp_path / "log"
    assert main(["replay", str(pcap), "--log", str(log), "--config", str(config)]) == 0
    assert "packets not matching" in capsys.readouterr().out
    assert main(["log", "export", str(log), "--format", "jsonl"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted((r["model"], r["quality"]) for r in records) == [
        ("family-0", "complete"),
        ("family-1", "complete"),
    ]

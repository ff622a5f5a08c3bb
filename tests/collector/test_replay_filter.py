"""`collector replay` reads a file as `collector run` captures: same filter, same server ports.

One capture holds an API exchange on port 8000, one on port 9000, and the other
traffic a mirror port carries (SSH, TLS, SMTP, PostgreSQL, MySQL, Redis). None
of that other traffic may become a `parse_error` or `request_gap` record.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collector.cli import main
from tests.openai_traffic import Call, words
from tests.pcapgen import CLIENT, SERVER, Conversation, Packet, merged_frames, write_frames

OTHER_TRAFFIC = {
    22: (b"SSH-2.0-OpenSSH_9.6\r\n", b"SSH-2.0-OpenSSH_9.2p1 Debian\r\n"),
    443: (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(32), b"\x16\x03\x03\x00\x7a\x02"),
    25: (b"EHLO client.example\r\n", b"220 mail.example ESMTP Postfix\r\n"),
    5432: (b"\x00\x00\x00\x08\x04\xd2\x16\x2f", b"N"),
    3306: (b"\x20\x00\x00\x01\x85\xa6\xff\x01", b"\x4a\x00\x00\x00\x0a8.0.36\x00"),
    6379: (b"*1\r\n$4\r\nPING\r\n", b"+PONG\r\n"),
}


def api_call(model: str) -> Call:
    return Call("/v1/completions", model, "say hi", {"seed": 1}, [words(5)])


def capture(tmp_path: Path) -> Path:
    parts: list[tuple[Conversation, list[Packet]]] = []
    for i, (port, model) in enumerate(((8000, "on-8000"), (9000, "on-9000"))):
        c = api_call(model)
        conv = Conversation(client=("10.1.0.1", 41000 + i), server=("10.1.0.2", port))
        parts.append((conv.handshake().exchange(c.request(), c.response()).close(), []))
    for i, (port, (hello, answer)) in enumerate(OTHER_TRAFFIC.items()):
        conv = Conversation(client=("10.1.0.9", 50000 + i), server=("10.1.0.3", port))
        # Picked up midway (no handshake), as an always-on capture meets long-lived flows.
        conv.send(SERVER, answer)
        conv.send(CLIENT, hello)
        conv.send(SERVER, answer * 3)
        parts.append((conv, []))
    frames = merged_frames([(conv, conv.packets) for conv, _ in parts], vlans=[7])
    return write_frames(tmp_path / "mirror.pcap", frames)


def replay(
    capsys: pytest.CaptureFixture[str], pcap: Path, log: Path, *options: str
) -> tuple[str, list[dict[str, object]]]:
    assert main(["replay", str(pcap), "--log", str(log), *options]) == 0
    out = capsys.readouterr().out
    assert main(["log", "export", str(log), "--format", "jsonl"]) == 0
    return out, [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_the_configs_filter_keeps_only_the_api_port(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, records = replay(capsys, capture(tmp_path), tmp_path / "log")
    assert [(r["model"], r["quality"]) for r in records] == [("on-8000", "complete")]
    assert "packets not matching 'tcp port 8000" in out


def test_filter_and_server_ports_from_a_config_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "collector.toml"
    config.write_text('[capture]\nfilter = "tcp port 9000"\nserver_ports = [9000]\n')
    _, records = replay(capsys, capture(tmp_path), tmp_path / "log", "--config", str(config))
    assert [(r["model"], r["quality"]) for r in records] == [("on-9000", "complete")]


def test_filter_and_server_port_options_override_the_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    options = ("--filter", "tcp port 8000 or tcp port 9000", "--server-port", "8000")
    _, records = replay(
        capsys, capture(tmp_path), tmp_path / "log", *options, "--server-port", "9000"
    )
    assert sorted((r["model"], r["quality"]) for r in records) == [
        ("on-8000", "complete"),
        ("on-9000", "complete"),
    ]


def test_server_ports_orient_a_flow_picked_up_midway(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The client's port is below the server's: only the server ports say who serves.
    first, second = api_call("first"), api_call("second")
    conv = Conversation(client=("10.1.0.1", 1000), server=("10.1.0.2", 9000)).handshake()
    conv.exchange(first.request(), first.response()).exchange(second.request(), second.response())
    midway = [p for p in conv.close().packets if p.payload][1:]
    pcap = write_frames(tmp_path / "midway.pcap", merged_frames([(conv, midway)]))
    options = ("--filter", "tcp port 9000", "--server-port", "9000")
    _, records = replay(capsys, pcap, tmp_path / "log", *options)
    assert [(r["model"], r["quality"]) for r in records if r["model"]] == [("second", "complete")]
    _, misread = replay(capsys, pcap, tmp_path / "log2", "--filter", "tcp port 9000")
    assert ("second", "complete") not in [(r["model"], r["quality"]) for r in misread]


def test_a_bad_filter_or_port_is_refused_before_reading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pcap = capture(tmp_path)
    assert main(["replay", str(pcap), "--log", str(tmp_path / "a"), "--filter", "tcp prt 1"]) == 2
    assert "bad capture filter" in capsys.readouterr().err
    assert main(["replay", str(pcap), "--log", str(tmp_path / "b"), "--server-port", "0"]) == 2
    assert "--server-port" in capsys.readouterr().err

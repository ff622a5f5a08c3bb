"""`FrameFilter`: run's kernel filter program applied to file frames of every link type."""

from __future__ import annotations

import pytest

from collector.capture import frame_filter
from collector.capture.bpf_python import UncompilableProgramError
from collector.capture.errors import CaptureError
from collector.capture.frame_filter import FrameFilter, network_offset
from tests.pcapgen import (
    LINK_ETHERNET,
    LINK_RAW,
    LINK_SLL,
    LINK_SLL2,
    Conversation,
    frame,
)

DLT = {LINK_ETHERNET: 1, LINK_SLL: 113, LINK_SLL2: 276, LINK_RAW: 101}


def api(port: int = 8000, *, ipv6: bool = False) -> Conversation:
    client = ("fd00::1", 40000) if ipv6 else ("10.0.0.1", 40000)
    server = ("fd00::2", port) if ipv6 else ("10.0.0.2", port)
    conv = Conversation(client=client, server=server).handshake()
    return conv.exchange(b"POST /v1/completions HTTP/1.1\r\n\r\n", b"HTTP/1.1 204 \r\n\r\n")


@pytest.mark.parametrize("link", [LINK_ETHERNET, LINK_SLL, LINK_SLL2, LINK_RAW])
@pytest.mark.parametrize("ipv6", [False, True])
def test_the_filter_sees_the_ip_packet_of_every_link_type(link: str, ipv6: bool) -> None:
    keep, drop = FrameFilter("tcp port 8000"), FrameFilter("tcp port 8000")
    for packet in api(ipv6=ipv6).packets:
        assert keep.matches(DLT[link], frame(api(ipv6=ipv6), packet, link=link))
    for packet in api(22, ipv6=ipv6).packets:
        assert not drop.matches(DLT[link], frame(api(22, ipv6=ipv6), packet, link=link))
    assert (keep.rejected, drop.rejected) == (0, len(api().packets))


@pytest.mark.parametrize("vlans", [(100,), (10, 20)])
def test_vlan_tags_are_skipped_as_the_kernel_takes_them_out_of_band(vlans: tuple[int, ...]) -> None:
    conv = api()
    data = frame(conv, conv.packets[0], vlans=vlans)
    assert network_offset(1, data) == 14 + 4 * len(vlans)
    assert FrameFilter("tcp port 8000 and host 10.0.0.2").matches(1, data)


def test_frames_without_an_ip_packet_never_match() -> None:
    arp = b"\xff" * 12 + b"\x08\x06" + b"\x00" * 28
    assert network_offset(1, arp) is None
    assert network_offset(1, b"\x00" * 10) is None
    never = FrameFilter("not tcp port 8000")
    assert not never.matches(1, arp) and never.rejected == 1


def test_header_fields_beyond_ports_are_filtered_too() -> None:
    conv = api()
    syn, ack = conv.packets[0], conv.packets[2]
    f = FrameFilter("tcp port 8000 and tcp[tcpflags] & tcp-syn != 0")
    assert f.matches(1, frame(conv, syn)) and not f.matches(1, frame(conv, ack))


def test_a_bad_expression_is_a_capture_error() -> None:
    with pytest.raises(CaptureError, match="bad capture filter"):
        FrameFilter("tcp port eight thousand")


def test_a_program_the_compiler_refuses_runs_in_libpcaps_interpreter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(program: object, offset: int) -> object:
        raise UncompilableProgramError("refused for the test")

    monkeypatch.setattr(frame_filter, "compile_program", refuse)
    interpreted = FrameFilter("tcp port 8000")
    monkeypatch.undo()
    compiled = FrameFilter("tcp port 8000")
    for conv in (api(), api(22), api(ipv6=True)):
        for packet in conv.packets:
            data = frame(conv, packet)
            assert interpreted.matches(1, data) == compiled.matches(1, data)
    assert interpreted.rejected == compiled.rejected == len(api(22).packets)

"""IPv4 and IPv6 fragments: reassembly, overlaps, duplicates, TTL, caps and timeouts."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from veritap.config_schema import ConfigError

from collector.capture.decode import FrameDecoder, TcpSegment
from collector.capture.fragments import FragmentLimits
from collector.capture.linktypes import DLT_RAW
from collector.config import load_config
from collector.pipeline import CapturePipeline
from tests.collector.capture.fragment_frames import PAYLOAD, datagram, fragments, v4_fragment
from tests.cpu_bound import cpu_bound
from tests.pcapgen import Conversation

V4 = Conversation()
V6 = Conversation(client=("fd00::1", 5555), server=("fd00::2", 8000))


def decode_all(frames: list[bytes], limits: FragmentLimits | None = None) -> list[TcpSegment]:
    decoder = FrameDecoder(DLT_RAW, fragments=limits)
    return [s for i, f in enumerate(frames) if (s := decoder.decode(i, f)) is not None]


def test_ipv4_fragments_in_any_order_reassemble_and_pass_the_tcp_checksum() -> None:
    pieces = fragments(V4, 512)
    (seg,) = decode_all(pieces[::-1])
    assert seg.payload == PAYLOAD and seg.sport == 40000 and seg.ttl == 64


def test_ipv6_fragments_reassemble() -> None:
    pieces = fragments(V6, 1024)
    decoder = FrameDecoder(DLT_RAW)
    segs = [decoder.decode(0, p) for p in [pieces[1], pieces[0], *pieces[2:]]]
    assert segs[:-1] == [None] * (len(pieces) - 1)
    last = segs[-1]
    assert last is not None and last.payload == PAYLOAD
    assert decoder.stats.ip_fragments == len(pieces) and decoder.stats.fragments_reassembled == 1


def test_an_identical_duplicate_is_ignored() -> None:
    pieces = fragments(V4, 512)
    (seg,) = decode_all([pieces[0], pieces[0], *pieces[1:]])
    assert seg.payload == PAYLOAD


def test_an_overlap_with_other_bytes_drops_the_datagram() -> None:
    for conv in (V4, V6):
        pieces = fragments(conv, 512)
        forged = bytearray(pieces[1])
        forged[-1] ^= 0xFF
        decoder = FrameDecoder(DLT_RAW)
        for frame in [pieces[0], bytes(forged), *pieces[1:]]:
            assert decoder.decode(0, frame) is None
        assert decoder.stats.fragment_conflicts >= 1


def test_a_partial_overlap_drops_the_datagram() -> None:
    ip = datagram(V4)
    body = ip[20:]
    frames = [
        v4_fragment(ip, 0, body[:512], True),
        v4_fragment(ip, 256, body[256:768], True),
        v4_fragment(ip, 512, body[512:], False),
    ]
    decoder = FrameDecoder(DLT_RAW)
    assert [decoder.decode(0, f) for f in frames] == [None, None, None]
    assert decoder.stats.fragment_conflicts == 1


def test_a_fragment_with_another_ttl_drops_the_datagram() -> None:
    ip = datagram(V4)
    body = ip[20:]
    frames = [v4_fragment(ip, 0, body[:512], True), v4_fragment(ip, 512, body[512:], False, 3)]
    decoder = FrameDecoder(DLT_RAW)
    assert [decoder.decode(0, f) for f in frames] == [None, None]
    assert decoder.stats.fragment_conflicts == 1


def test_incomplete_datagrams_expire_in_capture_time() -> None:
    pieces = fragments(V4, 512)
    decoder = FrameDecoder(DLT_RAW, fragments=FragmentLimits(timeout_ns=30_000_000_000))
    assert decoder.decode(0, pieces[0]) is None
    for frame in pieces[1:]:
        assert decoder.decode(31_000_000_000, frame) is None
    assert decoder.stats.fragments_expired == 1 and decoder.fragments.held_bytes > 0


def test_memory_caps_evict_the_oldest_datagram_and_bound_its_pieces() -> None:
    first = fragments(V4, 512)
    other = fragments(Conversation(client=("10.9.9.9", 1111)), 512)
    limits = FragmentLimits(max_bytes=1500)
    decoder = FrameDecoder(DLT_RAW, fragments=limits)
    for frame in (first[0], first[1], other[0]):
        decoder.decode(0, frame)
    assert decoder.stats.fragments_evicted >= 1 and decoder.fragments.held_bytes <= 1500
    capped = FrameDecoder(DLT_RAW, fragments=FragmentLimits(max_fragments=3))
    assert [capped.decode(0, f) for f in fragments(V4, 8)[:5]] == [None] * 5
    assert capped.stats.fragments_over_cap >= 1


def test_a_non_final_fragment_whose_length_is_not_a_multiple_of_8_is_malformed() -> None:
    ip = datagram(V4)
    decoder = FrameDecoder(DLT_RAW)
    assert decoder.decode(0, v4_fragment(ip, 0, ip[20:31], True)) is None
    assert decoder.stats.malformed == 1


@st.composite
def fragment_storms(draw: st.DrawFn) -> tuple[bool, list[bytes]]:
    v6 = draw(st.booleans())
    size = 8 * draw(st.integers(min_value=1, max_value=200))
    pieces = fragments(V6 if v6 else V4, size)
    frames = list(pieces) + [pieces[i % len(pieces)] for i in draw(st.lists(st.integers(0, 50)))]
    # At most one forged copy: two can cancel out in the 16-bit sum (for the client too).
    for index in draw(st.lists(st.integers(0, 50), max_size=1)):
        forged = bytearray(pieces[index % len(pieces)])
        forged[draw(st.integers(min_value=48 if v6 else 20, max_value=len(forged) - 1))] ^= 0x5A
        frames.append(bytes(forged))
    order = draw(st.permutations(range(len(frames))))
    return v6, [frames[i] for i in order]


@settings(max_examples=120, deadline=None)
@given(case=fragment_storms())
def test_fragment_storms_never_raise_and_never_give_other_bytes(
    case: tuple[bool, list[bytes]],
) -> None:
    _, frames = case
    with cpu_bound(2.0):
        segs = decode_all(frames)
    assert all(seg.payload == PAYLOAD for seg in segs)


def test_the_capture_section_sets_the_fragment_limits_the_pipeline_applies(tmp_path: Path) -> None:
    path = tmp_path / "collector.toml"
    path.write_text(
        "[capture]\nfragment_timeout_s = 5.0\nfragment_max_bytes = 100000\n"
        "fragment_max_count = 4\nfragment_max_datagram_bytes = 2000\n"
    )
    config = load_config(path)
    assert config.capture.fragment_limits() == FragmentLimits(5_000_000_000, 100_000, 4, 2000)
    pipeline = CapturePipeline(config, lambda record: None)
    for i, frame in enumerate(fragments(V4, 256)):  # 13 fragments, 3 KiB: over both caps
        pipeline.frame(i, DLT_RAW, frame)
    decode = pipeline.summary().decode
    assert decode.fragments_over_cap >= 1 and decode.fragments_reassembled == 0
    assert decode.segments == 0


@pytest.mark.parametrize(
    "toml",
    [
        "fragment_max_count = 1",
        "fragment_max_datagram_bytes = 70000",
        "fragment_max_bytes = 10",
        "fragment_timeout_s = 0",
    ],
)
def test_fragment_limits_out_of_range_are_refused_by_name(tmp_path: Path, toml: str) -> None:
    path = tmp_path / "collector.toml"
    path.write_text(f"[capture]\n{toml}\n")
    with pytest.raises(ConfigError, match=toml.split(maxsplit=1)[0]):
        load_config(path)

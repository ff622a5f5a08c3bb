"""`compile_program`: compiled BPF returns what libpcap's interpreter returns, on any packet."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.capture.bpf import Instruction, compile_filter
from collector.capture.bpf_python import (
    MAX_DEPTH,
    CompiledFilter,
    UncompilableProgramError,
    compile_program,
)
from tests.cpu_bound import budget, cpu_bound

EXPRESSIONS = (
    "tcp port 8000 or (ip[6:2] & 0x3fff != 0) or (ip6 and ip6[6] == 44)",
    "tcp port 8000 and (tcp[tcpflags] & (tcp-syn|tcp-fin|tcp-rst) != 0 or "
    "(ip[2:2] - ((ip[0] & 0xf) << 2) - ((tcp[12] & 0xf0) >> 2)) != 0)",
    "host 10.0.0.2 and not port 22",
    "ip6 and tcp dst portrange 8000-8010",
    "net 10.0.0.0/8 or len > 1000",
    "tcp[13] & 2 != 0 and ip[8] < 64",
    "ip[2:2] / 3 = 20 or ip[2:2] % 7 = 1 or ip[0] * 2 - 1 = 0x89",
)

_LD_CODES = (0x20, 0x28, 0x30, 0x40, 0x48, 0x50, 0x00, 0x80, 0x60)
_LDX_CODES = (0x01, 0x61, 0x81, 0xB1)
_ALU_OPS = (0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xA0)
_JUMP_OPS = (0x10, 0x20, 0x30, 0x40)
_OTHER_CODES = (0x02, 0x03, 0x07, 0x87)
_RETURNS = (0x06, 0x16)


@functools.cache
def _bpf_filter() -> ctypes._NamedFuncPointer:
    name = ctypes.util.find_library("pcap")
    assert name is not None, "libpcap is needed to check the compiler against it"
    run = ctypes.CDLL(name).bpf_filter
    run.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint, ctypes.c_uint)
    run.restype = ctypes.c_uint
    return run


def _libpcap(program: list[Instruction], packet: bytes) -> int:
    """What libpcap's interpreter returns for `program` on `packet`."""
    run = _bpf_filter()
    packed = b"".join(struct.pack("=HBBI", *instruction) for instruction in program)
    return int(run(packed, packet, len(packet), len(packet)))


@st.composite
def programs(draw: st.DrawFn) -> list[Instruction]:
    """Programs bpf_validate accepts, whose scratch memory is written before it is read
    (libpcap's is uninitialised; the kernel refuses programs that read it unset)."""
    body_length = draw(st.integers(1, 24))
    small = st.integers(0, 70)
    word = st.one_of(small, st.integers(0, 0xFFFFFFFF))
    body: list[Instruction] = [(0x00, 0, 0, draw(word))]
    body += [(0x02, 0, 0, slot) for slot in range(16)]
    last = len(body) + body_length  # where the final ret goes
    for pc in range(len(body), last):
        room = last - pc  # instructions after this one, the final ret included
        kind = draw(st.sampled_from(("ld", "ldx", "alu", "jump", "other", "ret")))
        if kind == "ld":
            code = draw(st.sampled_from(_LD_CODES))
            k = draw(st.integers(0, 15)) if code == 0x60 else draw(word)
        elif kind == "ldx":
            code = draw(st.sampled_from(_LDX_CODES))
            k = draw(st.integers(0, 15)) if code == 0x61 else draw(word)
        elif kind == "alu":
            op = draw(st.sampled_from(_ALU_OPS))
            code = 0x04 | op | (draw(st.sampled_from((0x00, 0x08))) if op != 0x80 else 0)
            k = draw(word)
            if op in (0x30, 0x90):
                k = k or 1
            elif op in (0x60, 0x70):
                k %= 32
        elif kind == "jump":
            op = draw(st.sampled_from((0x00, *_JUMP_OPS)))
            code = 0x05 | op | (draw(st.sampled_from((0x00, 0x08))) if op else 0)
            jt, jf = draw(st.integers(0, room - 1)), draw(st.integers(0, room - 1))
            k = jt if op == 0 else draw(word)
            body.append((code, 0, 0, k) if op == 0 else (code, jt, jf, k))
            continue
        elif kind == "other":
            code = draw(st.sampled_from(_OTHER_CODES))
            k = draw(st.integers(0, 15))
        else:
            code, k = draw(st.sampled_from(_RETURNS)), draw(word)
        body.append((code, 0, 0, k))
    body.append((draw(st.sampled_from(_RETURNS)), 0, 0, draw(word)))
    return body


@settings(max_examples=400, deadline=None)
@given(programs(), st.binary(max_size=90), st.integers(0, 20), st.binary(max_size=20))
def test_compiled_programs_return_what_libpcap_returns(
    program: list[Instruction], packet: bytes, offset: int, header: bytes
) -> None:
    frame = header.ljust(offset, b"\0")[:offset] + packet
    with cpu_bound(budget(len(program))):
        compiled = compile_program(program, offset)
        assert compiled(frame) == _libpcap(program, packet)


@pytest.fixture(scope="module")
def tcpdump_programs() -> list[tuple[list[Instruction], CompiledFilter]]:
    """Each expression's program, and that program compiled for packets at offset 14."""
    programs = [compile_filter(expression, "RAW") for expression in EXPRESSIONS]
    return [(program, compile_program(program, 14)) for program in programs]


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=20, max_size=80), st.integers(0, 3))
def test_tcpdump_programs_agree_on_ip_looking_packets(
    tcpdump_programs: list[tuple[list[Instruction], CompiledFilter]], packet: bytes, choice: int
) -> None:
    # Version nibbles 4 and 6 and the TCP protocol number reach the deep paths.
    version = (0x45, 0x60, 0x4F, 0x65)[choice]
    packet = bytes([version]) + packet[1:9] + b"\x06" + packet[10:]
    for program, compiled in tcpdump_programs:
        assert compiled(b"\xaa" * 14 + packet) == _libpcap(program, packet)


def test_every_tcpdump_program_compiles(
    tcpdump_programs: list[tuple[list[Instruction], CompiledFilter]],
) -> None:
    for program, compiled in tcpdump_programs:
        assert compiled(b"\xaa" * 14) == _libpcap(program, b"") == 0


@pytest.mark.parametrize(
    ("program", "why"),
    [
        ([], "empty"),
        ([(0x00, 0, 0, 1)], "past the program's end"),
        ([(0x05, 0, 0, 5), (0x06, 0, 0, 0)], "past the program's end"),
        ([(0x34, 0, 0, 0), (0x06, 0, 0, 0)], "division by the constant 0"),
        ([(0x64, 0, 0, 32), (0x06, 0, 0, 0)], "shift by 32"),
        ([(0x02, 0, 0, 16), (0x06, 0, 0, 0)], "scratch slot 16"),
        ([(0xFF, 0, 0, 0), (0x06, 0, 0, 0)], "unknown"),
        ([(0x0E, 0, 0, 0)], "unknown"),
    ],
)
def test_programs_bpf_validate_refuses_are_not_compiled(
    program: list[Instruction], why: str
) -> None:
    with pytest.raises(UncompilableProgramError, match=why):
        compile_program(program, 0)


def test_a_tree_too_deep_or_too_large_is_left_to_the_interpreter() -> None:
    # Each jump's two ways meet again: the tree doubles at every jump.
    chain = [(0x15, 0, 1, 1), (0x04, 0, 0, 1)] * (MAX_DEPTH + 1) + [(0x16, 0, 0, 0)]
    with (
        pytest.raises(UncompilableProgramError, match=r"nested jumps|statements"),
        cpu_bound(budget(len(chain))),
    ):
        compile_program(chain, 0)

"""Classic BPF for AF_PACKET sockets: compiled by tcpdump, attached with SO_ATTACH_FILTER."""

from __future__ import annotations

import ctypes
import shutil
import socket
import subprocess
from collections.abc import Sequence

from collector.capture.errors import LiveCaptureError

SO_ATTACH_FILTER = 26

Instruction = tuple[int, int, int, int]


class _SockFilter(ctypes.Structure):
    _fields_ = (
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    )


class _SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter)))


def compile_filter(expression: str, linktype: str = "RAW") -> list[Instruction]:
    """The classic BPF program for a pcap-filter expression on `linktype` (a DLT name)."""
    tcpdump = shutil.which("tcpdump")
    if tcpdump is None:
        raise LiveCaptureError("tcpdump is needed to compile capture filters (apt install tcpdump)")
    done = subprocess.run(
        [tcpdump, "-y", linktype, "-ddd", expression],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    if done.returncode != 0:
        raise LiveCaptureError(f"bad capture filter {expression!r}: {done.stderr.strip()}")
    lines = done.stdout.split("\n")
    count = int(lines[0])
    program = []
    for line in lines[1 : count + 1]:
        code, jt, jf, k = (int(field) for field in line.split())
        program.append((code, jt, jf, k))
    return program


def attach_filter(sock: socket.socket, program: Sequence[Instruction]) -> None:
    """Attach `program` to `sock` (the kernel copies it during the call)."""
    filters = (_SockFilter * len(program))(*(_SockFilter(*ins) for ins in program))
    fprog = _SockFprog(len(program), filters)
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, bytes(fprog))
    except OSError as exc:
        raise LiveCaptureError(f"cannot attach the capture filter: {exc}") from exc

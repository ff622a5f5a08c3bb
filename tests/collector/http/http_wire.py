"""Raw HTTP/1.1 bytes for one captured connection: its flow, its two directions (C, S),
requests, responses, chunked bodies and an SSE response head."""

from __future__ import annotations

from collections.abc import Sequence

from collector.tcp_reassembly import CLIENT_TO_SERVER, SERVER_TO_CLIENT, FlowInfo

FLOW = FlowInfo(4, b"\x0a\x00\x00\x01", 40000, b"\x0a\x00\x00\x02", 8000, (), 0)
C, S = CLIENT_TO_SERVER, SERVER_TO_CLIENT


def req(body: bytes = b'{"model":"m"}', path: str = "/v1/completions", extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: h\r\nContent-Type: application/json\r\n{extra}"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def resp(body: bytes = b'{"ok":1}', status: str = "200 OK", extra: str = "") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{extra}"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def chunked(parts: Sequence[bytes], *, ext: bool = False, trailers: bytes = b"") -> bytes:
    out = b""
    for i, part in enumerate(parts):
        out += f"{len(part):x}".encode() + (b";n=%d" % i if ext else b"") + b"\r\n" + part + b"\r\n"
    return out + b"0\r\n" + trailers + b"\r\n"


SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)

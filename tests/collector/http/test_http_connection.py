"""HTTP/1.1 over a reassembled connection: framing, pairing, codings, gaps, midstream, garbage."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Sequence

import brotli
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.http.exchange import Connection, HttpStats
from collector.http.messages import Exchange, ProblemKind
from collector.http.reader import HttpLimits
from collector.tcp_reassembly import CLIENT_TO_SERVER, SERVER_TO_CLIENT, FlowInfo

FLOW = FlowInfo(4, b"\x0a\x00\x00\x01", 40000, b"\x0a\x00\x00\x02", 8000, (), 0)
C, S = CLIENT_TO_SERVER, SERVER_TO_CLIENT


class Harness:
    def __init__(self, *, midstream: bool = False, limits: HttpLimits | None = None) -> None:
        self.exchanges: list[Exchange] = []
        self.stats = HttpStats()
        self.conn = Connection(
            FLOW,
            limits or HttpLimits(),
            lambda method, target: not target.startswith("/health"),
            self.exchanges.append,
            self.stats,
        )
        self.conn.on_start(C, midstream, 0)
        self.conn.on_start(S, midstream, 0)
        self.ts = 0

    def send(self, direction: int, data: bytes, sizes: Sequence[int] = ()) -> None:
        pos = 0
        cuts = list(sizes)
        while pos < len(data):
            size = cuts.pop(0) if cuts else len(data)
            self.ts += 1
            self.conn.on_data(direction, data[pos : pos + size], self.ts)
            pos += size

    def gap(self, direction: int, length: int) -> None:
        self.ts += 1
        self.conn.on_gap(direction, length, self.ts)

    def close(self, reason: str = "fin") -> list[Exchange]:
        self.ts += 1
        self.conn.on_end(C, reason, self.ts)
        self.conn.on_end(S, reason, self.ts)
        self.conn.on_close(reason, self.ts)
        return self.exchanges


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


def sse_events(n: int) -> list[bytes]:
    return [b'data: {"i": %d}\n\n' % i for i in range(n)] + [b"data: [DONE]\n\n"]


def test_keep_alive_many_exchanges_one_byte_at_a_time() -> None:
    h = Harness()
    for i in range(5):
        body = b'{"n": %d}' % i
        h.send(C, req(body), sizes=[1] * 500)
        h.send(S, resp(body * 2), sizes=[1] * 500)
    ex = h.close()
    assert [e.request.body for e in ex if e.request] == [b'{"n": %d}' % i for i in range(5)]
    assert [e.response.body for e in ex if e.response] == [b'{"n": %d}' % i * 2 for i in range(5)]
    assert all(not e.problems and not e.request.problems for e in ex if e.request)
    first = ex[0]
    assert first.request is not None and first.response is not None
    assert first.request.method == "POST" and first.request.target == "/v1/completions"
    assert first.response.status == 200 and first.response.reason == "OK"
    assert first.request.wire_body_length == 8 and first.response.wire_body_length == 16


def test_pipelined_requests_pair_in_order_in_one_segment_each_way() -> None:
    h = Harness()
    h.send(C, req(b"a") + req(b"b") + req(b"c"))
    h.send(S, resp(b"A") + resp(b"B", "404 Not Found") + resp(b"C"))
    ex = h.close()
    pairs = [(e.request.body, e.response.body, e.response.status) for e in ex]  # type: ignore[union-attr]
    assert pairs == [(b"a", b"A", 200), (b"b", b"B", 404), (b"c", b"C", 200)]


def test_chunked_with_extensions_and_trailers() -> None:
    h = Harness()
    h.send(C, req())
    body = chunked([b"hello ", b"world"], ext=True, trailers=b"X-T: 1\r\n")
    h.send(
        S,
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body + resp(b"next"),
        sizes=[3] * 200,
    )
    h.send(C, req())
    ex = h.close()
    assert ex[0].response is not None
    assert ex[0].response.body == b"hello world"
    assert ex[0].response.trailers == (("X-T", "1"),)
    assert ex[0].response.wire_body_length == len(body)
    assert ex[1].response is not None and ex[1].response.body == b"next"


def test_chunked_request_body() -> None:
    h = Harness()
    h.send(
        C,
        b"POST /v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        + chunked([b'{"a":', b"1}"]),
    )
    h.send(S, resp())
    (ex,) = h.close()
    assert ex.request is not None and ex.request.body == b'{"a":1}'


def test_content_codings_on_requests_and_responses() -> None:
    h = Harness()
    payload = b'{"x": "' + b"y" * 3000 + b'"}'
    h.send(C, req(gzip.compress(payload), extra="Content-Encoding: gzip\r\n"))
    h.send(S, resp(brotli.compress(payload), extra="Content-Encoding: br\r\n"))
    h.send(C, req(zlib.compress(payload), extra="Content-Encoding: deflate\r\n"))
    h.send(S, resp(b"not gzip", extra="Content-Encoding: gzip\r\n"))
    ex = h.close()
    assert ex[0].request is not None and ex[0].request.body == payload
    assert ex[0].request.content_encoding == "gzip"
    assert ex[0].response is not None and ex[0].response.body == payload
    assert ex[1].request is not None and ex[1].request.body == payload
    assert ex[1].response is not None
    assert [p.kind for p in ex[1].response.problems] == [ProblemKind.PARSE_ERROR]


def test_expect_100_continue() -> None:
    h = Harness()
    head, body = req(b"12345", extra="Expect: 100-continue\r\n").split(b"\r\n\r\n")
    h.send(C, head + b"\r\n\r\n")
    h.send(S, b"HTTP/1.1 100 Continue\r\n\r\n")
    h.send(C, body)
    h.send(S, resp(b"done"))
    (ex,) = h.close()
    assert ex.request is not None and ex.request.body == b"12345"
    assert ex.response is not None and ex.response.status == 200 and ex.response.body == b"done"
    assert h.stats.informational == 1


def test_bodiless_responses_head_204_304() -> None:
    h = Harness()
    h.send(C, b"HEAD /v1/models HTTP/1.1\r\n\r\n")
    h.send(S, b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n")
    h.send(C, req())
    h.send(S, b"HTTP/1.1 204 No Content\r\nContent-Length: 10\r\n\r\n")
    h.send(C, req())
    h.send(S, b"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n" + resp(b"x"))
    h.send(C, req())
    ex = h.close()
    assert [e.response.status for e in ex if e.response] == [200, 204, 304, 200]
    assert all(not e.response.problems for e in ex if e.response)
    assert ex[3].response is not None and ex[3].response.body == b"x"


def test_close_delimited_response_ends_with_fin() -> None:
    h = Harness()
    h.send(C, req())
    h.send(S, b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nsome body", sizes=[10, 10, 100])
    (ex,) = h.close("fin")
    assert ex.response is not None and ex.response.body == b"some body"
    assert not ex.response.problems
    h = Harness()
    h.send(C, req())
    h.send(S, b"HTTP/1.1 200 OK\r\n\r\ncut")
    (ex,) = h.close("rst")
    assert ex.response is not None and ex.response.problems[0].kind is ProblemKind.TRUNCATED


def test_sse_events_arrive_with_times_and_end_with_done() -> None:
    h = Harness()
    h.send(C, req())
    h.send(S, SSE_HEAD)
    for event in sse_events(3):
        h.send(S, chunked([event])[: -len(b"0\r\n\r\n")])
    h.send(S, b"0\r\n\r\n")
    (ex,) = h.close()
    assert ex.response is not None and ex.response.is_sse
    assert [e.data for e in ex.response.sse_events] == [
        '{"i": 0}',
        '{"i": 1}',
        '{"i": 2}',
        "[DONE]",
    ]
    times = [e.arrival_ns for e in ex.response.sse_events]
    assert times == sorted(times) and len(set(times)) == 4
    assert ex.response.body == b"".join(sse_events(3))


def test_gap_in_chunked_sse_resynchronises_at_next_chunk() -> None:
    h = Harness()
    h.send(C, req())
    h.send(S, SSE_HEAD)
    pieces = [chunked([e])[: -len(b"0\r\n\r\n")] for e in sse_events(6)]
    for i, piece in enumerate(pieces):
        if i in (2, 3):
            h.gap(S, len(piece) if i == 2 else 9)
            if i == 3:
                h.send(S, piece[9:])
            continue
        h.send(S, piece)
    h.send(S, b"0\r\n\r\n" + resp(b"after"))
    h.send(C, req())
    ex = h.close()
    response = ex[0].response
    assert response is not None
    assert [e.data for e in response.sse_events] == [
        '{"i": 0}',
        '{"i": 1}',
        '{"i": 4}',
        '{"i": 5}',
        "[DONE]",
    ]
    assert response.problems[0].kind is ProblemKind.GAP
    assert [(g.missing_bytes) for g in response.gaps] == [len(pieces[2]) + len(pieces[3])]
    assert ex[1].response is not None and ex[1].response.body == b"after"
    assert not ex[1].response.problems


def test_gap_in_content_length_body_keeps_framing() -> None:
    h = Harness()
    h.send(C, req(b"A" * 100))
    h.send(S, resp(b"B" * 300)[:-200])
    h.gap(S, 50)
    h.send(S, b"B" * 150 + resp(b"next"))
    h.send(C, req())
    ex = h.close()
    assert ex[0].response is not None
    assert ex[0].response.body == b"B" * 250
    assert ex[0].response.gaps[0].body_offset == 100 and ex[0].response.gaps[0].missing_bytes == 50
    assert ex[1].response is not None and ex[1].response.body == b"next"


def test_lost_request_makes_an_orphan_response_and_pairing_recovers() -> None:
    h = Harness()
    h.send(C, req(b"1"))
    h.send(S, resp(b"1"))
    h.gap(C, len(req(b"2")))
    h.send(S, resp(b"2"))
    h.send(C, req(b"3"))
    h.send(S, resp(b"3"))
    ex = h.close()
    got = [
        (e.request.body if e.request else None, e.response.body if e.response else None) for e in ex
    ]
    assert got == [(b"1", b"1"), (None, b"2"), (b"3", b"3")]
    assert ex[1].problems[0].kind is ProblemKind.NO_REQUEST


def test_midstream_pickup_skips_to_the_next_message() -> None:
    h = Harness(midstream=True)
    h.send(C, b'ng": 1}' + req(b"whole"))
    h.send(S, b'partial body of the previous response"}' + resp(b"whole"))
    (ex,) = h.close()
    assert ex.request is not None and ex.request.body == b"whole"
    assert not ex.problems and not ex.request.problems


def test_midstream_response_before_any_request_is_a_midstream_orphan() -> None:
    h = Harness(midstream=True)
    h.send(S, resp(b"early"))
    h.send(C, req(b"later"))
    h.send(S, resp(b"later"))
    ex = h.close()
    assert ex[0].request is None and ex[0].problems[0].kind is ProblemKind.MIDSTREAM
    assert ex[1].response is not None and ex[1].response.body == b"later"


def test_unknown_paths_are_counted_not_emitted() -> None:
    h = Harness()
    h.send(C, b"GET /health HTTP/1.1\r\n\r\n")
    h.send(S, resp(b"ok"))
    h.send(C, req())
    h.send(S, resp())
    ex = h.close()
    assert len(ex) == 1 and h.stats.not_recorded == 1


def test_unanswered_request_and_truncated_body() -> None:
    h = Harness()
    h.send(C, req(b"x" * 10)[:-4])
    (ex,) = h.close("rst")
    assert ex.response is None
    assert ex.request is not None and ex.request.problems[0].kind is ProblemKind.TRUNCATED
    assert ex.problems[0].kind is ProblemKind.NO_RESPONSE


def test_upgrade_stops_parsing() -> None:
    h = Harness()
    h.send(C, b"GET /v1/ws HTTP/1.1\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n")
    h.send(S, b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n\x81\x05hello")
    h.send(C, b"\x81\x85garbage")
    (ex,) = h.close()
    assert ex.response is not None and ex.response.status == 101
    assert h.stats.upgraded == 1


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=600), st.binary(max_size=600), st.lists(st.integers(1, 64), max_size=8))
def test_random_bytes_never_crash_and_end_as_parse_errors(
    client: bytes, server: bytes, sizes: list[int]
) -> None:
    h = Harness()
    h.send(C, client, sizes)
    h.send(S, server, sizes)
    for ex in h.close():
        problems = [p for m in (ex.request, ex.response) if m for p in m.problems] + list(
            ex.problems
        )
        assert problems, "garbage must never look complete"
        assert all(p.reason for p in problems)


def test_garbage_request_is_a_parse_error_with_a_reason() -> None:
    h = Harness()
    h.send(C, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 TLS hello")
    (ex,) = h.close()
    assert ex.request is not None
    assert ex.request.problems[0].kind is ProblemKind.PARSE_ERROR
    assert "bad message head" in ex.request.problems[0].reason

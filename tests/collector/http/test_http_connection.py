"""HTTP/1.1 over a reassembled connection: framing, pairing, codings, gaps, midstream, garbage."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Sequence
from pathlib import Path

import brotli
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from veritap.config_schema import ConfigError

from collector.config import load_config
from collector.http.exchange import Connection, HttpStats
from collector.http.messages import Exchange, LateAmbiguity, ProblemKind
from collector.http.reader import HttpLimits
from collector.tcp_reassembly import StreamAmbiguity
from tests.collector.http.http_wire import FLOW, SSE_HEAD, C, S, chunked, req, resp
from tests.cpu_bound import budget, cpu_bound


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


def test_a_negative_chunk_size_is_a_parse_error_and_capture_goes_on() -> None:
    """`-6` once made the framer rewind to its own line forever: one packet stopped all capture."""
    h = Harness()
    with cpu_bound(2.0):
        h.send(C, req(b"1"))
        h.send(S, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-6\r\nabcdef\r\n0\r\n\r\n")
        h.send(C, req(b"2"))
        h.send(S, resp(b"two"))
        ex = h.close()
    first, second = (e.response for e in ex)
    assert first is not None and first.problems[0].kind is ProblemKind.PARSE_ERROR
    assert "chunk-size" in first.problems[0].reason
    assert second is not None and second.body == b"two" and not second.problems


def test_chunk_data_without_its_crlf_is_a_parse_error_after_whole_chunks() -> None:
    """Whole chunks skip llhttp (`ChunkFramer.whole_chunk`); one whose data runs on past
    its size still reaches it and is refused, and what came before is kept."""
    h = Harness()
    h.send(C, req(b"1"))
    h.send(S, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    h.send(S, b"3\r\nabc\r\n")
    h.send(S, b"3\r\ndefXY\r\n0\r\n\r\n")
    h.send(C, req(b"2"))
    h.send(S, resp(b"two"))
    first, second = (e.response for e in h.close())
    assert first is not None and first.problems[0].kind is ProblemKind.PARSE_ERROR
    assert first.body.startswith(b"abc")
    assert second is not None and second.body == b"two" and not second.problems


def test_every_content_encoding_line_is_applied_in_order() -> None:
    payload = b'{"x": "' + b"y" * 500 + b'"}'
    h = Harness()
    h.send(C, req())
    h.send(
        S,
        resp(
            brotli.compress(gzip.compress(payload)),
            extra="Content-Encoding: gzip\r\nContent-Encoding: br\r\n",
        ),
    )
    (ex,) = h.close()
    assert ex.response is not None and not ex.response.problems
    assert ex.response.body == payload and ex.response.content_encoding == "gzip, br"


def test_framing_follows_the_last_transfer_encoding_line() -> None:
    h = Harness()
    h.send(C, req(b"1"))
    te = "Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n"
    h.send(S, f"HTTP/1.1 200 OK\r\n{te}\r\n".encode() + chunked([b"abc"]) + resp(b"next"))
    h.send(C, req(b"2"))
    ex = h.close()
    assert [(e.response.body, e.response.problems) for e in ex if e.response] == [
        (b"abc", ()),
        (b"next", ()),
    ]


@pytest.mark.parametrize("unit", [b"HTTP/1.1 200 ", b"GET /", b"1\r\n", b"0;", b"\n"])
def test_resync_over_256_kib_of_hostile_bytes_is_linear_and_finds_the_next_response(
    unit: bytes,
) -> None:
    """The start-line regex and chunk search once backtracked here: 256 KB took ~50 minutes."""
    h = Harness()
    h.send(C, req(b"1"))
    h.send(S, SSE_HEAD + chunked([b"data: 1\n\n"])[:-5])
    h.gap(S, 10)
    junk = unit * (256 * 1024 // len(unit))
    with cpu_bound(budget(len(junk), 2e-6)):
        h.send(S, junk + b"\n", sizes=[1460] * (len(junk) // 1460 + 1))
        h.send(S, resp(b"after"))
    h.send(C, req(b"2"))
    ex = h.close()
    assert ex[0].response is not None and ex[0].response.problems[0].kind is ProblemKind.GAP
    assert ex[-1].response is not None and ex[-1].response.body == b"after"


def test_a_start_line_across_the_end_of_the_resync_window_is_still_found() -> None:
    h = Harness(limits=HttpLimits(resync_window_bytes=1024))
    h.send(C, req(b"1"))
    h.send(S, SSE_HEAD + chunked([b"data: 1\n\n"])[:-5])
    h.gap(S, 10)
    following = resp(b"after")
    h.send(S, b"z" * 1020 + following[:10])
    h.send(S, following[10:])
    h.send(C, req(b"2"))
    ex = h.close()
    assert [p.kind for p in ex[0].response.problems] == [ProblemKind.GAP, ProblemKind.GAP]  # type: ignore[union-attr]
    assert ex[1].response is not None and ex[1].response.body == b"after"
    assert not ex[1].response.problems


def test_an_endless_head_is_cut_at_the_cap_and_the_scan_goes_on_in_the_same_segment() -> None:
    h = Harness(limits=HttpLimits(max_head_bytes=1024))
    h.send(C, req(b"1"))
    h.send(S, b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 200_000 + resp(b"next"))
    h.send(C, req(b"2"))
    ex = h.close()
    first, second = (e.response for e in ex)
    assert first is not None and "longer than 1024" in first.problems[0].reason
    assert second is not None and second.body == b"next"


def test_a_long_start_line_split_into_single_bytes_is_found_at_a_pickup() -> None:
    h = Harness(midstream=True)
    long_target = "/v1/completions?" + "q" * 300
    h.send(C, b'tail of a body"}' + req(b"whole", path=long_target), sizes=[1] * 1000)
    h.send(S, resp(b"ok"))
    (ex,) = h.close()
    assert ex.request is not None and ex.request.target == long_target
    assert ex.request.body == b"whole" and not ex.request.problems


def test_an_sse_line_over_the_cap_makes_the_response_truncated() -> None:
    h = Harness(limits=HttpLimits(max_sse_line_bytes=100))
    h.send(C, req())
    events = [b"data: 1\n\n", b"data: " + b"x" * 200 + b"\n\n", b"data: [DONE]\n\n"]
    h.send(S, SSE_HEAD + chunked(events))
    (ex,) = h.close()
    assert ex.response is not None
    assert [e.data for e in ex.response.sse_events] == ["1", "[DONE]"]
    assert [p.kind for p in ex.response.problems] == [ProblemKind.TRUNCATED]
    assert "1 SSE event(s) not kept" in ex.response.problems[0].reason


@pytest.mark.parametrize(
    ("toml", "kept"),
    [("max_sse_events = 2", ["1", "2"]), ("max_sse_line_bytes = 1024", ["1", "[DONE]"])],
)
def test_the_sse_caps_are_set_in_the_http_section(
    tmp_path: Path, toml: str, kept: list[str]
) -> None:
    path = tmp_path / "collector.toml"
    path.write_text(f"[http]\n{toml}\n")
    h = Harness(limits=load_config(path).http.limits())
    h.send(C, req())
    events = [b"data: 1\n\n", b"data: 2" + b"x" * 2000 + b"\n\n", b"data: [DONE]\n\n"]
    h.send(S, SSE_HEAD + chunked(events))
    (ex,) = h.close()
    assert ex.response is not None
    assert [e.data[:1] if e.data[:1] == "2" else e.data for e in ex.response.sse_events] == kept
    assert [p.kind for p in ex.response.problems] == [ProblemKind.TRUNCATED]


@pytest.mark.parametrize("toml", ["max_sse_events = 0", "max_sse_line_bytes = 10"])
def test_sse_caps_below_their_minimum_are_refused_by_name(tmp_path: Path, toml: str) -> None:
    path = tmp_path / "collector.toml"
    path.write_text(f"[http]\n{toml}\n")
    with pytest.raises(ConfigError, match=toml.split(maxsplit=1)[0]):
        load_config(path)


def test_an_ambiguity_marks_the_messages_whose_bytes_it_covers() -> None:
    """Reported ahead of its bytes, or late while the record waits for its answer, a range
    marks the message that holds it, never the one finishing at the time."""
    h = Harness()
    one, two = req(b'{"n": 1}'), req(b'{"n": 2}')
    h.send(C, one[:10])
    ahead = StreamAmbiguity(C, len(one) + 3, len(one) + 6, (b"a", b"b"))
    h.conn.on_ambiguous(ahead, h.ts)  # a buffered copy of request two's bytes conflicts
    h.send(C, one[10:])
    h.send(C, two)
    late = StreamAmbiguity(C, 2, 4, (b"c", b"d"))  # request one is whole, still unanswered
    h.conn.on_ambiguous(late, h.ts)
    h.send(S, resp(b"1") + resp(b"2"))
    answered = StreamAmbiguity(S, 0, 4, (b"e", b"f"))  # after its record was emitted
    h.conn.on_ambiguous(answered, h.ts)
    first, second = h.close()
    assert first.request is not None and first.request.ambiguities == (late,)
    assert second.request is not None and second.request.ambiguities == (ahead,)
    assert first.response is not None and second.response is not None
    assert first.response.ambiguities == second.response.ambiguities == ()
    assert h.stats.late_ambiguities == 1


def test_a_late_ambiguity_names_the_records_that_hold_its_bytes() -> None:
    """Records are written once: a differing copy of bytes already in one is reported on
    its own with that record's id (the sink's answer); one inside an exchange that is not
    recorded (an unknown path) is only counted."""
    late: list[LateAmbiguity] = []
    ids: list[str] = []

    def sink(exchange: Exchange) -> str:
        ids.append(f"record-{len(ids)}")
        return ids[-1]

    stats = HttpStats()
    conn = Connection(
        FLOW, HttpLimits(), lambda m, t: t != "/health", sink, stats, late=late.append
    )
    conn.on_start(C, False, 0)
    conn.on_start(S, False, 0)
    first, health, third = req(b'{"n": 1}'), req(path="/health"), req(b'{"n": 3}')
    answers = [resp(b"1"), resp(b"2"), resp(b"3")]
    for ts, (request, answer) in enumerate(zip([first, health, third], answers, strict=True)):
        conn.on_data(C, request, 10 * ts + 1)
        conn.on_data(S, answer, 10 * ts + 2)
    assert ids == ["record-0", "record-1"]
    in_first = StreamAmbiguity(S, 3, 9, (b"a", b"b"))
    in_health = StreamAmbiguity(C, len(first) + 2, len(first) + 4, (b"c", b"d"))
    across = StreamAmbiguity(C, len(first) - 2, len(first) + len(health) + 2, (b"e", b"f"))
    for ambiguity in (in_first, in_health, across):
        conn.on_ambiguous(ambiguity, 40)
    assert stats.late_ambiguities == 3
    assert late == [
        LateAmbiguity(FLOW, in_first, ("record-0",)),
        LateAmbiguity(FLOW, across, ("record-0", "record-1")),
    ]


def _traffic() -> tuple[bytes, bytes]:
    """A keep-alive connection of the kinds the API sees: JSON, gzip, chunked SSE, pipelined."""
    client = (
        req(b'{"model": "m"}')
        + req(b'{"stream": true}')
        + req(gzip.compress(b"{}"), extra="Content-Encoding: gzip\r\n")
    )
    server = (
        resp(b'{"choices": []}')
        + SSE_HEAD
        + chunked(sse_events(3), ext=True)
        + resp(gzip.compress(b'{"ok": 1}'), extra="Content-Encoding: gzip\r\n")
    )
    return client, server


_EDITS = st.lists(
    st.tuples(
        st.sampled_from(["flip", "insert", "delete", "gap"]),
        st.integers(0, 2000),
        st.binary(min_size=1, max_size=8),
    ),
    max_size=4,
)


def _mutate(data: bytes, edits: list[tuple[str, int, bytes]]) -> tuple[bytes, set[int]]:
    """Apply byte edits; "gap" edits mark positions where the direction loses 1..8 bytes."""
    out = bytearray(data)
    holes: set[int] = set()
    for kind, where, value in edits:
        at = where % (len(out) + 1)
        if kind == "flip" and at < len(out):
            out[at] = value[0]
        elif kind == "insert":
            out[at:at] = value
        elif kind == "delete":
            del out[at : at + len(value)]
        elif kind == "gap":
            holes.add(at)
    return bytes(out), holes


def _send_with_holes(h: Harness, direction: int, data: bytes, holes: set[int], step: int) -> None:
    """Send `data` in `step`-byte segments; at each hole the next 1..4 bytes are lost instead."""
    pos = 0
    for hole in [*sorted(holes), len(data)]:
        if hole < pos:
            continue
        h.send(direction, data[pos:hole], sizes=[step] * (len(data) // step + 1))
        lost = min(4, len(data) - hole)
        if lost:
            h.gap(direction, lost)
        pos = hole + lost


@settings(max_examples=300, deadline=None)
@given(_EDITS, _EDITS, st.integers(1, 1500))
def test_fuzz_mutated_traffic_never_crashes_and_stays_bounded(
    client_edits: list[tuple[str, int, bytes]],
    server_edits: list[tuple[str, int, bytes]],
    step: int,
) -> None:
    """Both readers over mutated real traffic: every message ends, problems have reasons."""
    client, server = _traffic()
    client, client_holes = _mutate(client, client_edits)
    server, server_holes = _mutate(server, server_edits)
    h = Harness()
    with cpu_bound(budget(len(client) + len(server))):
        _send_with_holes(h, C, client, client_holes, step)
        _send_with_holes(h, S, server, server_holes, step)
        exchanges = h.close()
    for ex in exchanges:
        assert ex.request is not None or ex.response is not None
        for message in (ex.request, ex.response):
            assert message is None or all(p.reason for p in message.problems)
    if not client_edits and not server_edits:
        assert len(exchanges) == 3
        assert all(not e.problems and not e.request.problems for e in exchanges if e.request)

"""The request and response readers alone, fuzzed: any bytes, holes and splits; bounded CPU.

A reader's messages must not depend on how the stream was split into segments
(the start-line scan, the chunk boundary search, head and SSE scanning all
resume where they stopped), so each mutated stream is fed twice, whole and in
small pieces, with holes at the same offsets, and the messages compared up to
the first one llhttp refuses: where scanning resumes after a refusal depends on
the segment the bad byte came in (llhttp does not say where it stopped).
"""

from __future__ import annotations

import gzip

from hypothesis import given, settings
from hypothesis import strategies as st

from collector.http.messages import ProblemKind, RequestMessage, ResponseMessage
from collector.http.reader import (
    HttpLimits,
    RequestListener,
    RequestReader,
    ResponseListener,
    ResponseReader,
)
from tests.cpu_bound import budget, cpu_bound
from tests.openai_traffic import Call, words

Message = RequestMessage | ResponseMessage


class Listener(RequestListener, ResponseListener):
    """Keeps every message a reader delivers."""

    def __init__(self) -> None:
        self.messages: list[Message] = []

    def request_started(self, ts_ns: int) -> None:
        return

    def request_head(self, method: str, target: str) -> bool:
        return True

    def request_done(self, message: RequestMessage) -> None:
        self.messages.append(message)

    def response_head(self, status: int, ts_ns: int) -> tuple[str, bool]:
        return "POST", True

    def response_done(self, message: ResponseMessage) -> None:
        self.messages.append(message)


def _calls() -> list[Call]:
    return [
        Call(
            "/v1/chat/completions",
            "m",
            [{"role": "user", "content": "hi " * n}],
            {"stream": True} if n % 2 else {},
            [words(n, seed=n)],
        )
        for n in (3, 8, 5)
    ]


REQUESTS = b"".join(c.request() for c in _calls()) + (
    b"POST /v1/completions HTTP/1.1\r\nContent-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n"
    b"\r\n" + b"%x\r\n" % len(gzip.compress(b"{}")) + gzip.compress(b"{}") + b"\r\n0\r\n\r\n"
)
RESPONSES = b"".join(c.response() for c in _calls())

TOKENS = [b"\r\n", b"\r", b"\n", b"-6", b"0x", b";", b"HTTP/1.1 200 ", b"GET /", b" HTTP/1.1\r\n"]
TOKENS += [b"data: ", b"0\r\n\r\n", b"Content-Length: 3\r\n", b"ffff\r\n"]
EDITS = st.lists(
    st.tuples(
        st.sampled_from(["flip", "insert", "token", "delete"]),
        st.integers(0, 5000),
        st.binary(min_size=1, max_size=6),
        st.sampled_from(TOKENS),
    ),
    max_size=5,
)


def mutate(data: bytes, edits: list[tuple[str, int, bytes, bytes]]) -> bytes:
    out = bytearray(data)
    for kind, where, value, token in edits:
        at = where % (len(out) + 1)
        if kind == "flip" and at < len(out):
            out[at] = value[0]
        elif kind == "insert":
            out[at:at] = value
        elif kind == "token":
            out[at:at] = token
        elif kind == "delete":
            del out[at : at + len(value)]
    return bytes(out)


def read(
    requests: bool, data: bytes, holes: set[int], segment: int, midstream: bool
) -> list[tuple[object, ...]]:
    """Feed `data` in `segment`-byte pieces, losing 3 bytes at each hole; the messages read
    up to the first refused one."""
    listener = Listener()
    limits = HttpLimits(max_head_bytes=2048, max_sse_line_bytes=256, max_sse_events=16)
    reader = RequestReader(limits, listener) if requests else ResponseReader(limits, listener)
    reader.start(midstream)
    pos = 0
    for hole in [*sorted(holes), len(data)]:
        if hole < pos:
            continue
        for at in range(pos, hole, segment):
            reader.feed(data[at : min(at + segment, hole)], 1)
        lost = min(3, len(data) - hole)
        if lost:
            reader.gap(lost, 1)
        pos = hole + lost
    reader.end("fin", 2)
    shapes = []
    for message in listener.messages:
        shapes.append(_shape(message))
        if _refused(message):
            break
    return shapes


def _refused(message: Message) -> bool:
    return any(p.kind is ProblemKind.PARSE_ERROR for p in message.problems)


def _shape(message: Message) -> tuple[object, ...]:
    """What a message says, without capture times; of a refused one, only that it was.

    Which check refuses a bad byte first, llhttp's or the framer's, and how many headers
    httptools handed over before it, depend on the segment the byte came in.
    """
    if _refused(message):
        return ("refused",)
    common = (
        message.headers,
        message.trailers,
        message.body,
        message.wire_body_length,
        message.gaps,
        message.problems,
    )
    if isinstance(message, RequestMessage):
        return (message.method, message.target, *common)
    events = tuple((e.event, e.data, e.id) for e in message.sse_events)
    return (message.status, message.reason, *common, events)


@settings(max_examples=250, deadline=None)
@given(
    st.booleans(),
    EDITS,
    st.sets(st.integers(0, 5000), max_size=3),
    st.integers(1, 700),
    st.booleans(),
)
def test_fuzz_readers_give_the_same_messages_however_split_within_a_cpu_bound(
    requests: bool,
    edits: list[tuple[str, int, bytes, bytes]],
    holes: set[int],
    segment: int,
    midstream: bool,
) -> None:
    data = mutate(REQUESTS if requests else RESPONSES, edits)
    holes = {h % (len(data) + 1) for h in holes}
    with cpu_bound(budget(len(data))):
        whole = read(requests, data, holes, 100_000, midstream)
        split = read(requests, data, holes, segment, midstream)
    assert split == whole


def test_unmutated_traffic_reads_clean() -> None:
    for requests, data, count in ((True, REQUESTS, 4), (False, RESPONSES, 3)):
        messages = read(requests, data, set(), 7, midstream=False)
        assert len(messages) == count
        assert all(not shape[7] for shape in messages)

"""Pairing responses with requests when messages are lost: never a shifted pair.

Each test drives a `Connection` with capture times spaced like real traffic
(milliseconds apart, the TAP skew tolerance is 100 ms) and numbered bodies, so
a pair is right exactly when its request and response carry the same number.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from collector.config import CollectorConfig, load_config
from collector.http.exchange import Connection, HttpStats
from collector.http.messages import Exchange, ProblemKind
from collector.http.reader import HttpLimits
from tests.collector.http.http_wire import FLOW, SSE_HEAD, C, S, chunked, req, resp
from tests.cpu_bound import budget, cpu_bound

MS = 1_000_000


class Wire:
    """A connection fed message by message at explicit capture times (ms)."""

    def __init__(self, *, skew_ms: int = 100, midstream: bool = False) -> None:
        self.exchanges: list[Exchange] = []
        self.stats = HttpStats()
        self.conn = Connection(
            FLOW,
            HttpLimits(response_skew_ns=skew_ms * MS),
            lambda method, target: True,
            self.exchanges.append,
            self.stats,
        )
        self.conn.on_start(C, midstream, 0)
        self.conn.on_start(S, midstream, 0)
        self.now = 0

    def send(self, direction: int, data: bytes, at_ms: int, pieces: int = 1) -> None:
        self.now = max(at_ms * MS, self.now + 1)  # capture times never go back
        size = -(-len(data) // pieces)
        for i in range(0, len(data), size):
            self.conn.on_data(direction, data[i : i + size], self.now)
            self.now += 1

    def lose(self, direction: int, length: int, at_ms: int) -> None:
        self.conn.on_gap(direction, length, at_ms * MS)

    def close(self) -> list[Exchange]:
        self.now += 1
        self.conn.on_end(C, "fin", self.now)
        self.conn.on_end(S, "fin", self.now)
        self.conn.on_close("fin", self.now)
        return self.exchanges


def request(n: int) -> bytes:
    return req(b'{"n": %d}' % n)


def response(n: int) -> bytes:
    return resp(b'{"answer": %d}' % n)


def number(body: bytes) -> int:
    return int(body.split(b":")[1].strip(b" }"))


@dataclass(frozen=True)
class Outcome:
    pairs: list[tuple[int, int]]  # (request, response) numbers of records with both
    clean: list[tuple[int, int]]  # ... of those without any problem
    requests: dict[int, set[ProblemKind]]  # requests without a response: their problems
    responses: dict[int, set[ProblemKind]]  # responses without a request: their problems


def outcome(exchanges: list[Exchange]) -> Outcome:
    pairs, clean = [], []
    requests: dict[int, set[ProblemKind]] = {}
    responses: dict[int, set[ProblemKind]] = {}
    for ex in exchanges:
        kinds = {p.kind for p in ex.problems}
        if ex.request is not None and ex.response is not None:
            pair = (number(ex.request.body), number(ex.response.body))
            pairs.append(pair)
            problems = ex.problems or ex.request.problems or ex.response.problems
            if not problems:
                clean.append(pair)
        elif ex.request is not None:
            requests[number(ex.request.body)] = kinds
        elif ex.response is not None:
            responses[number(ex.response.body)] = kinds
    return Outcome(pairs, clean, requests, responses)


def keep_alive(wire: Wire, n: int, *, lost_head: int = -1, lost_whole: int = -1) -> None:
    """`n` exchanges one after the other, 10 ms apart; one response head or one response lost."""
    for i in range(n):
        wire.send(C, request(i), 10 * i)
        data = response(i)
        if i == lost_head:
            head = data.index(b"\r\n\r\n") + 4
            wire.lose(S, head, 10 * i + 2)
            wire.send(S, data[head:], 10 * i + 3)
        elif i == lost_whole:
            wire.lose(S, len(data), 10 * i + 3)
        else:
            wire.send(S, data, 10 * i + 2, pieces=2)


def test_a_lost_response_head_loses_one_response_and_shifts_nothing() -> None:
    wire = Wire()
    keep_alive(wire, 50, lost_head=7)
    got = outcome(wire.close())
    assert got.clean == [(i, i) for i in range(50) if i != 7]
    assert got.requests == {7: {ProblemKind.RESPONSE_LOST}}
    assert not got.responses


def test_a_whole_lost_response_loses_one_response_and_shifts_nothing() -> None:
    wire = Wire()
    keep_alive(wire, 30, lost_whole=0)
    got = outcome(wire.close())
    assert got.clean == [(i, i) for i in range(1, 30)]
    assert got.requests == {0: {ProblemKind.RESPONSE_LOST}}


def test_a_lost_exchange_leaves_the_others_paired() -> None:
    wire = Wire()
    for i in range(10):
        if i == 4:
            wire.lose(C, len(request(i)), 10 * i + 1)
            wire.lose(S, len(response(i)), 10 * i + 3)
            continue
        wire.send(C, request(i), 10 * i)
        wire.send(S, response(i), 10 * i + 2)
    got = outcome(wire.close())
    assert got.clean == [(i, i) for i in range(10) if i != 4]
    assert not got.requests and not got.responses


def test_a_lost_request_makes_its_response_an_orphan() -> None:
    wire = Wire()
    for i in range(6):
        if i == 2:
            wire.lose(C, len(request(i)), 10 * i)
        else:
            wire.send(C, request(i), 10 * i)
        wire.send(S, response(i), 10 * i + 2)
    got = outcome(wire.close())
    assert got.clean == [(i, i) for i in range(6) if i != 2]
    assert got.responses == {2: {ProblemKind.NO_REQUEST}}


def test_a_response_captured_before_its_request_within_the_skew_pairs_cleanly() -> None:
    wire = Wire()
    for i in range(5):
        # The TAP delivers the response's first segment 3 ms before the request's segment.
        wire.send(S, response(i)[:20], 100 * i)
        wire.send(C, request(i), 100 * i + 3)
        wire.send(S, response(i)[20:], 100 * i + 5)
    got = outcome(wire.close())
    assert got.clean == [(i, i) for i in range(5)]
    assert not got.requests and not got.responses


def test_a_response_before_its_request_beyond_the_skew_is_an_orphan() -> None:
    wire = Wire(skew_ms=1)
    wire.send(S, response(0), 0)
    wire.send(C, request(0), 50)
    got = outcome(wire.close())
    assert got.responses == {0: {ProblemKind.NO_REQUEST}}
    assert got.requests == {0: {ProblemKind.NO_RESPONSE}}


def test_skew_does_not_take_a_request_from_the_response_that_answers_it() -> None:
    wire = Wire(midstream=True)
    wire.send(S, response(99), 0)  # the answer to a request sent before the capture began
    wire.send(C, request(1), 2)
    wire.send(S, response(1), 4)
    got = outcome(wire.close())
    assert got.clean == [(1, 1)]
    assert got.responses == {99: {ProblemKind.MIDSTREAM}}


def test_pipelined_requests_with_a_lost_response_are_never_shifted() -> None:
    wire = Wire()
    wire.send(C, b"".join(request(i) for i in range(6)), 0)
    for i in range(6):
        if i == 2:
            wire.lose(S, len(response(i)), 5 + i)
        else:
            wire.send(S, response(i), 5 + i)
    got = outcome(wire.close())
    assert all(a == b for a, b in got.pairs), got.pairs
    assert got.clean[:2] == [(0, 0), (1, 1)]
    assert wire.stats.pipelined_connections == 1
    unknown = {ProblemKind.REQUEST_UNKNOWN}
    assert all(kinds == unknown for kinds in got.responses.values())
    assert got.responses, "the responses after the loss cannot be paired by order or time"
    assert 2 in got.requests


def test_sse_response_with_a_lost_head_does_not_shift_the_next_pair() -> None:
    wire = Wire()
    wire.send(C, request(0), 0)
    events = [b'data: {"i": %d}\n\n' % i for i in range(5)] + [b"data: [DONE]\n\n"]
    stream = SSE_HEAD + chunked(events)
    wire.lose(S, len(SSE_HEAD) + 7, 2)
    wire.send(S, stream[len(SSE_HEAD) + 7 :], 3)
    wire.send(C, request(1), 20)
    wire.send(S, response(1), 22)
    got = outcome(wire.close())
    assert got.clean == [(1, 1)]
    assert got.requests == {0: {ProblemKind.RESPONSE_LOST}}


def test_a_pipelining_client_that_loses_the_requests_showing_it_gets_no_shifted_pair() -> None:
    """Requests sent one ahead; request 1 (the one that would show the pipelining) and
    response 1 are lost. By time alone this reads as a client that waited, with one more
    response lost, so response 2 would pair with request 3; counting one message per
    marker says request 2. They disagree: the records say the pairing is unknown."""
    got = outcome(play(2, 10, {1: "both"}, seed=3028934729))
    assert got.pairs == [(0, 0)]
    assert got.responses == {key: {ProblemKind.REQUEST_UNKNOWN} for key in range(2, 10)}
    assert got.requests == {key: {ProblemKind.RESPONSE_UNKNOWN} for key in range(2, 10)}


def test_two_gaps_in_one_marker_are_not_counted_as_one_lost_request() -> None:
    got = outcome(play(2, 12, {1: "request", 2: "request"}, seed=232875792))
    assert got.pairs == [(0, 0)]
    assert got.responses[1] == {ProblemKind.NO_REQUEST}
    assert set(got.requests) == set(range(3, 12))


def test_a_client_that_waits_still_pairs_across_a_lost_exchange() -> None:
    got = outcome(play(1, 10, {1: "both"}, seed=5))
    assert got.clean == [(i, i) for i in range(10) if i != 1]


@st.composite
def conversations(draw: st.DrawFn) -> tuple[int, int, dict[int, str]]:
    """(pipelining depth, exchanges, what is lost per exchange: request / head / response /
    both). Depth 1 is one request at a time; deeper clients send requests ahead, so a lost
    request can hide the pipelining that would rule out the one-at-a-time reading."""
    depth = draw(st.sampled_from([1, 1, 2, 3, 25]))
    n = draw(st.integers(1, 25))
    kinds = ["request", "head", "response", "both"]
    losses = draw(st.dictionaries(st.integers(0, n - 1), st.sampled_from(kinds), max_size=4))
    return depth, n, losses


def play(depth: int, n: int, losses: dict[int, str], seed: int) -> list[Exchange]:
    wire = Wire()
    rng = random.Random(seed)
    t = sent = 0
    for i in range(n):
        lost = losses.get(i, "")
        while sent < min(n, i + depth):
            t += rng.randint(1, 30) if depth == 1 else rng.randint(0, 2)
            if losses.get(sent) in ("request", "both"):
                wire.lose(C, len(request(sent)), t)
            else:
                wire.send(C, request(sent), t, pieces=rng.randint(1, 3))
            sent += 1
        t += rng.randint(1, 30)
        data = response(i)
        if lost == "head":
            head = data.index(b"\r\n\r\n") + 4
            wire.lose(S, head, t)
            wire.send(S, data[head:], t + 1)
        elif lost in ("response", "both"):
            wire.lose(S, len(data), t)
        else:
            wire.send(S, data, t, pieces=rng.randint(1, 3))
    return wire.close()


@settings(max_examples=600, deadline=None)
@given(conversations(), st.integers(0, 2**32))
def test_losses_never_give_a_wrong_pair(
    conversation: tuple[int, int, dict[int, str]], seed: int
) -> None:
    depth, n, losses = conversation
    with cpu_bound(budget(n * 200)):  # a hang or a quadratic case fails the example
        exchanges = play(depth, n, losses, seed)
    got = outcome(exchanges)
    assert all(a == b for a, b in got.pairs), (got.pairs, losses)
    seen_requests = [i for i in range(n) if losses.get(i) not in ("request", "both")]
    seen_responses = [i for i in range(n) if losses.get(i) not in ("head", "response", "both")]
    recorded = sorted(number(ex.request.body) for ex in exchanges if ex.request is not None)
    assert recorded == seen_requests, "every request seen is one record"
    answered = sorted(number(ex.response.body) for ex in exchanges if ex.response is not None)
    assert answered == seen_responses, "every response seen whole is one record"
    if depth == 1 and len(losses) <= 1:
        whole = [i for i in range(n) if i not in losses]
        assert got.clean == [(i, i) for i in whole], "one at a time, every whole exchange pairs"


def test_the_skew_tolerance_is_configured_in_the_http_section(tmp_path: Path) -> None:
    path = tmp_path / "collector.toml"
    path.write_text("[http]\nresponse_skew_s = 0.02\n")
    assert load_config(path).http.limits().response_skew_ns == 20 * MS
    assert CollectorConfig().http.limits().response_skew_ns == 100 * MS

"""Fuzz benchmark: mutated inputs through each HTTP-layer parser; crashes, hangs, slowest rate.

Parsers, driven directly (they are sans-IO): the chunk framer, the body decoder
(gzip, deflate, br, stacked), the SSE parser, and the request and response
readers over one direction of a keep-alive connection (sometimes picked up
midstream). Seeds are typical traffic: chat calls shaped as vLLM serves them
(tests/openai_traffic.py), half streamed. Each input is a seed changed by 1-4
edits: byte flips, random or protocol-token inserts (`\\r\\n`, `-6`,
`HTTP/1.1 200 `, `data: `, ...), deletions, truncation, a splice with another
seed, or a slice repeated up to 256 KiB (the shape of the inputs that once
backtracked or re-scanned). The SSE parser and the readers also get holes
(gaps of 4 bytes) in a fifth of the inputs.

- crash: any exception but the parser's own error type (target 0)
- hang: an input over its CPU bound, 0.5 s + 2 µs per byte, enforced with
  ITIMER_PROF (tests/cpu_bound.py; target 0)
- rate: bytes per CPU second (the thread's CPU clock) of every input of at
  least 16 KiB, fed in 1460-byte segments, against typical traffic: keep-alive
  connections of bench/capture.py's mix of calls (half streamed, 100..5000
  tokens), both directions through both readers (the whole HTTP layer: llhttp,
  framing, decoding, SSE), fed the same way in the same run. An input whose
  first timing would rank it among the slowest is timed again and ranked by the
  faster of the two (a burst of another process's load slows one timing, not
  the input); the 20 slowest kept are re-measured (a slow spell can outlast
  both timings, so more are kept than a parser's slow shapes need) and the
  worst is reported (target >= 0.1x). Each re-measure is 5 pairs, one round of
  typical traffic then the input, and an input's ratio is the median of its
  paired ratios, so that a slow spell of a shared machine slows both sides of
  a ratio rather than one. Smaller inputs get segments of 1
  to 9000 bytes and count for crashes and hangs only. Each parser's rate on its
  own unmutated seeds is shown for reference.

The decoder's bytes are its input plus its output (a body refused at the cap
counts the cap): its work is linear in what it decodes, which the cap bounds.
Crafted shapes are measured the same way and shown beside, outside the result:
the once-pathological inputs of issue 15 and the smallest items each parser
takes (1-byte chunks, 2-byte SSE lines, 18-byte messages), whose cost is per
item. Inputs that crash or hang are written to .bench/fuzz/ as JSON for replay.

    python bench/fuzz_capture.py [--quick] [--inputs N] [--seed S]
"""

from __future__ import annotations

import argparse
import gzip
import heapq
import json
import math
import random
import statistics
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "protos")]

import brotli  # noqa: E402

from collector.http.chunked import ChunkFramer  # noqa: E402
from collector.http.content_coding import BodyDecoder  # noqa: E402
from collector.http.errors import ChunkFramingError, ContentDecodingError  # noqa: E402
from collector.http.messages import RequestMessage, ResponseMessage  # noqa: E402
from collector.http.reader import (  # noqa: E402
    HttpLimits,
    RequestListener,
    RequestReader,
    ResponseListener,
    ResponseReader,
)
from collector.http.sse import SseParser  # noqa: E402
from tests.cpu_bound import CpuBoundExceededError, budget, cpu_bound  # noqa: E402
from tests.openai_traffic import Call, typical_call, words  # noqa: E402

CACHE = ROOT / ".bench" / "fuzz"
FULL_INPUTS = 200_000  # per parser: 10^6 in all
QUICK_INPUTS = 4_000
RATE_MIN_BYTES = 16 * 1024
RATE_SEGMENT = 1460
MAX_REPEAT_BYTES = 256 * 1024
SLOWEST_KEPT = 20
REMEASURE = 5
TARGET = 0.1
SAVED_PER_PARSER = 20
TYPICAL_CONNECTIONS = 4
CALLS_PER_CONNECTION = 4
SEGMENTS = (1, 2, 7, 64, 536, 1460, 9000)
LIMITS = HttpLimits()
TOKENS = (
    b"\r\n",
    b"\r\n\r\n",
    b"\r",
    b"\n",
    b"-6",
    b"0x",
    b"_",
    b";",
    b" ",
    b"ffffffff",
    b"0\r\n\r\n",
    b"HTTP/1.1 200 ",
    b"HTTP/1.1 200 OK\r\n",
    b"POST /",
    b"GET /",
    b" HTTP/1.1\r\n",
    b"Transfer-Encoding: chunked\r\n",
    b"Content-Length: 5\r\n",
    b"Content-Encoding: br\r\n",
    b"data: ",
    b"data: [DONE]\n\n",
    b"event: x\n",
    b"id: 1\n",
    b":",
    b"\xef\xbb\xbf",
    b"\x00",
)

Seed = tuple[str, bytes]  # (context: the coding for the decoder, "" otherwise; bytes)


@dataclass(frozen=True, slots=True)
class Case:
    """One input and how it is fed."""

    context: str
    data: bytes
    segment: int
    holes: frozenset[int] = frozenset()
    midstream: bool = False

    def pieces(self, data: bytes | None = None) -> list[bytes]:
        data = self.data if data is None else data
        return [data[at : at + self.segment] for at in range(0, len(data), self.segment)]

    def runs(self) -> list[tuple[bytes, int]]:
        """(bytes, then a gap of this many bytes) runs: each hole loses the 4 bytes at it."""
        runs: list[tuple[bytes, int]] = []
        pos = 0
        for hole in sorted(self.holes):
            if hole < pos or hole >= len(self.data):
                continue
            lost = min(4, len(self.data) - hole)
            runs.append((self.data[pos:hole], lost))
            pos = hole + lost
        runs.append((self.data[pos:], 0))
        return runs


Feed = Callable[[Case], int]


def feed_framer(case: Case) -> int:
    framer = ChunkFramer()
    for piece in case.pieces():
        try:
            framer.advance(piece, 0)
        except ChunkFramingError:
            break
        if framer.done:
            break
    return len(case.data)


def feed_decoder(case: Case) -> int:
    """Input plus output bytes; a body refused at the cap counts the cap as its output."""
    decoder = BodyDecoder(case.context, LIMITS.max_body_bytes)
    out = 0
    for piece in case.pieces():
        try:
            out += len(decoder.decode(piece))
        except ContentDecodingError as exc:
            if "body cap" in str(exc):
                out = LIMITS.max_body_bytes
            break
    return len(case.data) + out


def feed_sse(case: Case) -> int:
    parser = SseParser()
    for run, lost in case.runs():
        for piece in case.pieces(run):
            parser.feed(piece, 1)
        if lost:
            parser.gap()
    return len(case.data)


@dataclass
class _Counts(RequestListener, ResponseListener):
    """A connection's side of a reader: keeps every message, counts them."""

    started: int = 0
    messages: int = 0

    def request_started(self, ts_ns: int) -> None:
        self.started += 1

    def request_head(self, method: str, target: str) -> bool:
        return True

    def request_done(self, message: RequestMessage) -> None:
        self.messages += 1

    def response_head(self, status: int, ts_ns: int) -> tuple[str, bool]:
        return "POST", True

    def response_done(self, message: ResponseMessage) -> None:
        self.messages += 1


def _feed_reader(reader: RequestReader | ResponseReader, case: Case) -> int:
    reader.start(case.midstream)
    ts = 0
    for run, lost in case.runs():
        for piece in case.pieces(run):
            ts += 1
            reader.feed(piece, ts)
        if lost:
            reader.gap(lost, ts)
    reader.end("fin", ts + 1)
    return len(case.data)


def feed_requests(case: Case) -> int:
    return _feed_reader(RequestReader(LIMITS, _Counts()), case)


def feed_responses(case: Case) -> int:
    return _feed_reader(ResponseReader(LIMITS, _Counts()), case)


# -- seeds: typical traffic ----------------------------------------------------


def _calls(rng: random.Random, count: int, max_tokens: int) -> list[Call]:
    calls = []
    for index in range(count):
        tokens = int(math.exp(rng.uniform(math.log(5), math.log(max_tokens))))
        params: dict[str, object] = {"temperature": 0.7, "seed": index, "max_tokens": tokens}
        if index % 2 == 0:
            params["stream"] = True
        prompt = [{"role": "user", "content": "fuzz prompt " * rng.randint(5, 400)}]
        calls.append(
            Call(
                "/v1/chat/completions",
                "bench-model",
                prompt,
                params,
                [words(tokens, seed=index)],
                prompt_token_ids=tuple(range(1, rng.randint(20, 300))),
                response_id=f"chatcmpl-{index}",
            )
        )
    return calls


def _connections(parts: Sequence[bytes], rng: random.Random) -> list[bytes]:
    """Keep-alive runs of messages, each at least 16 KiB."""
    out = []
    for _ in range(max(1, len(parts) // 2)):
        joined = b""
        while len(joined) < RATE_MIN_BYTES:
            joined += rng.choice(parts)
        out.append(joined)
    return out


def _chunked_body(call: Call) -> bytes:
    return b"".join(b"%x\r\n" % len(e) + e + b"\r\n" for e in call.sse_events()) + b"0\r\n\r\n"


def _sse_body(call: Call) -> bytes:
    return b"".join(call.sse_events())


_ENCODERS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.compress,
    "deflate": zlib.compress,
    "br": brotli.compress,
    "gzip, br": lambda body: brotli.compress(gzip.compress(body)),
}


def seeds(rng: random.Random) -> dict[str, tuple[list[Seed], list[Seed]]]:
    """Per parser: (small seeds, seeds of at least 16 KiB)."""
    small = _calls(rng, 24, 40)
    large = _calls(rng, 24, 600)
    small_streams = [c for c in small if c.stream]
    large_streams = [c for c in large if c.stream]
    plain_small = [c.response_json() for c in small] + [_sse_body(c) for c in small_streams]
    plain_large = [b"".join(rng.choice(plain_small) for _ in range(200)) for _ in range(8)]

    def plain(parts: list[bytes]) -> list[Seed]:
        return [("", part) for part in parts]

    def coded(parts: list[bytes]) -> list[Seed]:
        return [(coding, encode(part)) for part in parts for coding, encode in _ENCODERS.items()]

    return {
        "chunk framer": (
            plain([_chunked_body(c) for c in small_streams]),
            plain(_connections([_chunked_body(c) for c in large_streams], rng)),
        ),
        "body decoder": (coded(plain_small), coded(plain_large)),
        "SSE parser": (
            plain([_sse_body(c) for c in small_streams]),
            plain(_connections([_sse_body(c) for c in large_streams], rng)),
        ),
        "request reader": (
            plain([c.request() for c in small]),
            plain(_connections([c.request() for c in large], rng)),
        ),
        "response reader": (
            plain([c.response() for c in small]),
            plain(_connections([c.response() for c in large], rng)),
        ),
    }


# -- mutation ------------------------------------------------------------------


def mutate(data: bytes, others: Sequence[Seed], rng: random.Random) -> tuple[bytes, str]:
    """1-4 edits; returns the bytes and what was done."""
    out = bytearray(data)
    done = []
    for _ in range(rng.randint(1, 4)):
        kind = rng.choices(
            ("flip", "random", "token", "delete", "truncate", "splice", "repeat"),
            weights=(25, 15, 25, 15, 5, 10, 5),
        )[0]
        at = rng.randrange(len(out) + 1)
        if kind == "flip" and out:
            out[min(at, len(out) - 1)] = rng.randrange(256)
        elif kind == "random":
            out[at:at] = rng.randbytes(rng.randint(1, 8))
        elif kind == "token":
            out[at:at] = rng.choice(TOKENS)
        elif kind == "delete":
            del out[at : at + rng.randint(1, 64)]
        elif kind == "truncate":
            del out[at:]
        elif kind == "splice":
            other = rng.choice(others)[1]
            out[at:] = other[rng.randrange(len(other) + 1) :]
        elif kind == "repeat":
            unit = bytes(out[at : at + rng.randint(1, 32)]) or rng.choice(TOKENS)
            size = int(math.exp(rng.uniform(math.log(1024), math.log(MAX_REPEAT_BYTES))))
            out[at:at] = unit * (size // len(unit))
            kind = f"repeat({unit[:16]!r} to {size // 1024} KiB)"
        done.append(kind)
    return bytes(out), " ".join(done)


# -- the run -------------------------------------------------------------------


@dataclass(order=True)
class Slow:
    """A slow input, ordered by negated rate: a heap of them tops with the fastest kept."""

    neg_rate: float
    context: str = field(compare=False)
    data: bytes = field(compare=False)
    how: str = field(compare=False)


@dataclass
class Tally:
    inputs: int = 0
    bytes: int = 0
    crashes: int = 0
    hangs: int = 0
    crash_kinds: set[str] = field(default_factory=set)
    slowest: list[Slow] = field(default_factory=list)  # the slowest inputs, a heap
    saved: int = 0


def _timed(feed: Feed, case: Case) -> float:
    """Work bytes per CPU second of one call (inside its CPU bound).

    Measured with the thread's CPU clock: once ITIMER_PROF has been armed, Linux reads the
    process clock (`time.process_time`) from its tick-sampled timer, ~4 ms coarse.
    """
    with cpu_bound(budget(len(case.data))):
        started = time.thread_time()
        work = feed(case)
        spent = time.thread_time() - started
    return work / max(spent, 1e-9)


def _save(parser: Parser, tally: Tally, kind: str, case: Case, how: str) -> None:
    if tally.saved >= SAVED_PER_PARSER:
        return
    CACHE.mkdir(parents=True, exist_ok=True)
    record = {
        "parser": parser.name,
        "context": case.context,
        "segment": case.segment,
        "holes": sorted(case.holes),
        "midstream": case.midstream,
        "how": how,
        "data": case.data.hex(),
    }
    path = CACHE / f"{parser.name.replace(' ', '-')}-{kind}-{tally.saved}.json"
    path.write_text(json.dumps(record))
    tally.saved += 1


def _median_rate(feed: Feed, context: str, data: bytes, rounds: int) -> float:
    case = Case(context, data, RATE_SEGMENT)
    return statistics.median(_timed(feed, case) for _ in range(rounds))


def own_typical_rate(feed: Feed, large: Sequence[Seed]) -> float:
    """Median rate of a parser's unmutated large seeds (each the median of its rounds)."""
    return statistics.median(_median_rate(feed, c, d, REMEASURE) for c, d in large)


@dataclass(frozen=True, slots=True)
class TypicalTraffic:
    """Typical traffic through the HTTP layer: keep-alive connections of bench/capture.py's
    mix, the client side through the request reader and the server side through the
    response reader."""

    parts: tuple[tuple[Feed, bytes], ...]

    @classmethod
    def build(cls, rng: random.Random) -> TypicalTraffic:
        parts: list[tuple[Feed, bytes]] = []
        for connection in range(TYPICAL_CONNECTIONS):
            first = connection * CALLS_PER_CONNECTION
            calls = [typical_call(rng, first + k) for k in range(CALLS_PER_CONNECTION)]
            parts.append((feed_requests, b"".join(c.request() for c in calls)))
            parts.append((feed_responses, b"".join(c.response() for c in calls)))
        return cls(tuple(parts))

    def _rate(self, rate_of: Callable[[Feed, bytes], float]) -> float:
        work = sum(len(data) for _, data in self.parts)
        return work / sum(len(data) / rate_of(feed, data) for feed, data in self.parts)

    def median_rate(self) -> float:
        """Each connection's median of rounds, as the headline figure."""
        return self._rate(lambda feed, data: _median_rate(feed, "", data, REMEASURE))

    def round_rate(self) -> float:
        """One timing of each connection: the reference side of a paired ratio."""
        return self._rate(lambda feed, data: _timed(feed, Case("", data, RATE_SEGMENT)))


def _hostile() -> list[tuple[str, Feed, Case]]:
    """Crafted shapes: the once-pathological inputs, and the smallest items each parser handles."""
    size = 256 * 1024
    sse_head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    first = sse_head + b"9\r\ndata: 1\n\n\r\n"
    resync = first + b"HTTP/1.1 200 " * (size // 13) + b"\n0\r\n\r\n"
    one_chunk = sse_head + b"%x\r\n" % size
    return [
        ("chunk size -6", feed_responses, Case("", sse_head + b"-6\r\n" + bytes(size), 1460)),
        ("8 MiB SSE line", feed_sse, Case("", b"data: " + b"x" * (8 << 20), 1460)),
        ("256 KiB resync", feed_responses, Case("", resync, 1460, frozenset({len(first) - 4}))),
        (
            "brotli bomb",
            feed_decoder,
            Case("br", brotli.compress(bytes(300 << 20), quality=5), 1460),
        ),
        ("GET / x 52k", feed_requests, Case("", b"GET /" * (size // 5), 1460, midstream=True)),
        ("1-byte chunks", feed_responses, Case("", sse_head + b"1\r\nx\r\n" * (size // 6), 1460)),
        ("2-byte SSE lines", feed_responses, Case("", one_chunk + b"\nd" * (size // 2), 1460)),
        ("7-byte SSE events", feed_sse, Case("", b"data:\n\n" * (size // 7), 1460)),
        (
            "19-byte responses",
            feed_responses,
            Case("", b"HTTP/1.1 204 No\r\n\r\n" * (size // 19), 1460),
        ),
        (
            "18-byte requests",
            feed_requests,
            Case("", b"GET / HTTP/1.1\r\n\r\n" * (size // 18), 1460),
        ),
    ]


@dataclass(frozen=True, slots=True)
class Parser:
    name: str
    feed: Feed
    holes: bool  # fed with gaps in some inputs
    midstream: bool  # picked up midstream in some inputs


def _case(parser: Parser, context: str, data: bytes, rng: random.Random) -> Case:
    segment = RATE_SEGMENT if len(data) >= RATE_MIN_BYTES else rng.choice(SEGMENTS)
    holes: frozenset[int] = frozenset()
    if parser.holes and rng.random() < 0.2:
        holes = frozenset(rng.randrange(len(data) + 1) for _ in range(rng.randint(1, 3)))
    midstream = parser.midstream and rng.random() < 0.1
    return Case(context, data, segment, holes, midstream)


def fuzz(
    parser: Parser, corpus: tuple[list[Seed], list[Seed]], inputs: int, rng: random.Random
) -> Tally:
    small, large = corpus
    everything = [*small, *large]
    tally = Tally()
    for _ in range(inputs):
        context, seed = rng.choice(large) if rng.random() < 0.15 else rng.choice(small)
        data, how = mutate(seed, everything, rng)
        case = _case(parser, context, data, rng)
        tally.inputs += 1
        tally.bytes += len(data)
        try:
            rate = _timed(parser.feed, case)
        except CpuBoundExceededError:
            tally.hangs += 1
            _save(parser, tally, "hang", case, how)
            continue
        except Exception as exc:
            tally.crashes += 1
            tally.crash_kinds.add(f"{type(exc).__name__}: {exc}"[:120])
            _save(parser, tally, "crash", case, how)
            continue
        if len(data) >= RATE_MIN_BYTES and not case.holes and not case.midstream:
            _rank(parser, tally, case, how, rate)
    return tally


def _ranks_among_slowest(tally: Tally, rate: float) -> bool:
    return len(tally.slowest) < SLOWEST_KEPT or rate < -tally.slowest[0].neg_rate


def _rank(parser: Parser, tally: Tally, case: Case, how: str, rate: float) -> None:
    """Keep ``case`` among the slowest inputs if it is one: a first timing that would rank
    it is retaken and the faster of the two ranks it, so that an input slowed only by
    another process's burst of load does not take the place of a slow one."""
    if not _ranks_among_slowest(tally, rate):
        return
    try:
        rate = max(rate, _timed(parser.feed, case))
    except CpuBoundExceededError:
        tally.hangs += 1
        _save(parser, tally, "hang", case, how)
        return
    if not _ranks_among_slowest(tally, rate):
        return
    slow = Slow(-rate, case.context, case.data, how)
    if len(tally.slowest) < SLOWEST_KEPT:
        heapq.heappush(tally.slowest, slow)
    else:
        heapq.heapreplace(tally.slowest, slow)


@dataclass(frozen=True, slots=True)
class Worst:
    """A parser's slowest kept input, re-measured against typical traffic."""

    rate: float  # median of its timings, bytes per CPU second
    vs_typical: float  # median of its paired ratios
    how: str


def paired_ratio(feed: Feed, case: Case, typical: TypicalTraffic) -> tuple[float, float]:
    """(median rate, median ratio) of ``case`` over rounds each timed right after a round of
    typical traffic: a slow spell of a shared machine that lasts a pair slows both sides."""
    rates = []
    ratios = []
    for _ in range(REMEASURE):
        reference = typical.round_rate()
        rate = _timed(feed, case)
        rates.append(rate)
        ratios.append(rate / reference)
    return statistics.median(rates), statistics.median(ratios)


def worst_rate(feed: Feed, tally: Tally, typical: TypicalTraffic) -> Worst:
    """The slowest kept inputs re-measured in pairs; the lowest ratio and how it was made."""
    worst = Worst(math.inf, math.inf, "-")
    for slow in tally.slowest:
        rate, ratio = paired_ratio(feed, Case(slow.context, slow.data, RATE_SEGMENT), typical)
        if ratio < worst.vs_typical:
            worst = Worst(rate, ratio, f"{slow.how} ({len(slow.data) // 1024} KiB)")
    return worst


PARSERS = (
    Parser("chunk framer", feed_framer, holes=False, midstream=False),
    Parser("body decoder", feed_decoder, holes=False, midstream=False),
    Parser("SSE parser", feed_sse, holes=True, midstream=False),
    Parser("request reader", feed_requests, holes=True, midstream=True),
    Parser("response reader", feed_responses, holes=True, midstream=True),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_INPUTS} inputs per parser")
    parser.add_argument("--inputs", type=int, help=f"inputs per parser (default {FULL_INPUTS})")
    parser.add_argument("--seed", type=int, default=15)
    args = parser.parse_args()
    inputs = args.inputs or (QUICK_INPUTS if args.quick else FULL_INPUTS)
    rng = random.Random(args.seed)
    corpus = seeds(rng)
    started = time.process_time()
    traffic = TypicalTraffic.build(random.Random(args.seed))
    typical = traffic.median_rate()
    rows = []
    for each in PARSERS:
        own = own_typical_rate(each.feed, corpus[each.name][1])
        tally = fuzz(each, corpus[each.name], inputs, rng)
        rows.append((each.name, tally, own, worst_rate(each.feed, tally, traffic)))
        print(f"{each.name}: {tally.inputs:,} inputs done", file=sys.stderr, flush=True)
    total = sum(row[1].inputs for row in rows)
    cpu = time.process_time() - started
    print(
        f"\n{total:,} mutated inputs, seed {args.seed}, {cpu:.0f} CPU s; typical traffic through "
        f"the HTTP layer (both readers): {typical / 1e6:.1f} MB/s\n"
    )
    print(
        f"{'parser':<17}{'inputs':>10}{'MB':>8}{'crashes':>9}{'hangs':>7}"
        f"{'own seeds MB/s':>16}{'worst MB/s':>12}{'vs typical':>12}  worst input"
    )
    for name, tally, own, worst in rows:
        print(
            f"{name:<17}{tally.inputs:>10,}{tally.bytes / 1e6:>8.1f}{tally.crashes:>9}"
            f"{tally.hangs:>7}{own / 1e6:>16.1f}{worst.rate / 1e6:>12.1f}"
            f"{worst.vs_typical:>11.2f}x  {worst.how}"
        )
        for kind in sorted(tally.crash_kinds):
            print(f"    crash: {kind}")
    print(f"\n{'crafted input (not in the result)':<36}{'parser':<17}{'MB/s':>8}{'vs typical':>12}")
    for label, feed, case in _hostile():
        try:
            rate = (
                _median_rate(feed, case.context, case.data, 3)
                if not case.holes and not case.midstream
                else statistics.median(_timed(feed, case) for _ in range(3))
            )
            shown = f"{rate / 1e6:>8.1f}{rate / typical:>11.2f}x"
        except CpuBoundExceededError:
            shown = f"{'hang':>8}"
        parser_name = next(p.name for p in PARSERS if p.feed is feed)
        print(f"{label:<36}{parser_name:<17}{shown}")
    crashes = sum(row[1].crashes for row in rows)
    hangs = sum(row[1].hangs for row in rows)
    ratio = min(row[3].vs_typical for row in rows)
    ok = crashes == 0 and hangs == 0 and ratio >= TARGET
    print(
        f"\ncrashes {crashes} (target 0), hangs {hangs} (target 0), "
        f"worst mutated input {ratio:.2f}x typical traffic (target >= {TARGET}x)"
    )
    print(
        f"result: fuzz_capture_worst_vs_typical={ratio:.2f} crashes={crashes} hangs={hangs} "
        f"target={TARGET} {'ok' if ok else 'short'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

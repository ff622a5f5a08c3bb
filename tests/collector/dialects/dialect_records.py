"""Records built from HTTP exchanges on one captured connection, and the response framing
(SSE streams, plain documents) that vLLM writes.

`records` reads OpenAI chat and completions traffic (`REGISTRY`); `one` reads a single
exchange of any dialect the collector knows.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from veritap.v1 import record_pb2

from collector.dialects import DIALECTS, DialectRegistry
from collector.http.exchange import Connection, HttpStats
from collector.http.messages import Exchange
from collector.http.reader import HttpLimits
from collector.records import RecordBuilder
from collector.tcp_reassembly import FlowInfo
from tests.openai_traffic import sse_chunk

FLOW = FlowInfo(6, bytes(15) + b"\x01", 41000, bytes(15) + b"\x02", 8000, (), 0)
REGISTRY = DialectRegistry(["openai-chat", "openai-completions"])
EVERY_DIALECT = DialectRegistry(DIALECTS)
MESSAGES = [{"role": "user", "content": "Say hi"}]


def records(*pairs: tuple[bytes, bytes]) -> list[record_pb2.InferenceRecord]:
    exchanges: list[Exchange] = []
    conn = Connection(FLOW, HttpLimits(), REGISTRY.records, exchanges.append, HttpStats())
    conn.on_start(0, False, 0)
    conn.on_start(1, False, 0)
    ts = 0
    for request, response in pairs:
        ts += 10
        conn.on_data(0, request, ts)
        ts += 10
        conn.on_data(1, response, ts)
    conn.on_close("fin", ts + 1)
    builder = RecordBuilder("test/origin", REGISTRY)
    return [builder.build(e) for e in exchanges]


def one(request_bytes: bytes, response: bytes) -> record_pb2.InferenceRecord:
    exchanges: list[Exchange] = []
    conn = Connection(FLOW, HttpLimits(), EVERY_DIALECT.records, exchanges.append, HttpStats())
    conn.on_start(0, False, 0)
    conn.on_start(1, False, 0)
    conn.on_data(0, request_bytes, 10)
    conn.on_data(1, response, 20)
    conn.on_close("fin", 30)
    (exchange,) = exchanges
    record = RecordBuilder("test/origin", EVERY_DIALECT).build(exchange)
    record.SerializeToString()
    return record


def sse_response(events: list[bytes]) -> bytes:
    """A vLLM-shaped SSE response carrying exactly `events`, one chunk each."""
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
        b"transfer-encoding: chunked\r\n\r\n"
    )
    return head + b"".join(sse_chunk(e) for e in events) + b"0\r\n\r\n"


def document(body: Mapping[str, object]) -> bytes:
    data = json.dumps(body).encode()
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(data) + data


def events(*data: Mapping[str, object]) -> bytes:
    """An SSE response as vLLM writes it: each event named by its data's type."""
    return sse_response(
        [
            b"event: %s\ndata: %s\n\n" % (str(d["type"]).encode(), json.dumps(d).encode())
            for d in data
        ]
    )

"""Crafted captures through `collector replay` + `collector log export`: what the client saw.

Each case is a connection in one capture, told apart by its response id: events after
`[DONE]`, `"error": null` chunks, a request without a model, targets the server
normalizes, bodies Python's json or protobuf cannot hold, and bodies over the record's
cap. Every exchange must come out as exactly one record, and none as an internal error.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from collector import record_bounds, records
from collector.cli import main
from tests.openai_traffic import Call, sse_chunk, words
from tests.pcapgen import LINK_ETHERNET, Conversation, frame, write_frames

MESSAGES = [{"role": "user", "content": "hello"}]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def call(name: str, *, stream: bool = True, n_tokens: int = 5) -> Call:
    params: dict[str, object] = {"stream": stream, "seed": 1}
    return Call(
        "/v1/chat/completions",
        "committed",
        MESSAGES,
        params,
        [words(n_tokens, seed=len(name))],
        response_id=name,
    )


def sse(events: list[bytes]) -> bytes:
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
        b"transfer-encoding: chunked\r\n\r\n"
    )
    return head + b"".join(sse_chunk(e) for e in events) + b"0\r\n\r\n"


def document(body: bytes) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
        % len(body)
    ) + body


def post(target: str, body: bytes) -> bytes:
    return (
        f"POST {target} HTTP/1.1\r\nHost: prover:8000\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


class Capture:
    def __init__(self) -> None:
        self.conversations: list[Conversation] = []

    def add(self, request: bytes, response: bytes) -> None:
        port = 43000 + len(self.conversations)
        conv = Conversation(
            client=("10.9.0.1", port), ts=1_700_000_000.0 + len(self.conversations) * 0.0003
        )
        conv.handshake().exchange(request, response, response_sizes=[700] * 20_000).close()
        self.conversations.append(conv)

    def replay(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
        frames = sorted(
            (
                (p.ts, frame(c, p, link=LINK_ETHERNET))
                for c in self.conversations
                for p in c.packets
            ),
            key=lambda f: f[0],
        )
        pcap = write_frames(tmp_path / "crafted.pcap", frames)
        log = tmp_path / "log"
        assert main(["replay", str(pcap), "--log", str(log), "--origin", "test.local/c"]) == 0
        summary = capsys.readouterr().out
        assert "internal errors 0" in summary, summary
        assert main(["log", "export", str(log), "--format", "jsonl"]) == 0
        records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert len(records) == len(self.conversations), summary
        by_target_and_id: dict[str, Any] = {}
        for rec in records:
            key = str(rec["response_id"]) or str(rec["target"])
            assert key not in by_target_and_id
            by_target_and_id[key] = rec
        return by_target_and_id


def test_crafted_answers_give_the_clients_view(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Bodies over this cap are cut (4 MiB in service; small here to keep the capture small).
    monkeypatch.setattr(record_bounds, "STORED_BODY_BYTES", 8192)
    cap = Capture()

    after_done = call("after-done")
    extra = b'data: {"id":"after-done","choices":[{"index":0,"delta":{"content":" EVIL"}}]}\n\n'
    cap.add(after_done.request(), sse([*after_done.sse_events(), extra]))

    null_error = call("null-error")
    events = [e.replace(b'"choices":', b'"error":null,"choices":') for e in null_error.sse_events()]
    cap.add(null_error.request(), sse(events))

    no_model = call("no-model", stream=False)
    body = json.dumps({"messages": MESSAGES, "seed": 1}).encode()
    cap.add(
        post("/v1/chat/completions", body), no_model.response().replace(b"committed", b"its-pick!")
    )

    encoded, absolute = call("encoded", stream=False), call("absolute", stream=False)
    cap.add(post("/v1/%63hat/completions", encoded.request_json()), encoded.response())
    cap.add(
        post("http://prover:8000/v1/chat/completions?x=1", absolute.request_json()),
        absolute.response(),
    )

    cap.add(call("deep", stream=False).request(), document(b"[" * 50_000 + b"]" * 50_000))
    surrogate = call("surrogate", stream=False)
    cap.add(
        surrogate.request(),
        document(surrogate.response_json().replace(b'"content":"', b'"content":"\\ud800')),
    )
    digits = call("digits", stream=False)
    digits_body = digits.request_json().replace(b'"seed":1', b'"seed":1' + b"0" * 400)
    cap.add(post("/v1/chat/completions", digits_body), digits.response())
    lone = call("lone-request", stream=False)
    lone_body = lone.request_json().replace(b'"hello"', b'"hello \\udc00"')
    cap.add(post("/v1/chat/completions", lone_body), lone.response())

    big = call("big", n_tokens=3000)
    cap.add(big.request(), big.response())

    got = cap.replay(tmp_path, capsys)

    rec = got["after-done"]
    assert rec["quality"] == "complete", rec["quality_reason"]
    assert rec["choices"][0]["text"] == after_done.generations[0].text
    assert rec["events_after_end"] == 1
    assert rec["sse_events"] == len(after_done.sse_events()) + 1

    rec = got["null-error"]
    assert rec["quality"] == "complete" and rec["error"] == ""
    assert rec["choices"][0]["text"] == null_error.generations[0].text

    rec = got["no-model"]
    assert rec["model"] == "" and rec["quality"] == "complete"

    for name in ("encoded", "absolute"):
        rec = got[name]
        assert rec["dialect"] == "openai-chat" and rec["model"] == "committed"
        assert rec["quality"] == "complete", rec["quality_reason"]
    assert got["absolute"]["path"] == "/v1/chat/completions"

    rec = got["/v1/chat/completions"]  # the deep document: no response id can be read
    assert rec["quality"] == "parse_error" and "not JSON" in rec["quality_reason"]

    rec = got["surrogate"]
    assert rec["quality"] == "parse_error" and "lone surrogates" in rec["quality_reason"]
    assert rec["choices"][0]["text"].startswith("\ufffd")

    rec = got["digits"]
    assert rec["quality"] == "complete", rec["quality_reason"]
    assert rec["sampling"]["seed"] == 10**400
    assert rec["request_body_sha256"] == sha(digits_body)

    rec = got["lone-request"]
    assert rec["quality"] == "complete", rec["quality_reason"]
    assert rec["request_body_sha256"] == sha(lone_body)

    rec = got["big"]
    body = b"".join(big.sse_events())
    assert len(body) > 8192
    assert rec["quality"] == "truncated"
    assert f"response: body cut at 8192 of {len(body)} bytes" in rec["quality_reason"]
    assert rec["response_body_sha256"] == sha(body)
    assert rec["choices"][0]["text"] == big.generations[0].text


def test_a_record_that_cannot_be_built_is_still_recorded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_args: object) -> list[tuple[int, str]]:
        raise RuntimeError("builder bug")

    monkeypatch.setattr(records, "_fill_response", broken)
    plain = call("plain", stream=False)
    conv = Conversation().handshake().exchange(plain.request(), plain.response()).close()
    pcap = write_frames(tmp_path / "one.pcap", [(p.ts, frame(conv, p)) for p in conv.packets])
    log = tmp_path / "log"
    # An internal error: replay says so and exits 1, and the exchange is still a record.
    assert main(["replay", str(pcap), "--log", str(log), "--origin", "test.local/c"]) == 1
    assert "internal errors 1" in capsys.readouterr().out
    assert main(["log", "export", str(log), "--format", "jsonl"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    rec = json.loads(line)
    assert rec["quality"] == "parse_error"
    assert rec["quality_reason"] == "record: building it failed: RuntimeError('builder bug')"
    assert rec["flow"]["server_port"] == 8000

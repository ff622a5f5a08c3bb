"""End to end: an impaired pcap through `collector replay`, checked through `collector log export`.

One capture holds every scenario (each on its own connection, interleaved in
time); every exchange must come out as exactly one record with the right
quality and byte-exact bodies.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path

import pytest

from collector.cli import main
from tests.collector.capture_scenarios import MESSAGES, Capture, by_model, chat, sha
from tests.openai_traffic import Call, error_response, words
from tests.pcapgen import (
    CLIENT,
    LINK_SLL2,
    SERVER,
    SYN,
    Conversation,
    frame,
    write_frames,
    write_pcapng,
)


def replay(capsys: pytest.CaptureFixture[str], pcap: Path, log: Path) -> list[dict[str, object]]:
    assert main(["replay", str(pcap), "--log", str(log), "--origin", "test.local/c"]) == 0
    summary = capsys.readouterr().out
    assert "records" in summary
    assert main(["log", "export", str(log), "--format", "jsonl"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_impaired_capture_yields_one_record_per_exchange(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cap = Capture()
    expected: dict[str, tuple[str, Call]] = {}

    # 1. Plain non-streamed chat, 802.1Q tagged.
    c = chat("plain")
    conv = cap.conversation().handshake().exchange(c.request(), c.response()).close()
    cap.add(conv, vlans=[100])
    expected["plain"] = ("complete", c)

    # 2. Streamed chat n=2 over IPv6 in QinQ, events split across segments.
    c = Call(
        "/v1/chat/completions",
        "stream6",
        MESSAGES,
        {"stream": True, "n": 2, "return_token_ids": True},
        [words(30, 1), words(25, 2)],
        prompt_token_ids=(3, 4),
        response_id="chatcmpl-s6",
    )
    conv = cap.conversation(ipv6=True).handshake()
    conv.exchange(c.request(), c.response(), response_sizes=[97] * 400).close()
    cap.add(conv, vlans=[10, 20])
    expected["stream6"] = ("complete", c)

    # 3. Reordering, duplicates and a same-bytes overlap: still complete and byte-exact.
    c = chat("reordered", 120, stream=True)
    conv = cap.conversation().handshake()
    conv.exchange(c.request(), c.response(), response_sizes=[300] * 200).close()
    pkts = list(conv.packets)
    data = [i for i, p in enumerate(pkts) if p.payload and p.direction == SERVER]
    pkts[data[2]], pkts[data[4]] = pkts[data[4]], pkts[data[2]]
    pkts.insert(data[6], pkts[data[8]])
    merged = replace(pkts[data[9]], payload=pkts[data[9]].payload + pkts[data[10]].payload[:50])
    pkts.insert(data[12], merged)
    cap.add(conv, [replace(p, ts=conv.packets[0].ts + i * 0.001) for i, p in enumerate(pkts)])
    expected["reordered"] = ("complete", c)

    # 4. A lost SSE segment: a partial record marked response_gap.
    c = chat("sse-gap", 40, stream=True)
    conv = cap.conversation().handshake()
    sent = conv.send(CLIENT, c.request())
    resp = conv.send(SERVER, c.response(), sizes=[200] * 200)
    conv.close()
    lost = resp[len(resp) // 2]
    cap.add(conv, [p for p in conv.packets if p is not lost])
    expected["sse-gap"] = ("response_gap", c)

    # 5. gzip response and pipelined requests on one connection.
    c1, c2 = chat("pipe-1"), chat("pipe-2", 3)
    body = gzip.compress(c1.response_json())
    gz = (
        b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % len(body)
    ) + body
    conv = cap.conversation().handshake()
    conv.send(CLIENT, c1.request() + c2.request())
    conv.send(SERVER, gz + c2.response(), sizes=[333] * 50)
    cap.add(conv.close())
    expected["pipe-1"] = ("complete", c1)
    expected["pipe-2"] = ("complete", c2)

    # 6. Midstream: the capture starts after a request, at its response (an orphan marked
    #    midstream); the next exchange is whole.
    early, later = chat("mid-early", 30), chat("mid-later")
    conv = cap.conversation().handshake()
    conv.exchange(early.request(), early.response(), response_sizes=[120] * 100)
    conv.exchange(later.request(), later.response()).close()
    first_response = next(
        i for i, p in enumerate(conv.packets) if p.direction == SERVER and p.payload
    )
    cap.add(conv, conv.packets[first_response:])
    expected["mid-later"] = ("complete", later)

    # 7. A lost request segment: request_gap.
    c = chat("req-gap")
    c.prompt = [{"role": "user", "content": "x" * 4000}]
    conv = cap.conversation().handshake()
    req_pkts = conv.send(CLIENT, c.request(), sizes=[1000] * 10)
    conv.send(SERVER, c.response())
    conv.close()
    cap.add(conv, [p for p in conv.packets if p is not req_pkts[2]])
    expected["req-gap"] = ("request_gap", c)

    # 8. The server resets mid-response: truncated.
    c = chat("reset", 50, stream=True)
    conv = cap.conversation().handshake()
    conv.send(CLIENT, c.request())
    conv.send(SERVER, c.response()[:900], sizes=[300] * 3)
    conv.rst(SERVER)
    cap.add(conv)
    expected["reset"] = ("truncated", c)

    # 9. An error response, and a health check on an unknown path (counted, not recorded).
    c = chat("bad", temperature=-2)
    conv = cap.conversation().handshake()
    conv.exchange(
        b"GET /health HTTP/1.1\r\nHost: p\r\n\r\n", b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
    )
    conv.exchange(c.request(), error_response(400, "temperature must be >= 0")).close()
    cap.add(conv)
    expected["bad"] = ("complete", c)

    # 10. Sequence numbers wrapping inside the response.
    c = chat("wrap", 80, stream=True)
    conv = cap.conversation(server_isn=0xFFFFFFFF - 2000).handshake()
    cap.add(conv.exchange(c.request(), c.response(), response_sizes=[500] * 100).close())
    expected["wrap"] = ("complete", c)

    records = replay(capsys, cap.write(tmp_path / "impaired.pcap"), tmp_path / "log")
    got = by_model(records)
    # The orphan response of "mid-early" names no model: the record takes none from it.
    assert sorted(got) == sorted([*expected, ""]), sorted(got)
    for model, (quality, call) in expected.items():
        (rec,) = got[model]
        assert rec["quality"] == quality, (model, rec["quality_reason"])
        assert rec["path"] == call.path
        if quality != "request_gap":
            assert rec["request_body_sha256"] == sha(call.request_json())
            sent = json.loads(call.request_json())
            assert rec["sampling"] == {k: v for k, v in sent.items() if k != "messages"}
        if quality == "complete":
            assert rec["quality_reason"] == ""
            body = call.response_json() if not call.stream else b"".join(call.sse_events())
            if model == "bad":
                assert rec["http_status"] == 400
                assert rec["error"] == "temperature must be >= 0"
                continue
            assert rec["response_body_sha256"] == sha(body), model
            texts = [ch["text"] for ch in rec["choices"]]  # type: ignore[index, union-attr]
            assert texts == [g.text for g in call.generations]
            ids = [ch["token_ids"] for ch in rec["choices"]]  # type: ignore[index, union-attr]
            assert ids == [list(g.token_ids) for g in call.generations]
            assert rec["prompt_token_ids"] == list(call.prompt_token_ids)
    assert got["plain"][0]["flow"]["vlan_ids"] == [100]  # type: ignore[index]
    assert got["stream6"][0]["flow"]["vlan_ids"] == [10, 20]  # type: ignore[index]
    assert got["stream6"][0]["flow"]["client_address"] == "fd00::10"  # type: ignore[index]
    partial = got["sse-gap"][0]
    full = chat("sse-gap", 40, stream=True).generations[0]
    text = partial["choices"][0]["text"]  # type: ignore[index]
    assert 0 < len(text) < len(full.text) and full.text.startswith(text[:20])
    assert "gap" in str(partial["quality_reason"])
    assert got[""][0]["quality"] == "midstream"
    assert got["reset"][0]["http_status"] == 200


def test_pcapng_with_sll2_link_layer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    c = chat("sll2", 12, stream=True)
    conv = Conversation().handshake().exchange(c.request(), c.response()).close()
    pcap = write_pcapng(tmp_path / "any.pcapng", conv, link=LINK_SLL2)
    (rec,) = replay(capsys, pcap, tmp_path / "log")
    assert rec["quality"] == "complete"
    assert rec["response_body_sha256"] == sha(b"".join(c.sse_events()))


def test_lost_syn_and_unparseable_stream(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    c = chat("nosyn")
    conv = Conversation().handshake().exchange(c.request(), c.response()).close()
    garbage = Conversation(client=("10.0.0.7", 50000), ts=conv.ts + 1).handshake()
    garbage.exchange(b"\x00\x01binary junk\r\n\r\n" * 3, b"")
    garbage.close()
    frames = [(p.ts, frame(conv, p)) for p in conv.packets if p.flags != SYN]
    frames += [(p.ts, frame(garbage, p)) for p in garbage.packets]
    records = replay(capsys, write_frames(tmp_path / "x.pcap", frames), tmp_path / "log")
    got = by_model(records)
    assert got["nosyn"][0]["quality"] == "complete"
    (junk,) = got[""]
    assert junk["quality"] == "parse_error" and "bad message head" in str(junk["quality_reason"])


def test_realtime_replay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    c = chat("paced", 4)
    conv = Conversation(step=0.002).handshake().exchange(c.request(), c.response()).close()
    pcap = write_pcapng(tmp_path / "paced.pcapng", conv)
    log = tmp_path / "log"
    assert main(["replay", str(pcap), "--log", str(log), "--realtime"]) == 0
    capsys.readouterr()
    assert main(["log", "export", str(log)]) == 0
    (rec,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rec["quality"] == "complete" and rec["model"] == "paced"

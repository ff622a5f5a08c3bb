"""Keep-alive chat calls numbered by their place on the connection, the body each answer
carries, and a pcap replayed through `collector replay` and read back with `log export`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collector.cli import main
from tests.openai_traffic import Call, words


def call(i: int, *, stream: bool) -> Call:
    return Call(
        "/v1/chat/completions",
        f"model-{i}",
        [{"role": "user", "content": f"question {i}"}],
        {"temperature": 0.0, "seed": i, "stream": stream},
        [words(3, seed=i)],
        response_id=f"chatcmpl-{i}",
    )


def body_of(c: Call) -> bytes:
    return b"".join(c.sse_events()) if c.stream else c.response_json()


def replay(capsys: pytest.CaptureFixture[str], pcap: Path, log: Path) -> list[dict[str, object]]:
    assert main(["replay", str(pcap), "--log", str(log), "--origin", "test.local/c"]) == 0
    capsys.readouterr()
    assert main(["log", "export", str(log), "--format", "jsonl"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]

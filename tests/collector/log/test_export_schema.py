"""Real exports against the committed JSON Schema, and what auditors ask of them.

The records are built by the collector from vLLM-shaped HTTP exchanges (chat with tool
calls and reasoning, streamed and not; completions; an error; a response that is not
UTF-8), some written by a hostile prover, appended to a signed log and exported by the
`collector log export` command itself.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from veritap.signing import Signer
from veritap.v1 import record_pb2

from collector.cli import main
from collector.log.export import jsonl_lines
from tests.collector.dialects.dialect_records import records, sse_response
from tests.collector.log.log_fixtures import ORIGIN, lone_envelope, open_log
from tests.openai_traffic import Call, error_response, words

SCHEMA_PATH = Path(__file__).parents[3] / "collector" / "log" / "export.schema.json"
HOSTILE = "[/x]\x1b]0;owned\x07\x9b2J \u202eexe.txt\u202c \x7f"
TOOL_CALL = {
    "id": "call-1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
}
MESSAGES = [
    {"role": "system", "content": "You may call tools."},
    {"role": "user", "content": f"Weather in Paris? {HOSTILE}"},
    {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
    {"role": "tool", "tool_call_id": "call-1", "content": "18 C"},
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]


def chat(stream: bool) -> Call:
    params: dict[str, object] = {"temperature": 0.7, "seed": 5, "tools": TOOLS}
    if stream:
        params["stream"] = True
    return Call("/v1/chat/completions", HOSTILE, MESSAGES, params, [words(4)])


def document_with_extras() -> tuple[bytes, bytes]:
    call = chat(stream=False)
    document = json.loads(call.response_json())
    message = document["choices"][0]["message"]
    message["reasoning"] = f"The user wants weather. {HOSTILE}"
    message["tool_calls"] = [TOOL_CALL]
    body = json.dumps(document).encode()
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    return call.request(), head % len(body) + body


def stream_with_extras() -> tuple[bytes, bytes]:
    call = chat(stream=True)

    def chunk(delta: dict[str, object], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        data = {"id": "chatcmpl-s", "object": "chat.completion.chunk", "choices": [choice]}
        return b"data: " + json.dumps(data).encode() + b"\n\n"

    first = {"index": 0, "id": "call-1", "type": "function"}
    events = [
        chunk({"role": "assistant", "content": ""}),
        chunk({"reasoning": "Weather, "}),
        chunk({"reasoning": f"so a tool. {HOSTILE}"}),
        chunk({"tool_calls": [{**first, "function": {"name": "get_weather", "arguments": ""}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
        chunk({}, "tool_calls"),
        b"data: [DONE]\n\n",
        chunk({"reasoning": "after the end: never read"}),
    ]
    return call.request(), sse_response(events)


def completions() -> tuple[bytes, bytes]:
    call = Call("/v1/completions", "tiny", "Once upon", {"temperature": 0.0}, [words(3)])
    return call.request(), call.response()


def not_utf8() -> tuple[bytes, bytes]:
    call = Call("/v1/completions", "tiny", "Bytes", {"temperature": 0.0}, [words(3)])
    body = b"\xff\xfe not UTF-8 \x1b"
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    return call.request(), head % len(body) + body


def refused() -> tuple[bytes, bytes]:
    return chat(stream=False).request(), error_response(400, f"no such model {HOSTILE}")


EXCHANGES = [document_with_extras(), stream_with_extras(), completions(), not_utf8(), refused()]


@pytest.fixture
def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(loaded)
    return loaded


def captured(*exchanges: tuple[bytes, bytes]) -> list[record_pb2.InferenceRecord]:
    """The collector's records of the exchanges, from this log's origin."""
    built = records(*exchanges)
    for record in built:
        record.origin = ORIGIN
    return built


def exported(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> list[str]:
    with open_log(tmp_path / "log", Signer.generate(ORIGIN)) as log:
        log.append_many(captured(*EXCHANGES))
    assert main(["log", "export", str(tmp_path / "log"), *extra]) == 0
    return capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("extra", [(), ("--with-bodies",)], ids=["plain", "with_bodies"])
def test_real_exports_match_the_schema(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    schema: dict[str, Any],
    extra: tuple[str, ...],
) -> None:
    lines = exported(tmp_path, capsys, *extra)
    assert len(lines) == len(EXCHANGES)
    validator = jsonschema.Draft202012Validator(schema)
    for line in lines:
        validator.validate(json.loads(line))


def test_the_schema_refuses_what_the_export_never_writes(schema: dict[str, Any]) -> None:
    validator = jsonschema.Draft202012Validator(schema)
    assert not validator.is_valid({"seq": 1})
    record = captured(completions())[0]
    envelope = lone_envelope(record.SerializeToString())
    lines = [json.loads(line) for line in jsonl_lines([(1, envelope)])]
    renamed = {("record" if k == "record_id" else k): v for k, v in lines[0].items()}
    assert validator.is_valid(lines[0]) and not validator.is_valid(renamed)
    assert not validator.is_valid({**lines[0], "request_body": None})  # bodies come in pairs


def test_the_export_holds_the_messages_tool_calls_reasoning_and_bodies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    document, stream, completion, undecodable, error = (
        json.loads(line) for line in exported(tmp_path, capsys, "--with-bodies")
    )
    for row in (document, stream):
        assert row["prompt"] == MESSAGES
        assert row["sampling"]["tools"] == TOOLS
    [choice] = document["choices"]
    assert choice["reasoning"] == f"The user wants weather. {HOSTILE}"
    assert choice["tool_calls"] == [{"index": 0, **TOOL_CALL}]
    [choice] = stream["choices"]
    assert choice["reasoning"] == f"Weather, so a tool. {HOSTILE}"
    assert choice["tool_calls"] == [{"index": 0, **TOOL_CALL}]
    assert completion["prompt"] == "Once upon"
    assert completion["choices"][0]["reasoning"] is None
    assert completion["choices"][0]["tool_calls"] is None

    request = document["request_body"]
    # Its tools list keys out of sorted order, which a chat template reads: the body
    # is stored as sent, not rebuilt from the view.
    assert not request["rebuilt"] and not request["cut"] and request["encoding"] == "utf-8"
    assert request["data"] == chat(stream=False).request_json().decode()
    assert json.loads(document["response_body"]["data"]) == json.loads(
        document_with_extras()[1].split(b"\r\n\r\n", 1)[1]
    )
    assert stream["response_body"]["data"].startswith("data: ")
    raw = base64.b64decode(undecodable["response_body"]["data"])
    assert undecodable["response_body"]["encoding"] == "base64" and raw.startswith(b"\xff\xfe")
    assert error["error"] == f"no such model {HOSTILE}"


def test_the_provers_text_is_escaped_in_every_line_and_loads_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = exported(tmp_path, capsys, "--with-bodies")
    for line in lines:
        assert not any(c in line for c in "\x1b\x07\x9b\x7f\u202e\u202c\n")
    assert json.loads(lines[0])["model"] == HOSTILE

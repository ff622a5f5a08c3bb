"""`collector log export --format jsonl`: the documented keys, in order, with their values."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from veritap.envelope import EnvelopeError
from veritap.signing import Signer
from veritap.v1 import record_pb2

from collector.cli import main
from collector.log import export
from tests.collector.log.log_fixtures import ORIGIN, lone_envelope, make_record, open_log

#: The keys only `--with-bodies` adds.
BODY_KEYS = ["request_body", "response_body"]


def documented_keys(*, with_bodies: bool = False) -> list[str]:
    """The key column of the table in collector/log/export.py's docstring."""
    doc = export.__doc__ or ""
    keys = re.findall(r"^([a-z0-9_]+) {2,}", doc, flags=re.MULTILINE)
    assert keys[0] == "key"  # the table's header
    assert keys[-2:] == BODY_KEYS
    return keys[1:] if with_bodies else keys[1:-2]


def full_record() -> record_pb2.InferenceRecord:
    record = make_record(1)
    record.request.target = "/v1/chat/completions?api-version=1"
    record.request.host = "prover.test:8000"
    record.api.dialect = "openai-chat"
    record.api.sampling.temperature = 0.5
    record.api.sampling.stream = True
    record.api.sampling.params_json = '{"seed":3,"stream":true,"temperature":0.5}'
    record.api.prompt_token_ids.ids.extend([1, 2, 3])
    first = record.api.choices.add(index=0, text="Hello", finish_reason="stop")
    first.token_ids.ids.extend([7, 8])
    record.api.choices.add(index=1, text="Hi", finish_reason="length")
    record.api.usage.prompt_tokens = 3
    record.api.usage.completion_tokens = 2
    record.api.usage.total_tokens = 5
    record.response.sse_arrival_offsets_ns.append(5)
    record.flow.ip_version = 6
    record.flow.client_address = "::1"
    record.flow.client_port = 40000
    record.flow.server_address = "::1"
    record.flow.server_port = 8000
    record.flow.vlan_ids.extend([100])
    record.quality = record_pb2.CAPTURE_QUALITY_RESPONSE_GAP
    record.quality_reason = "hole of 1448 bytes"
    return record


def export_lines(
    path: Path, capsys: pytest.CaptureFixture[str], *extra: str
) -> list[dict[str, Any]]:
    assert main(["log", "export", str(path), "--format", "jsonl", *extra]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_export_has_the_documented_keys_and_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bare = make_record(2)
    bare.ClearField("response")
    with open_log(tmp_path / "log", Signer.generate(ORIGIN)) as log:
        log.append_many([full_record(), bare, make_record(3)])
        hashes = [hashlib.sha256(b"\x00" + log.entry(seq)).hexdigest() for seq in (1, 2, 3)]
    rows = export_lines(tmp_path / "log", capsys)
    keys = documented_keys()
    required = {
        "seq", "record_id", "path", "http_status", "model", "stream", "sampling",
        "prompt_token_ids", "choices", "quality", "quality_reason",
        "request_body_sha256", "response_body_sha256",
    }  # fmt: skip
    assert required <= set(keys)
    assert [list(row) for row in rows] == [keys] * 3
    first, second = rows[0], rows[1]
    record = full_record()
    assert first["seq"] == 1
    assert first["record_id"] == record.record_id
    assert first["entry_hash"] == hashes[0]
    assert first["path"] == "/v1/chat/completions"
    assert first["target"] == "/v1/chat/completions?api-version=1"
    assert first["http_status"] == 200
    assert first["model"] == "tiny-llama"
    assert first["stream"] is True
    assert first["sampling"] == {"seed": 3, "stream": True, "temperature": 0.5}
    assert first["prompt_token_ids"] == [1, 2, 3]
    no_extras = {"reasoning": None, "tool_calls": None}
    assert first["choices"] == [
        {"index": 0, "text": "Hello", "token_ids": [7, 8], "finish_reason": "stop", **no_extras},
        {"index": 1, "text": "Hi", "token_ids": None, "finish_reason": "length", **no_extras},
    ]
    assert first["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert first["flow"]["vlan_ids"] == [100]
    assert first["sse_events"] == 1
    assert first["quality"] == "response_gap"
    assert first["quality_reason"] == "hole of 1448 bytes"
    assert first["request_body_sha256"] == hashlib.sha256(record.request.body).hexdigest()
    assert first["response_body_sha256"] == hashlib.sha256(record.response.body).hexdigest()
    assert second["http_status"] is None
    assert second["stream"] is False
    assert second["prompt_token_ids"] is None
    assert second["usage"] is None
    assert second["response_body_sha256"] == hashlib.sha256(b"").hexdigest()
    assert [row["seq"] for row in export_lines(tmp_path / "log", capsys, "--from", "2")] == [2, 3]
    with_bodies = export_lines(tmp_path / "log", capsys, "--with-bodies")
    assert [list(row) for row in with_bodies] == [documented_keys(with_bodies=True)] * 3
    assert with_bodies[1]["response_body"] is None


def test_tool_calls_and_reasoning_come_from_the_record_never_from_its_body() -> None:
    record = full_record()
    record.response.body = b'{"choices":[{"index":1,"message":{"reasoning":"body only"}}]}'
    first = record.api.choices[0]
    first.reasoning = "thought"
    first.tool_calls.add(id="c-1c-2", type="function", function_name="f", function_arguments="{}")
    envelope = lone_envelope(record.SerializeToString())
    choices = export.record_object(1, envelope)["choices"]
    assert isinstance(choices, list)
    with_extras, without = choices
    assert with_extras["reasoning"] == "thought"
    assert with_extras["tool_calls"] == [
        {
            "index": 0,
            "id": "c-1c-2",
            "type": "function",
            "function": {"name": "f", "arguments": "{}"},
        }
    ]
    assert without["reasoning"] is None and without["tool_calls"] is None


def test_sampling_without_params_json_falls_back_to_the_typed_fields() -> None:
    record = make_record(1)
    record.api.sampling.temperature = 0.0
    record.api.sampling.max_tokens = 16
    record.api.sampling.stop.append("\n")
    envelope = lone_envelope(record.SerializeToString())
    row = export.record_object(1, envelope)
    assert row["sampling"] == {"temperature": 0.0, "max_tokens": 16, "stop": ["\n"]}
    assert '"sampling":{"temperature":0.0,"max_tokens":16,"stop":["\\n"]}' in next(
        export.jsonl_lines([(1, envelope)])
    )


def test_every_quality_has_a_lowercase_name() -> None:
    names = [export.quality_name(v) for v in record_pb2.CaptureQuality.values()]
    assert names == [
        "unspecified",
        "complete",
        "request_gap",
        "response_gap",
        "truncated",
        "midstream",
        "parse_error",
        "ambiguous",
    ]
    assert export.quality_name(99) == "unknown_99"


@settings(max_examples=50)
@given(st.binary(max_size=300))
def test_any_record_bytes_export_or_fail_cleanly(data: bytes) -> None:
    envelope = lone_envelope(data)
    try:
        row = export.record_object(1, envelope, with_bodies=True)
    except EnvelopeError:
        return
    assert list(row) == documented_keys(with_bodies=True)
    json.dumps(row)

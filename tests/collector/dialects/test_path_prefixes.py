"""Dialect paths under a gateway's prefix (`[http] dialect_path_prefixes`), config to record."""

from __future__ import annotations

from pathlib import Path

import pytest
from veritap.config_schema import ConfigError
from veritap.v1 import record_pb2

from collector.config import load_config
from collector.dialects import DialectRegistry
from collector.pipeline import CapturePipeline
from tests.openai_traffic import Call, words
from tests.pcapgen import Conversation, frame

GATEWAY = DialectRegistry(
    ["openai-chat", "openai-completions", "openai-responses", "anthropic-messages"],
    ("", "/openai", "/gw/llm"),
)


@pytest.mark.parametrize(
    ("target", "dialect"),
    [
        ("/v1/chat/completions", "openai-chat"),
        ("/openai/v1/chat/completions", "openai-chat"),
        ("/openai/v1/completions/?x=1", "openai-completions"),
        ("http://gateway/openai/v1/%63hat/completions", "openai-chat"),
        ("/openai%2Fv1/chat/completions", "openai-chat"),
        ("/gw/llm/v1/completions", "openai-completions"),
        ("/openai/v1/responses", "openai-responses"),
        ("/v1/responses/", "openai-responses"),
        ("/gw/llm/v1/messages", "anthropic-messages"),
        ("/v1/messages/count_tokens", None),
        ("/gw/v1/completions", None),
        ("/openaiv1/chat/completions", None),
        ("/other/v1/chat/completions", None),
        ("/openai", None),
    ],
)
def test_targets_match_under_every_prefix_as_the_server_routes_them(
    target: str, dialect: str | None
) -> None:
    found = GATEWAY.for_target(target)
    assert (found.name if found else None) == dialect
    assert GATEWAY.records("POST", target) is (dialect is not None)


def test_without_the_empty_prefix_the_plain_paths_are_not_recorded() -> None:
    only_gateway = DialectRegistry(["openai-chat"], ("/openai",))
    assert only_gateway.for_target("/v1/chat/completions") is None
    assert only_gateway.for_target("/openai/v1/chat/completions") is not None


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "collector.toml"
    path.write_text(text)
    return path


def test_the_default_is_the_servers_own_paths(tmp_path: Path) -> None:
    assert load_config(_config(tmp_path, "")).http.dialect_path_prefixes == ("",)


@pytest.mark.parametrize("prefix", ["openai", "/openai/", "/", "v1/"])
def test_a_bad_prefix_names_its_key(tmp_path: Path, prefix: str) -> None:
    text = f"[http]\ndialect_path_prefixes = [{prefix!r}]\n"
    with pytest.raises(ConfigError, match=r"^http\.dialect_path_prefixes[:\[ ]"):
        load_config(_config(tmp_path, text))


def test_an_empty_list_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^http\.dialect_path_prefixes"):
        load_config(_config(tmp_path, "[http]\ndialect_path_prefixes = []\n"))


def test_a_gateway_exchange_becomes_a_chat_record_through_the_pipeline(tmp_path: Path) -> None:
    config = load_config(_config(tmp_path, '[http]\ndialect_path_prefixes = ["/openai"]\n'))
    conv = Conversation().handshake()
    call = Call("/v1/chat/completions", "tiny", [{"role": "user", "content": "hi"}], {}, [words(4)])
    through_gateway = call.request().replace(b"POST /v1/", b"POST /openai/v1/", 1)
    for request in (through_gateway, call.request()):
        conv.exchange(request, call.response())
    conv.close()
    records: list[record_pb2.InferenceRecord] = []
    pipeline = CapturePipeline(config, records.append)
    for packet in conv.packets:
        pipeline.frame(int(packet.ts * 1e9), 1, frame(conv, packet))
    pipeline.finish()
    (record,) = records
    assert record.request.target == "/openai/v1/chat/completions"
    assert record.api.dialect == "openai-chat"
    assert record.api.choices[0].text == words(4).text

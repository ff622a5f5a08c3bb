"""The collector TOML: defaults, overrides, relative paths and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from veritap.config_schema import ConfigError, LogLevel

from collector.capture.decode import ChecksumPolicy
from collector.config import DEFAULT_FILTER, CollectorConfig, load_config


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "collector.toml"
    path.write_text(text)
    return path


def test_every_setting_has_a_working_default(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, ""))
    assert config.capture == CollectorConfig().capture
    assert config.capture.filter == DEFAULT_FILTER
    assert config.capture.server_ports == (8000,)
    assert config.http.dialects == (
        "openai-chat",
        "openai-completions",
        "openai-responses",
        "anthropic-messages",
    )
    assert config.origin.endswith("/veritap")
    limits = config.reassembly.limits(config.capture.server_ports)
    assert limits.gap_timeout_ns == 60_000_000_000 and limits.server_ports == frozenset({8000})
    assert config.capture.checksums is ChecksumPolicy.VERIFY
    assert load_config(None).log == config.log


def test_values_and_relative_paths(tmp_path: Path) -> None:
    config = load_config(
        _write(
            tmp_path,
            '[collector]\norigin = "edge-1.example/veritap"\n'
            '[capture]\ninterface = "eth1"\nserver_ports = [8000, 8001]\npromiscuous = false\n'
            'checksums = "ignore"\n'
            "[reassembly]\ngap_timeout_s = 0.5\n"
            '[http]\ndialects = ["openai-chat"]\n'
            '[log]\npath = "log"\nkey = "/k/collector.key"\nbatch_records = 64\n'
            '[ledger]\nlisten = "127.0.0.1:7701"\n',
        )
    )
    assert config.origin == "edge-1.example/veritap"
    assert (config.capture.interface, config.capture.server_ports) == ("eth1", (8000, 8001))
    assert config.capture.promiscuous is False
    assert config.capture.checksums is ChecksumPolicy.IGNORE
    assert config.reassembly.gap_timeout_s == 0.5
    assert config.http.dialects == ("openai-chat",)
    assert config.log.path == tmp_path / "log" and config.log.key == Path("/k/collector.key")
    assert config.ledger.listen == "127.0.0.1:7701"


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("[capture]\ninterfac = 'lo'\n", "capture.interfac"),
        ("[capture]\npromiscuous = 'yes'\n", "capture.promiscuous"),
        ("[capture]\nserver_ports = [0]\n", "capture.server_ports"),
        ("[capture]\nsnaplen = 10\n", "capture.snaplen"),
        ("[capture]\nchecksums = 'off'\n", "capture.checksums"),
        ("[capture]\nchecksums = false\n", "capture.checksums"),
        ("[reassembly]\nwindow_bytes = 'big'\n", "reassembly.window_bytes"),
        ("[http]\ndialects = ['anthropic']\n", "http.dialects"),
        ("[log]\nbatch_records = 0\n", "log.batch_records"),
        ("[collector]\norigin = 'a b'\n", "collector.origin"),
        ("[capturee]\n", "capturee"),
        ("capture = 3\n", "capture"),
        ("[ledger]\nheartbeat_s = 0\n", "ledger.heartbeat_s"),
    ],
)
def test_errors_name_the_bad_key(tmp_path: Path, text: str, named: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{named}[:\[ ]"):
        load_config(_write(tmp_path, text))


def test_unreadable_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "absent.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(_write(tmp_path, "[capture\n"))


def test_every_bad_key_is_reported_at_once_and_nan_is_refused(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "[reassembly]\ngap_timeout_s = nan\nidle_timeout_s = inf\n"
        "[capture]\nsnaplen = 'big'\ntypo = 1\n[log]\nlevel = 'loud'\n"
        "[ledger]\ntls_cert = 'c.pem'\n",
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert [problem.partition(":")[0] for problem in caught.value.problems] == [
        "capture.snaplen",
        "capture.typo",
        "reassembly.gap_timeout_s",
        "reassembly.idle_timeout_s",
        "log.level",
        "ledger.tls_key",
    ]


def test_log_level_defaults_to_info(tmp_path: Path) -> None:
    assert load_config(_write(tmp_path, "")).log.level is LogLevel.INFO
    assert load_config(_write(tmp_path, "[log]\nlevel = 'debug'\n")).log.level is LogLevel.DEBUG

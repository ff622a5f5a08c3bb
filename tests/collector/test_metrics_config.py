"""The collector's [metrics] table: default address, "" turns /metrics off, bad addresses name
the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from veritap.config_schema import ConfigError

from collector.config import MetricsConfig, config_from_document, load_config


def _load(tmp_path: Path, text: str) -> MetricsConfig:
    path = tmp_path / "collector.toml"
    path.write_text(text)
    return load_config(path).metrics


def test_default_listen_and_off(tmp_path: Path) -> None:
    assert _load(tmp_path, "").listen == "127.0.0.1:9400"
    assert load_config(None).metrics.listen == "127.0.0.1:9400"
    assert _load(tmp_path, '[metrics]\nlisten = ""\n').listen == ""
    assert _load(tmp_path, '[metrics]\nlisten = "[::1]:0"\n').listen == "[::1]:0"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('listen = "9400"', "metrics.listen: metrics address '9400': expected host:port"),
        ('listen = "::1:9400"', "metrics.listen: metrics address '::1:9400': write IPv6"),
        ('listen = "host:99999"', "metrics.listen: metrics address 'host:99999': bad port"),
        ("listen = 9400", "metrics.listen: expected a string"),
        ('listn = "127.0.0.1:9400"', "metrics.listn: unknown key"),
    ],
)
def test_bad_values_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        _load(tmp_path, f"[metrics]\n{text}\n")
    assert str(raised.value).startswith(message)


def test_the_example_config_keeps_metrics_on_loopback() -> None:
    example = Path(__file__).resolve().parents[2] / "appliance" / "config" / "collector.toml"
    assert load_config(example).metrics.listen == "127.0.0.1:9400"


@given(st.one_of(st.text(max_size=24), st.integers(), st.booleans()))
def test_any_listen_value_loads_or_names_the_key(value: object) -> None:
    try:
        config = config_from_document({"metrics": {"listen": value}}, base_dir=Path("/"))
    except ConfigError as exc:
        assert str(exc).startswith("metrics.listen: ")
    else:
        assert config.metrics.listen == value

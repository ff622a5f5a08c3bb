"""verifierd's [metrics] table: the /metrics address and where the vca gauge reads the prover."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from veritap.config_schema import ConfigError

from verifierd.config import PROVER_PRESETS, MetricsConfig, load_config, parse_config
from verifierd.vca import PRESETS


def _metrics(table: dict[str, object]) -> MetricsConfig:
    return parse_config({"metrics": table}, Path("/etc/verifierd")).metrics


def test_defaults() -> None:
    assert parse_config({}, Path("/")).metrics == MetricsConfig()
    assert MetricsConfig().listen == "127.0.0.1:9401"
    assert MetricsConfig().prover_url == ""  # no prover: no vca gauge


def test_values() -> None:
    metrics = _metrics(
        {
            "listen": "",
            "prover_url": "http://prometheus:9090",
            "prover": "cpu",
            "vca_window_s": 120,
            "vca_interval_s": 5,
        }
    )
    assert metrics == MetricsConfig("", "http://prometheus:9090", "cpu", 120.0, 5.0)


def test_prover_names_are_the_vca_presets() -> None:
    assert set(PROVER_PRESETS) == {"auto", *PRESETS}


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"listen": "9401"}, "metrics.listen: metrics address '9401': expected host:port"),
        ({"listen": "a:b"}, "metrics.listen: metrics address 'a:b': bad port"),
        ({"listen": 9401}, "metrics.listen: expected a string, got 9401"),
        ({"prover_url": "prom:9090"}, "metrics.prover_url: expected an http:// or https:// URL"),
        ({"prover": "dcgmm"}, "metrics.prover: expected 'auto', 'dcgm', 'nvml-gpm',"),
        ({"vca_window_s": 0}, "metrics.vca_window_s: must be >= 1.0, got 0"),
        ({"vca_interval_s": "1m"}, "metrics.vca_interval_s: expected a number"),
        ({"lisen": ""}, "metrics.lisen: unknown key"),
    ],
)
def test_bad_values_name_the_key(table: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        _metrics(table)


def test_not_a_table() -> None:
    with pytest.raises(ConfigError, match=r"^metrics: expected a table"):
        parse_config({"metrics": "127.0.0.1:9401"}, Path("/"))


def test_the_example_config_reads_dcgm_from_the_sites_prometheus() -> None:
    example = Path(__file__).resolve().parents[2] / "appliance" / "config" / "verifierd.toml"
    metrics = load_config(example).metrics
    assert metrics.listen == "127.0.0.1:9401"
    assert (metrics.prover_url, metrics.prover) == (
        "http://prometheus.veritap.example:9090",
        "dcgm",
    )


_VALUES = st.one_of(
    st.booleans(),
    st.integers(-5, 70000),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.sampled_from(["127.0.0.1:9401", "[::1]:0", "http://p:9090", "auto", "cpu", ""]),
)


@given(
    st.dictionaries(
        st.sampled_from(["listen", "prover_url", "prover", "vca_window_s", "vca_interval_s", "x"]),
        _VALUES,
    )
)
def test_any_table_parses_or_names_its_bad_key(table: dict[str, object]) -> None:
    try:
        metrics = _metrics(table)
    except ConfigError as exc:
        assert str(exc).startswith("metrics.")
    else:
        assert metrics.prover in PROVER_PRESETS

"""verifierd's [provers] table: windows, the test's false-alarm rate, hiding rates."""

from __future__ import annotations

from pathlib import Path

import pytest
from veritap.config_schema import ConfigError

from verifierd.config import HidingConfig, ProversConfig, load_config, parse_config


def _provers(table: dict[str, object]) -> ProversConfig:
    return parse_config({"provers": table}, Path("/etc/verifierd")).provers


def test_defaults_work_for_the_demo() -> None:
    provers = parse_config({}, Path("/")).provers
    assert provers == ProversConfig()
    assert (provers.windows_s, provers.false_alarm_per_day) == ((3600, 86400), 1e-6)
    assert provers.hiding.rate("no_seed") == 0.5


def test_values_and_per_reason_rates() -> None:
    provers = _provers(
        {
            "windows_s": [86400, 600],
            "false_alarm_per_day": 1e-9,
            "hiding": {"window_s": 600, "min_verdicts": 5, "reasons": {"no_seed": 1.0}},
        }
    )
    assert provers.windows_s == (600, 86400)
    assert provers.hiding == HidingConfig(600, 5, 0.5, (("no_seed", 1.0),))
    assert provers.hiding.rate("no_seed") == 1.0
    assert provers.hiding.rate("capture_gap") == 0.5


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ({"windows_s": [30]}, "windows_s"),
        ({"windows_s": []}, "windows_s"),
        ({"false_alarm_per_day": 0.9}, "false_alarm_per_day"),
        ({"hiding": {"window_s": 7200}}, "hiding.window_s"),
        ({"hiding": {"max_share": 1.5}}, "hiding.max_share"),
        # The verifier's own failures never accuse a prover: no rate for them.
        ({"hiding": {"reasons": {"engine_error": 0.1}}}, "engine_error"),
        ({"hiding": {"reasons": {"no_seed": -0.1}}}, "no_seed"),
        ({"window": 3600}, "window"),
    ],
)
def test_bad_values_name_their_key(table: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        _provers(table)


def test_the_example_config_sets_the_provers_table() -> None:
    example = Path(__file__).resolve().parents[3] / "appliance" / "config" / "verifierd.toml"
    provers = load_config(example).provers
    assert provers.hiding.rate("capture_gap") == 0.2
    assert provers.hiding.window_s in provers.windows_s

"""`check-config`: the effective configuration of a good file (an instance of the committed
JSON Schema), every problem of a bad one with the config-error exit code, which `run` shares."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from appliance.command_line import EXIT_CONFIG
from collector.cli import main as collector_main
from collector.config import load_config

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "appliance" / "config"


def test_the_example_prints_its_effective_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert collector_main(["check-config", "--config", str(EXAMPLES / "collector.toml")]) == 0
    effective = json.loads(capsys.readouterr().out)
    assert effective["collector"]["origin"] == "veritap.example/tap-01"
    assert effective["reassembly"]["gap_timeout_s"] == 60.0  # a default, filled in
    assert effective["log"]["level"] == "info"
    schema = json.loads((EXAMPLES / "collector.schema.json").read_text())
    jsonschema.validate(effective, schema)


def test_the_effective_config_reads_back_as_the_same_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert collector_main(["check-config", "--config", str(EXAMPLES / "collector.toml")]) == 0
    effective = json.loads(capsys.readouterr().out)
    written = tmp_path / "effective.toml"
    written.write_text(_toml(effective))
    assert load_config(written) == load_config(EXAMPLES / "collector.toml")


def test_a_bad_file_lists_every_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "collector.toml"
    bad.write_text("[capture]\nsnaplen = 1\n[reassembly]\ngap_timeout_s = nan\n[lgo]\n")
    assert collector_main(["check-config", "--config", str(bad)]) == EXIT_CONFIG
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"collector check-config: {bad}: invalid",
        "  capture.snaplen: must be >= 96, got 1",
        "  reassembly.gap_timeout_s: expected a finite number, got nan",
        "  lgo: unknown key",
    ]


def test_run_exits_with_the_config_error_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "collector.toml"
    bad.write_text("[reassembly]\ngap_timeout_s = nan\n")
    assert collector_main(["run", "--config", str(bad)]) == EXIT_CONFIG
    assert "reassembly.gap_timeout_s" in capsys.readouterr().err


def _toml(document: dict[str, dict[str, object]]) -> str:
    """Tables of strings, numbers, booleans and arrays of them, as JSON spells them (valid
    TOML for these values); null is TOML's absent key."""
    lines = []
    for name, table in document.items():
        lines.append(f"[{name}]")
        lines.extend(f"{k} = {json.dumps(v)}" for k, v in table.items() if v is not None)
    return "\n".join(lines) + "\n"

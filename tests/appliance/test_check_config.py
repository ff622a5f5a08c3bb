"""`check-config`: the effective configuration of a good file (an instance of the committed
JSON Schema), every problem of a bad one with the config-error exit code, which `run` shares;
`--schema` is what appliance/config/*.schema.json hold (`make config-schema-check` diffs it
too)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import jsonschema
import pytest

from appliance.command_line import EXIT_CONFIG
from collector.cli import main as collector_main
from collector.config import load_config
from verifierd.cli import main as verifierd_main

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "appliance" / "config"


MAINS: dict[str, Callable[[Sequence[str] | None], int]] = {
    "collector": collector_main,
    "verifierd": verifierd_main,
}


@pytest.mark.parametrize("daemon", sorted(MAINS))
def test_the_example_prints_its_effective_config(
    daemon: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert MAINS[daemon](["check-config", "--config", str(EXAMPLES / f"{daemon}.toml")]) == 0
    effective = json.loads(capsys.readouterr().out)
    assert effective["log"]["level"] == "info"  # a default, filled in
    schema = json.loads((EXAMPLES / f"{daemon}.schema.json").read_text())
    jsonschema.validate(effective, schema)


def test_the_effective_config_has_every_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert verifierd_main(["check-config", "--config", str(EXAMPLES / "verifierd.toml")]) == 0
    effective = json.loads(capsys.readouterr().out)
    assert effective["verifierd"]["verifier_id"] == "g294-z21-01"
    assert effective["scheduler"]["max_attempts"] == 4
    assert effective["engines"]["max_batch_tokens"] == 65536
    assert effective["collectors"][0]["window"] == 4096


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


def test_verifierd_lists_every_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "verifierd.toml"
    bad.write_text("[engines]\ndevice = 'cuda'\n[intake]\nreconnect_factor = inf\n")
    assert verifierd_main(["check-config", "--config", str(bad)]) == EXIT_CONFIG
    assert capsys.readouterr().err.splitlines()[1:] == [
        "  engines.gpu_indices: device 'cuda' needs at least one GPU index",
        "  intake.reconnect_factor: expected a finite number, got inf",
    ]


@pytest.mark.parametrize("daemon", sorted(MAINS))
def test_run_exits_with_the_config_error_code(
    daemon: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / f"{daemon}.toml"
    bad.write_text("[log]\nlevel = nan\n")
    assert MAINS[daemon](["run", "--config", str(bad)]) == EXIT_CONFIG
    assert "log.level" in capsys.readouterr().err


def test_collector_serve_exits_with_the_config_error_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "collector.toml"
    bad.write_text("[ledger]\nlisten = 7\n")
    assert collector_main(["serve", "--config", str(bad)]) == EXIT_CONFIG
    assert "ledger.listen" in capsys.readouterr().err


@pytest.mark.parametrize("daemon", sorted(MAINS))
def test_the_schema_is_the_committed_one(daemon: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert MAINS[daemon](["check-config", "--schema"]) == 0
    assert capsys.readouterr().out == (EXAMPLES / f"{daemon}.schema.json").read_text()


def _toml(document: dict[str, dict[str, object]]) -> str:
    """Tables of strings, numbers, booleans and arrays of them, as JSON spells them (valid
    TOML for these values); null is TOML's absent key."""
    lines = []
    for name, table in document.items():
        lines.append(f"[{name}]")
        lines.extend(f"{k} = {json.dumps(v)}" for k, v in table.items() if v is not None)
    return "\n".join(lines) + "\n"

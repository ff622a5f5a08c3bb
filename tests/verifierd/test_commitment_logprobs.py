"""The logprobs parts of a commitment: the server's --logprobs-mode and the calibrated
tolerance, both written only when they differ from the defaults."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from tests.verifierd.commitment_fixtures import commit, make_model_dir
from verifierd.cli import main
from verifierd.commitments import CommitmentError, DifrSettings, parse_commitment


def test_defaults_leave_the_body_and_the_id_as_before(tmp_path: Path) -> None:
    c = commit(make_model_dir(tmp_path / "m"))
    body = json.loads(c.to_json())
    assert "logprobs_mode" not in body and "logprobs_tolerance" not in body["difr"]
    assert (c.logprobs_mode, c.difr.logprobs_tolerance) == ("raw_logprobs", 0.25)


def test_mode_and_tolerance_round_trip_and_change_the_id(tmp_path: Path) -> None:
    c = commit(make_model_dir(tmp_path / "m"))
    changed = replace(c, logprobs_mode="raw_logits").with_difr(
        replace(c.difr, logprobs_tolerance=0.002)
    )
    back = parse_commitment(changed.to_json())
    assert (back.logprobs_mode, back.difr.logprobs_tolerance) == ("raw_logits", 0.002)
    assert back.commitment_id == changed.commitment_id != c.commitment_id
    assert changed.to_proto().logprobs_mode == "raw_logits"
    assert DifrSettings.from_proto(changed.difr.to_proto()) == changed.difr


def test_a_message_without_a_tolerance_gets_the_default() -> None:
    old = DifrSettings(threshold=0.1, delta_max=1.0, sample_rate=1.0).to_proto()
    old.ClearField("logprobs_tolerance")
    assert DifrSettings.from_proto(old).logprobs_tolerance == DifrSettings.logprobs_tolerance


def test_bad_values_are_refused(tmp_path: Path) -> None:
    c = commit(make_model_dir(tmp_path / "m"))
    with pytest.raises(CommitmentError, match="logprobs_mode"):
        replace(c, logprobs_mode="softmax")
    with pytest.raises(CommitmentError, match="logprobs_tolerance"):
        DifrSettings(threshold=0.1, delta_max=1.0, sample_rate=1.0, logprobs_tolerance=-1.0)
    body = json.loads(c.to_json())
    body["difr"]["logprobs_tolerance"] = "0.1"
    with pytest.raises(CommitmentError, match="malformed"):
        parse_commitment(json.dumps(body))


def test_verifierd_commit_takes_the_servers_logprobs_mode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = make_model_dir(tmp_path / "m")
    assert main(["commit", str(model), "--logprobs-mode", "raw_logits"]) == 0
    assert json.loads(capsys.readouterr().out)["logprobs_mode"] == "raw_logits"
    with pytest.raises(SystemExit):
        main(["commit", str(model), "--logprobs-mode", "softmax"])

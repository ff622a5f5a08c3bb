"""`verifierd commit` and `verifierd weights add|verify` from the command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.verifierd.commitment_fixtures import make_model_dir
from verifierd.cli import main
from verifierd.commitments import load_commitment


def test_commit_install_and_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = make_model_dir(tmp_path / "my-model")
    config = tmp_path / "verifierd.toml"
    config.write_text('[verifierd]\ncommitments_dir = "commitments"\n')
    (tmp_path / "commitments").mkdir()
    out = tmp_path / "commitments" / "my.json"
    code = main(
        [
            "commit", str(model), "--served-name", "my", "--served-name", "my-alias",
            "--sampler-profile", "vllm-v2-hash", "--tensor-parallel-size", "8",
            "--engine-version", "0.32.0", "--threshold", "0.2", "--sample-rate", "0.25",
            "-o", str(out), "--install", "--config", str(config),
        ]
    )  # fmt: skip
    assert code == 0
    c = load_commitment(out)
    assert c.served_model_names == ("my", "my-alias")
    assert (c.sampler_profile, c.tensor_parallel_size, c.engine_version) == (
        "vllm-v2-hash",
        8,
        "0.32.0",
    )
    assert (c.difr.threshold, c.difr.sample_rate) == (0.2, 0.25)
    assert c.commitment_id in capsys.readouterr().err

    assert main(["weights", "--config", str(config), "verify"]) == 0
    assert "ok (0 files" in capsys.readouterr().out
    assert main(["weights", "--config", str(config), "verify", "--reverify"]) == 0
    assert f"ok ({len(c.files)} files" in capsys.readouterr().out
    shard = tmp_path / "verifierd-state" / "weights" / c.weights_id / "config.json"
    shard.write_text("{}")
    assert main(["weights", "--config", str(config), "verify"]) == 1
    assert "weights_mismatch" in capsys.readouterr().out


def test_commit_to_stdout_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = make_model_dir(tmp_path / "m")
    assert main(["commit", str(model), "--generation-config", "vllm"]) == 0
    assert '"served_model_names": [\n    "m"\n  ]' in capsys.readouterr().out
    assert main(["commit", str(model), "--sampler-profile", "nope"]) == 2
    assert "unknown sampler profile" in capsys.readouterr().err
    assert main(["commit", str(tmp_path / "missing")]) == 2


def test_weights_add(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = make_model_dir(tmp_path / "m")
    assert main(["commit", str(model), "-o", str(tmp_path / "c.json")]) == 0
    config = tmp_path / "v.toml"
    config.write_text("")
    assert (
        main(["weights", "--config", str(config), "add", str(tmp_path / "c.json"), str(model)]) == 0
    )
    assert "verifierd-state/weights/" in capsys.readouterr().out
    other = make_model_dir(tmp_path / "other", seed=9)
    assert (
        main(["weights", "--config", str(config), "add", str(tmp_path / "c.json"), str(other)]) == 0
    )
    # Already installed and verified: the source is not read again.
    (tmp_path / "c.json").write_text("{}")
    assert (
        main(["weights", "--config", str(config), "add", str(tmp_path / "c.json"), str(model)]) == 2
    )

"""`verifierd calibrate` end to end: store records → engine → settings (applied, written)."""

from __future__ import annotations

from pathlib import Path

import pytest
from veritap.v1 import record_pb2

from tests.verifierd.commitment_fixtures import commit, make_model_dir
from tests.verifierd.engine_doubles import FACTORY
from tests.verifierd.record_fixtures import Exchange, ingest
from verifierd.cli import main
from verifierd.commitments import load_commitment, write_commitment
from verifierd.config import load_config
from verifierd.store import Store
from verifierd.weights_cache import WeightsCache


def test_calibrate_applies_and_writes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = make_model_dir(tmp_path / "model")
    c = commit(model, generation_config="vllm")
    (tmp_path / "commitments").mkdir()
    write_commitment(c, tmp_path / "commitments" / "tiny.json")
    config_path = tmp_path / "verifierd.toml"
    config_path.write_text(f'[engines]\nbackend = "{FACTORY}"\n')
    config = load_config(config_path)
    WeightsCache(config.weights_dir).install(c, model)
    store = Store.open(config.store_dir)
    # The stand-in engine scores token ids >= 1000 as margin 1.0, others 0.
    honest = [Exchange(f"h{i}", outputs=((5, 6, 1500 if i == 3 else 7),)) for i in range(20)]
    ignored = [
        Exchange("gap", quality=record_pb2.CAPTURE_QUALITY_TRUNCATED, outputs=((1500, 1500),)),
        Exchange("other", model="other", outputs=((1500,),)),
        Exchange("unseeded", seed=None, outputs=((1500,),)),
    ]
    ingest(store, "edge", honest + ignored)
    store.close()

    out = tmp_path / "calibrated.json"
    args = [
        "calibrate",
        "--config",
        str(config_path),
        "--commitment",
        "tiny",
        "--target-fpr",
        "0.01",
    ]
    assert main([*args, "--apply", "--write", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "responses 20, tokens 60" in printed
    assert "delta_max 1, threshold 0.5 (maximum rule" in printed

    store = Store.open(config.store_dir, readonly=True)
    override = store.difr_override(c.commitment_id)
    events = store.audit_log()
    store.close()
    assert override is not None
    assert (override.threshold, override.delta_max) == (0.5, 1.0)
    # The settings and the honest tails the provers' sequential tests read, both audited.
    assert len(events) == 2
    assert {e.actor for e in events} == {"verifierd calibrate"}
    written = load_commitment(out)
    assert (written.difr.threshold, written.difr.delta_max) == (0.5, 1.0)
    assert written.commitment_id != c.commitment_id and written.weights_id == c.weights_id

    assert main([*args, "--origin", "nowhere"]) == 2
    assert "need at least 2 honest responses" in capsys.readouterr().err
    assert main(["calibrate", "--config", str(config_path), "--commitment", "zz"]) == 2

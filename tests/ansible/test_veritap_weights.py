"""The verifier role's weights module against verifierd's own cache check."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.ansible.committed_model import CommittedModel, make_committed_model
from tests.ansible.module_runner import run_module
from verifierd.weights_cache import WeightsCache, WeightsMismatchError


@pytest.fixture
def model(tmp_path: Path) -> CommittedModel:
    return make_committed_model(tmp_path)


def sync(model: CommittedModel, cache: Path, *, check: bool = False) -> dict[str, object]:
    args = {
        "commitment": str(model.commitment_file),
        "source": str(model.model_dir),
        "weights_dir": str(cache),
    }
    return run_module("verifier", "veritap_weights", args, check=check)


def test_sync_is_what_verifierd_accepts_without_rehashing(
    model: CommittedModel, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    first = sync(model, cache)
    assert first["changed"] is True
    assert first["weights_id"] == model.commitment.weights_id
    assert first["tensor_parallel_size"] == 1
    assert sorted(first["files_copied"]) == sorted(f.path for f in model.commitment.files)
    checked = WeightsCache(cache).verify(model.commitment)
    assert checked.files_hashed == 0
    assert not (cache / model.commitment.weights_id / "README.md").exists()

    second = sync(model, cache)
    assert second["changed"] is False
    assert second["files_hashed"] == 0


def test_check_mode_writes_nothing(model: CommittedModel, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    result = sync(model, cache, check=True)
    assert result["changed"] is True
    assert not cache.exists()


def test_a_corrupted_cache_file_is_copied_again(model: CommittedModel, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    sync(model, cache)
    shard = cache / model.commitment.weights_id / "model-00002-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[1000] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(WeightsMismatchError):
        WeightsCache(cache).verify(model.commitment)
    result = sync(model, cache)
    assert result["changed"] is True
    assert result["files_copied"] == ["model-00002-of-00002.safetensors"]
    assert WeightsCache(cache).verify(model.commitment).files_hashed == 0


def test_a_tampered_source_fails_and_leaves_nothing(model: CommittedModel, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    source_shard = model.model_dir / "model-00001-of-00002.safetensors"
    source_shard.write_bytes(b"\0" + source_shard.read_bytes()[1:])
    result = sync(model, cache)
    assert result.get("failed") is True
    assert "sha256" in str(result["msg"])
    target = cache / model.commitment.weights_id
    leftovers = [p for p in target.rglob("*") if p.is_file()] if target.exists() else []
    assert leftovers == []


def test_files_the_commitment_does_not_name_fail_the_task(
    model: CommittedModel, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    sync(model, cache)
    (cache / model.commitment.weights_id / "extra.safetensors").write_bytes(b"x")
    result = sync(model, cache)
    assert result.get("failed") is True
    assert "extra.safetensors" in str(result["msg"])


def test_missing_source_file_fails(model: CommittedModel, tmp_path: Path) -> None:
    os.unlink(model.model_dir / "config.json")
    result = sync(model, tmp_path / "cache")
    assert result.get("failed") is True
    assert "config.json" in str(result["msg"])

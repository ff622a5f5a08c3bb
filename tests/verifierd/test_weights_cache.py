"""Content-addressed weights: install, verify, stamps that spare a rehash, tampering."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.verifierd.commitment_fixtures import commit, make_model_dir
from verifierd.weights_cache import WeightsCache, WeightsMismatchError, WeightsMissingError


def test_install_then_verify_without_rehash(tmp_path: Path) -> None:
    c = commit(make_model_dir(tmp_path / "m"))
    cache = WeightsCache(tmp_path / "cache")
    path = cache.install(c, tmp_path / "m")
    assert path == tmp_path / "cache" / c.weights_id
    assert sorted(p.name for p in path.iterdir()) == [f.path for f in c.files]
    again = cache.verify(c)
    assert (again.files_hashed, again.bytes_hashed) == (0, 0)
    forced = cache.verify(c, reverify=True)
    assert forced.files_hashed == len(c.files)
    assert WeightsCache(tmp_path / "cache").verify(c).files_hashed == 0


def test_rewrite_with_restored_mtime_is_caught(tmp_path: Path) -> None:
    c = commit(make_model_dir(tmp_path / "m"))
    cache = WeightsCache(tmp_path / "cache")
    path = cache.install(c, tmp_path / "m") / "model.safetensors"
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    with path.open("r+b") as fh:
        fh.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_mtime_ns == st.st_mtime_ns
    with pytest.raises(WeightsMismatchError, match=r"model\.safetensors"):
        cache.verify(c)


def test_extra_and_missing_files(tmp_path: Path) -> None:
    c = commit(make_model_dir(tmp_path / "m"))
    cache = WeightsCache(tmp_path / "cache")
    with pytest.raises(WeightsMissingError):
        cache.verify(c)
    path = cache.install(c, tmp_path / "m")
    (path / "README.md").write_text("documentation is allowed")
    cache.verify(c)
    (path / "model-00002.safetensors").write_bytes(b"x")
    with pytest.raises(WeightsMismatchError, match="not in the commitment"):
        cache.verify(c)
    (path / "model-00002.safetensors").unlink()
    (path / "tokenizer.json").unlink()
    with pytest.raises(WeightsMissingError, match=r"tokenizer\.json"):
        cache.verify(c)


def test_install_from_a_different_model_leaves_nothing(tmp_path: Path) -> None:
    c = commit(make_model_dir(tmp_path / "m"))
    make_model_dir(tmp_path / "other", seed=7)
    cache = WeightsCache(tmp_path / "cache")
    with pytest.raises(WeightsMismatchError):
        cache.install(c, tmp_path / "other")
    assert not cache.path_for(c).exists()
    assert [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(".install")] == []

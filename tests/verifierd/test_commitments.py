"""Commitment files: digests of every model file, canonical id, strict parsing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.verifierd.commitment_fixtures import commit, make_model_dir
from verifierd.commitments import (
    Commitment,
    CommitmentError,
    CommitmentRegistry,
    DifrSettings,
    FileDigest,
    GenerationDefaults,
    load_commitment,
    parse_commitment,
    write_commitment,
)


def test_commit_covers_every_model_file(tmp_path: Path) -> None:
    c = commit(make_model_dir(tmp_path / "m"))
    assert [f.path for f in c.files] == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert c.dtype == "float32"
    assert c.max_model_len == 512
    assert "messages" in c.chat_template
    # What vLLM's --generation-config auto applies; do_sample and eos are not sampling keys.
    assert c.generation_defaults == GenerationDefaults(temperature=0.7, top_k=50)
    neutral = commit(tmp_path / "m", generation_config="vllm")
    assert neutral.generation_defaults == GenerationDefaults()
    assert len(c.commitment_id) == 64
    assert c.weights_bytes == (tmp_path / "m" / "model.safetensors").stat().st_size


def test_id_is_stable_and_changes_with_any_byte(tmp_path: Path) -> None:
    model = make_model_dir(tmp_path / "m")
    first = commit(model)
    assert commit(model).commitment_id == first.commitment_id
    (model / "tokenizer.json").write_text('{"version": "1.1"}')
    changed = commit(model)
    assert changed.commitment_id != first.commitment_id
    assert changed.weights_id != first.weights_id


def test_settings_change_the_id_but_not_the_weights_id(tmp_path: Path) -> None:
    c = commit(make_model_dir(tmp_path / "m"))
    other = c.with_difr(DifrSettings(threshold=0.2, delta_max=4.0, sample_rate=0.5))
    assert other.commitment_id != c.commitment_id
    assert other.weights_id == c.weights_id


def test_file_round_trip_and_tamper_detection(tmp_path: Path) -> None:
    c = commit(make_model_dir(tmp_path / "m"), dtype="bfloat16", max_model_len=128)
    path = tmp_path / "tiny.json"
    write_commitment(c, path)
    assert load_commitment(path) == c
    data = json.loads(path.read_text())
    assert data["commitment_id"] == c.commitment_id
    data["dtype"] = "float32"
    path.write_text(json.dumps(data))
    with pytest.raises(CommitmentError, match="does not match its content"):
        load_commitment(path)


def test_weights_must_be_safetensors(tmp_path: Path) -> None:
    model = make_model_dir(tmp_path / "m")
    (model / "model.safetensors").unlink()
    with pytest.raises(CommitmentError, match="safetensors"):
        commit(model)


def test_registry_maps_names_and_refuses_duplicates(tmp_path: Path) -> None:
    a = commit(make_model_dir(tmp_path / "a"), served_model_names=("x", "y"))
    b = commit(make_model_dir(tmp_path / "b", seed=1), served_model_names=("z",))
    registry = CommitmentRegistry.of([a, b])
    assert registry.by_model["y"] is a
    assert registry.by_id[b.commitment_id] is b
    clash = commit(make_model_dir(tmp_path / "c", seed=2), served_model_names=("y",))
    with pytest.raises(CommitmentError, match="served by two commitments"):
        CommitmentRegistry.of([a, clash])
    directory = tmp_path / "commitments"
    directory.mkdir()
    write_commitment(a, directory / "a.json")
    write_commitment(b, directory / "b.json")
    assert set(CommitmentRegistry.from_dir(directory).by_id) == {a.commitment_id, b.commitment_id}
    assert CommitmentRegistry.from_dir(tmp_path / "none").by_id == {}


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.pop("dtype"), "missing"),
        (lambda d: d.update(extra=1), "unexpected keys"),
        (lambda d: d.update(dtype="int4"), "dtype must be one of"),
        (lambda d: d.update(format="v0"), "format must be"),
        (lambda d: d["difr"].update(delta_max=0), "delta_max"),
        (lambda d: d["difr"].update(sample_rate=2), "sample_rate"),
        (lambda d: d.update(files={"../x.safetensors": {"sha256": "0" * 64, "size": 1}}), "inside"),
        (lambda d: d.update(max_model_len=True), "malformed"),
    ],
)
def test_bad_files_are_refused(tmp_path: Path, edit: object, message: str) -> None:
    c = commit(make_model_dir(tmp_path / "m"))
    data = json.loads(c.to_json())
    del data["commitment_id"]
    edit(data)  # type: ignore[operator]
    with pytest.raises(CommitmentError, match=message):
        parse_commitment(json.dumps(data))


_NAMES = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=8)
_FILES = st.dictionaries(
    st.from_regex(r"[a-z]{1,6}(/[a-z]{1,4})?\.(safetensors|json)", fullmatch=True),
    st.tuples(st.from_regex(r"[0-9a-f]{64}", fullmatch=True), st.integers(0, 2**40)),
    min_size=1,
    max_size=4,
).map(lambda d: {"w.safetensors": ("0" * 64, 1), **d})


@settings(deadline=None)
@given(
    names=st.lists(_NAMES, min_size=1, max_size=3, unique=True),
    files=_FILES,
    template=st.text(max_size=30),
    difr=st.tuples(st.floats(0, 10), st.floats(0.01, 50), st.floats(0, 1)),
    defaults=st.builds(
        GenerationDefaults,
        temperature=st.floats(0, 2),
        top_p=st.floats(0.01, 1),
        top_k=st.integers(-1, 100),
    ),
)
def test_any_commitment_round_trips(
    names: list[str],
    files: dict[str, tuple[str, int]],
    template: str,
    difr: tuple[float, float, float],
    defaults: GenerationDefaults,
) -> None:
    c = Commitment(
        served_model_names=tuple(names),
        files=tuple(FileDigest(p, h, s) for p, (h, s) in sorted(files.items())),
        chat_template=template,
        dtype="bfloat16",
        max_model_len=4096,
        sampler_profile="vllm-v2-hash",
        engine="vllm",
        engine_version="0.32.0",
        tensor_parallel_size=8,
        difr=DifrSettings(*difr),
        generation_defaults=defaults,
    )
    parsed = parse_commitment(c.to_json())
    assert parsed == c
    assert parsed.commitment_id == c.commitment_id


@settings(deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_text_is_refused_cleanly(text: str) -> None:
    with pytest.raises(CommitmentError):
        parse_commitment(text)

"""The tiny-model builder: deterministic bytes, padded logits, loadable, perturbations."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from tests.conftest import TinyModels
from verifierd.cli import main as cli_main
from verifierd.tiny_model import (
    CHAT_TEMPLATE,
    Perturbation,
    TinyModel,
    TinyModelError,
    TinyModelSpec,
    build_tiny_model,
    read_tiny_model,
    train_tokenizer_json,
)

FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
)
SMALL = TinyModelSpec(seed=7, vocab_size=400, hidden_size=64, intermediate_size=64, num_layers=1)


def _bytes(path: Path) -> dict[str, bytes]:
    return {name: (path / name).read_bytes() for name in FILES}


def _weights(model: TinyModel) -> dict[str, np.ndarray]:
    return load_file(str(model.path / "model.safetensors"))


def test_same_spec_same_bytes(tmp_path: Path) -> None:
    a = build_tiny_model(tmp_path / "a", SMALL)
    b = build_tiny_model(tmp_path / "b", SMALL)
    assert sorted(p.name for p in a.path.iterdir()) == sorted(FILES)
    assert _bytes(a.path) == _bytes(b.path)


def test_a_written_model_reads_back(tiny_model: TinyModel) -> None:
    assert read_tiny_model(tiny_model.path) == tiny_model


def test_tokenizer_training_is_deterministic() -> None:
    assert train_tokenizer_json.__wrapped__(400) == train_tokenizer_json.__wrapped__(400)


def test_other_seed_other_weights_same_tokenizer(tmp_path: Path) -> None:
    a = build_tiny_model(tmp_path / "a", SMALL)
    b = build_tiny_model(tmp_path / "b", TinyModelSpec(**{**SMALL.__dict__, "seed": 8}))
    assert (a.path / "tokenizer.json").read_bytes() == (b.path / "tokenizer.json").read_bytes()
    wa, wb = _weights(a), _weights(b)
    assert not np.array_equal(wa["lm_head.weight"], wb["lm_head.weight"])


def test_logits_width_is_padded_past_the_tokenizer(tiny_model: TinyModel) -> None:
    from transformers import AutoTokenizer

    config = json.loads((tiny_model.path / "config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model.path))
    assert len(tokenizer) == tiny_model.tokenizer_size == 2048
    assert config["vocab_size"] == tiny_model.logits_width == 2176
    lm_head = _weights(tiny_model)["lm_head.weight"]
    assert lm_head.shape == (2176, 128)
    assert not lm_head[tiny_model.tokenizer_size :].any()
    assert lm_head[: tiny_model.tokenizer_size].std() > 0


def test_padding_rows_drawn_like_the_vocabulary_on_request(tmp_path: Path) -> None:
    zero = build_tiny_model(tmp_path / "zero", SMALL)
    drawn = build_tiny_model(
        tmp_path / "drawn", TinyModelSpec(**{**SMALL.__dict__, "zero_padding": False})
    )
    a, b = _weights(zero)["lm_head.weight"], _weights(drawn)["lm_head.weight"]
    n = zero.tokenizer_size
    assert not a[n:].any()
    assert np.array_equal(a[:n], b[:n])
    assert b[n:].std() == pytest.approx(b[:n].std(), rel=0.2)


def test_loads_in_transformers_with_chat_template(tiny_model: TinyModel) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model.path))
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "def f(x):"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\ndef f(x):<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert tokenizer.eos_token_id == tiny_model.eos_token_id
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model.path))
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    assert logits.shape == (len(ids), tiny_model.logits_width)
    assert 1.0 < float(logits[-1, : tiny_model.tokenizer_size].std()) < 4.0
    assert json.loads((tiny_model.path / "tokenizer_config.json").read_text())["chat_template"] == (
        CHAT_TEMPLATE
    )


def test_bfloat16_weights(tiny_models: TinyModels) -> None:
    from safetensors import safe_open

    model = tiny_models.get(TinyModelSpec(dtype="bfloat16"))
    with safe_open(str(model.path / "model.safetensors"), "pt") as f:
        assert f.get_tensor("lm_head.weight").dtype == torch.bfloat16
    assert json.loads((model.path / "config.json").read_text())["dtype"] == "bfloat16"


@pytest.mark.parametrize(
    ("perturb", "group", "rel_lo", "rel_hi"),
    [
        (Perturbation("int8"), 64, 1e-4, 2e-2),
        (Perturbation("int4"), 32, 2e-2, 0.3),
        (Perturbation("noise", noise_scale=0.05, seed=3), None, 0.03, 0.07),
    ],
)
def test_perturbations_touch_only_layer_projections(
    tmp_path: Path, perturb: Perturbation, group: int | None, rel_lo: float, rel_hi: float
) -> None:
    """int8: <= 256 levels per row; int4: <= 16 per group of 32 inputs; noise: scaled."""
    levels = {"int8": 256, "int4": 16}.get(perturb.kind)
    honest = _weights(build_tiny_model(tmp_path / "h", SMALL))
    spec = TinyModelSpec(**{**SMALL.__dict__, "perturb": perturb})
    bent = _weights(build_tiny_model(tmp_path / "p", spec))
    for name, w in honest.items():
        if not (name.startswith("model.layers.") and w.ndim == 2):
            assert np.array_equal(w, bent[name]), name
            continue
        rel = np.linalg.norm(bent[name] - w) / np.linalg.norm(w)
        assert rel_lo < rel < rel_hi, (name, rel)
        if group is not None and levels is not None and w.shape[1] % group == 0:
            chunks = bent[name].reshape(-1, group)
            assert max(len(np.unique(c)) for c in chunks) <= levels


def test_invalid_specs_are_refused() -> None:
    with pytest.raises(TinyModelError):
        TinyModelSpec(dtype="int8")
    with pytest.raises(TinyModelError):
        TinyModelSpec(hidden_size=100, num_heads=3)
    with pytest.raises(TinyModelError):
        Perturbation("noise")


def test_cli_builds_a_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "m"
    args = ["build-tiny-model", str(out), "--seed", "7", "--vocab-size", "400"]
    args += ["--hidden-size", "64", "--intermediate-size", "64", "--layers", "1"]
    assert cli_main(args) == 0
    assert "logits_width=512" in capsys.readouterr().out
    assert _bytes(out) == _bytes(build_tiny_model(tmp_path / "ref", SMALL).path)
    assert (
        cli_main(
            ["build-tiny-model", str(tmp_path / "x"), "--dtype", "float32", "--perturb", "noise"]
        )
        == 2
    )

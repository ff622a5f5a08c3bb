"""Trained tiny models: reproducible, cached by recipe, derived variants, and realistic
(peaked next-token distributions, greedy text that is valid UTF-8) where the random
model is not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from tests.conftest import MAY_TRAIN, TrainedModels
from verifierd.cli import main as cli_main
from verifierd.commitments import model_files, sha256_file
from verifierd.models import trained_model as trained_model_module
from verifierd.models.trained_model import MODEL_CARD, recipe_digest, trained_model
from verifierd.models.training import TrainingRecipe, TrainingRun, train_weights
from verifierd.tiny_model import (
    Perturbation,
    TinyModel,
    TinyModelSpec,
    corpus_files,
    perturb_weights,
    random_weights,
)

SMALL = TinyModelSpec(seed=7, vocab_size=400, hidden_size=64, intermediate_size=64, num_layers=1)
#: A few seconds of training: enough to check reproducibility and caching.
QUICK = TrainingRecipe(spec=SMALL, steps=12, batch_size=4, seq_len=64)
CHAT_QUESTIONS = (
    "Return the sum of a and b.",
    "Parse the command line arguments.",
    "Read a configuration file.",
    "Tell me about yourself.",
)


def _digests(model: TinyModel) -> dict[str, str]:
    """sha256 of every file a commitment covers (the model card is not one)."""
    return {p.name: sha256_file(p) for p in model_files(model.path)}


def _count_trainings(monkeypatch: pytest.MonkeyPatch) -> list[TrainingRecipe]:
    calls: list[TrainingRecipe] = []

    def counting(recipe: TrainingRecipe, *args: Any) -> TrainingRun:
        calls.append(recipe)
        return train_weights(recipe, *args)

    monkeypatch.setattr(trained_model_module, "train_weights", counting)
    return calls


def test_same_recipe_same_weights(tmp_path: Path) -> None:
    a = trained_model(QUICK, tmp_path / "a")
    b = trained_model(QUICK, tmp_path / "b")
    assert a.path.name == b.path.name == recipe_digest(QUICK)
    assert "model.safetensors" in _digests(a)
    assert _digests(a) == _digests(b)
    initial = random_weights(SMALL, a.logits_width, a.tokenizer_size)["lm_head.weight"]
    assert not np.array_equal(
        load_file(str(a.path / "model.safetensors"))["lm_head.weight"], initial
    )


def test_a_built_recipe_comes_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _count_trainings(monkeypatch)
    first = trained_model(QUICK, tmp_path)
    assert trained_model(QUICK, tmp_path) == first
    assert calls == [QUICK]
    other = TrainingRecipe(**{**QUICK.__dict__, "steps": 13})
    assert trained_model(other, tmp_path).path != first.path
    assert calls == [QUICK, other]
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == sorted(
        [first.path.name, recipe_digest(other)]
    )


def test_the_digest_names_every_recipe_value() -> None:
    assert recipe_digest(QUICK) == recipe_digest(TrainingRecipe(**QUICK.__dict__))
    variants = [
        TrainingRecipe(**{**QUICK.__dict__, "threads": 1}),
        TrainingRecipe(**{**QUICK.__dict__, "learning_rate": 1e-3}),
        TrainingRecipe(
            **{**QUICK.__dict__, "spec": TinyModelSpec(**{**SMALL.__dict__, "seed": 8})}
        ),
    ]
    assert len({recipe_digest(r) for r in [QUICK, *variants]}) == 4


def test_variants_are_derived_from_the_trained_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _count_trainings(monkeypatch)
    spec = TinyModelSpec(**{**SMALL.__dict__, "dtype": "bfloat16", "perturb": Perturbation("int8")})
    variant = trained_model(TrainingRecipe(**{**QUICK.__dict__, "spec": spec}), tmp_path)
    base = trained_model(QUICK, tmp_path)
    assert calls == [QUICK]
    from safetensors.torch import load_file as load_torch

    expected = perturb_weights(
        load_file(str(base.path / "model.safetensors")), Perturbation("int8")
    )
    got = load_torch(str(variant.path / "model.safetensors"))
    for name, weight in expected.items():
        assert got[name].dtype == torch.bfloat16
        assert torch.equal(got[name], torch.from_numpy(weight).to(torch.bfloat16)), name
    assert json.loads((variant.path / "config.json").read_text())["dtype"] == "bfloat16"
    assert variant.tokenizer_size == base.tokenizer_size


def test_the_model_card_records_the_recipe(tmp_path: Path) -> None:
    model = trained_model(QUICK, tmp_path)
    card = (model.path / MODEL_CARD).read_text()
    facts = json.loads(card.split("```json\n", 1)[1].split("```", 1)[0])
    assert facts["recipe"]["steps"] == 12 and facts["recipe"]["spec"]["seed"] == 7
    assert facts["final_loss"] < facts["first_loss"]
    assert MODEL_CARD not in {p.name for p in model_files(model.path)}


def test_cli_copies_the_trained_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, cache = tmp_path / "m", tmp_path / "cache"
    args = ["build-tiny-model", str(out), "--trained", "--steps", "12", "--cache-dir", str(cache)]
    args += ["--seed", "7", "--vocab-size", "400", "--hidden-size", "64"]
    args += ["--intermediate-size", "64", "--layers", "1"]
    assert cli_main(args) == 0
    assert "trained, cached in" in capsys.readouterr().out
    cached = trained_model(TrainingRecipe(spec=SMALL, steps=12), cache)
    assert {p.name: sha256_file(p) for p in model_files(out)} == _digests(cached)


def _corpus_prompts(model: TinyModel, count: int, length: int) -> list[list[int]]:
    """``length`` tokens from the middle of every few corpus files."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model.path))
    files = corpus_files()
    texts = [p.read_text(encoding="utf-8")[2000:6000] for p in files[:: len(files) // count]]
    return [tokenizer.encode(t, add_special_tokens=False)[:length] for t in texts[:count]]


def _mean_max_probability(model: TinyModel, prompts: list[list[int]]) -> float:
    from transformers import AutoModelForCausalLM

    net = AutoModelForCausalLM.from_pretrained(str(model.path)).eval()
    with torch.no_grad():
        peaks = [net(torch.tensor([ids])).logits[0].softmax(-1).max(-1).values for ids in prompts]
    return float(torch.cat(peaks).mean())


def _greedy_texts(model: TinyModel, prompts: list[list[int]], new_tokens: int) -> list[str]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model.path))
    net = AutoModelForCausalLM.from_pretrained(str(model.path)).eval()
    texts = []
    with torch.no_grad():
        for ids in prompts:
            out = net.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False)
            texts.append(str(tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True)))
    return texts


def _chat_prompts(model: TinyModel) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model.path))
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
        )
        for q in CHAT_QUESTIONS
    ]
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


@MAY_TRAIN
def test_trained_distributions_are_peaked(
    trained_tiny_model: TinyModel, tiny_model: TinyModel
) -> None:
    prompts = _corpus_prompts(tiny_model, count=8, length=128)
    trained = _mean_max_probability(trained_tiny_model, prompts)
    random = _mean_max_probability(tiny_model, prompts)
    assert random < 0.15
    assert trained > 0.25 and trained > 2.5 * random, (trained, random)


@MAY_TRAIN
def test_trained_greedy_text_is_valid_utf8(
    trained_tiny_model: TinyModel, tiny_model: TinyModel
) -> None:
    """Lossy decoding shows a byte sequence that is not UTF-8 as U+FFFD."""
    prompts = [*_chat_prompts(tiny_model), *_corpus_prompts(tiny_model, count=4, length=32)]
    trained = _greedy_texts(trained_tiny_model, prompts, new_tokens=48)
    random = _greedy_texts(tiny_model, prompts, new_tokens=48)
    valid = sum("\ufffd" not in t and t.strip() != "" for t in trained)
    assert valid >= len(prompts) - 1, trained
    assert sum("\ufffd" not in t for t in random) < valid


@MAY_TRAIN
def test_trained_models_fixture_derives_variants(trained_tiny_models: TrainedModels) -> None:
    base = trained_tiny_models.get()
    bf16 = trained_tiny_models.get(TinyModelSpec(dtype="bfloat16"))
    assert bf16.path != base.path
    assert (bf16.path / "tokenizer.json").read_bytes() == (
        base.path / "tokenizer.json"
    ).read_bytes()

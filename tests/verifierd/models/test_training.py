"""The training loop and its recipe: schedule, validation, loss going down, torch restored."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest
import torch

from verifierd.models.training import TrainingError, TrainingRecipe, lr_factor, train_weights
from verifierd.models.training_corpus import token_stream, training_documents
from verifierd.tiny_model import (
    Perturbation,
    TinyModelSpec,
    random_weights,
    train_tokenizer_json,
    write_model_files,
)

SMALL = TinyModelSpec(seed=7, vocab_size=400, hidden_size=64, intermediate_size=64, num_layers=1)


def test_learning_rate_warms_up_then_decays_to_a_tenth() -> None:
    recipe = TrainingRecipe(steps=100, warmup_fraction=0.1)
    factors = [lr_factor(step, recipe) for step in range(101)]
    assert factors[:10] == pytest.approx([(s + 1) / 10 for s in range(10)])
    assert factors[10] == pytest.approx(1.0)
    assert all(a >= b for a, b in pairwise(factors[10:]))
    assert factors[100] == pytest.approx(0.1)


def test_no_warm_up_starts_at_the_peak() -> None:
    assert lr_factor(0, TrainingRecipe(steps=5, warmup_fraction=0.0)) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "changes",
    [
        {"steps": 0},
        {"batch_size": 0},
        {"threads": 0},
        {"warmup_fraction": 1.0},
        {"learning_rate": 0.0},
        {"seq_len": 4096},
    ],
)
def test_invalid_recipes_are_refused(changes: dict[str, float]) -> None:
    with pytest.raises(TrainingError):
        TrainingRecipe(**changes)  # type: ignore[arg-type]


def test_the_honest_base_is_float32_and_unperturbed() -> None:
    spec = TinyModelSpec(**{**SMALL.__dict__, "dtype": "bfloat16", "perturb": Perturbation("int4")})
    recipe = TrainingRecipe(spec=spec, steps=9)
    assert recipe.honest_base() == TrainingRecipe(spec=SMALL, steps=9)
    assert recipe.honest_base().honest_base() == recipe.honest_base()


def test_training_lowers_the_loss_and_restores_torch(tmp_path: Path) -> None:
    recipe = TrainingRecipe(spec=SMALL, steps=30, batch_size=4, seq_len=64, learning_rate=1e-2)
    model = write_model_files(tmp_path, SMALL)
    tokens = token_stream(training_documents(), train_tokenizer_json(SMALL.vocab_size), SMALL.seed)
    initial = random_weights(SMALL, model.logits_width, model.tokenizer_size)
    threads = torch.get_num_threads()
    run = train_weights(recipe, tmp_path, initial, tokens)
    assert torch.get_num_threads() == threads
    assert not torch.are_deterministic_algorithms_enabled()
    assert len(run.losses) == 30
    assert sum(run.losses[-5:]) / 5 < 0.7 * run.losses[0]
    assert run.weights.keys() == initial.keys()
    assert all(run.weights[k].shape == initial[k].shape for k in initial)
    assert (run.weights["lm_head.weight"] != initial["lm_head.weight"]).any()


def test_too_short_a_stream_is_refused(tmp_path: Path) -> None:
    recipe = TrainingRecipe(spec=SMALL, steps=1, batch_size=1, seq_len=64)
    model = write_model_files(tmp_path, SMALL)
    initial = random_weights(SMALL, model.logits_width, model.tokenizer_size)
    with pytest.raises(TrainingError):
        train_weights(recipe, tmp_path, initial, torch.arange(65).numpy())

"""Trained tiny Llamas, built once per recipe into a cache folder and never downloaded.

``trained_model(recipe, cache_root)`` returns the model directory
``cache_root/<digest>/`` for ``recipe``, training it there first when it is
missing. The digest covers everything that decides the weights: the recipe's
values, the interpreter version (the corpus is its standard library), the
versions of numpy, tokenizers, torch and transformers, and the source of the
modules that build the tokenizer, the corpus and the training loop — so an
edit to any of them rebuilds, and nothing else does.

A recipe whose spec asks for another dtype or a perturbation is not trained
again: its weights are the honest float32 model's (trained, or taken from the
cache) written in that dtype and perturbed, like a deployment that quantizes
a published checkpoint.

The directory is in the random tiny model's Hugging Face layout (vLLM and
transformers load it) plus a README.md model card with the recipe and the loss;
commitments leave *.md out. Builds go to a temporary sibling renamed into place,
under a lock file, so concurrent test sessions build each recipe once and never
see a half-written model.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import logging
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path

from verifierd import tiny_model
from verifierd.models import training, training_corpus
from verifierd.models.training import TrainingRecipe, train_weights
from verifierd.models.training_corpus import token_stream, training_documents
from verifierd.tiny_model import (
    TinyModel,
    random_weights,
    read_tiny_model,
    train_tokenizer_json,
    write_model_files,
    write_weights,
)

log = logging.getLogger(__name__)

#: The default cache folder, relative to the working directory (git ignores /build/).
DEFAULT_CACHE = Path("build") / "models"
MODEL_CARD = "README.md"
_LIBRARIES = ("numpy", "tokenizers", "torch", "transformers")
_BUILDING_MODULES = (tiny_model, training_corpus, training, sys.modules[__name__])


def recipe_digest(recipe: TrainingRecipe) -> str:
    """16 hex digits naming ``recipe``'s cache directory (see the module docstring)."""
    ingredients = {
        "recipe": dataclasses.asdict(recipe),
        "python": platform.python_version(),
        "libraries": {name: version(name) for name in _LIBRARIES},
        "code": {
            module.__name__: hashlib.sha256(Path(str(module.__file__)).read_bytes()).hexdigest()
            for module in _BUILDING_MODULES
        },
    }
    text = json.dumps(ingredients, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def trained_model(recipe: TrainingRecipe, cache_root: Path = DEFAULT_CACHE) -> TinyModel:
    """The model ``recipe`` describes, from ``cache_root``; built there first if missing."""
    base_recipe = recipe.honest_base()
    base = _cached(cache_root, base_recipe, lambda out: _train(out, base_recipe))
    if base_recipe == recipe:
        return base
    return _cached(cache_root, recipe, lambda out: _derive(out, recipe, base))


def _cached(cache_root: Path, recipe: TrainingRecipe, build: Callable[[Path], None]) -> TinyModel:
    digest = recipe_digest(recipe)
    final = cache_root / digest
    if not final.is_dir():
        cache_root.mkdir(parents=True, exist_ok=True)
        with _locked(cache_root / f".{digest}.lock"):
            if not final.is_dir():
                scratch = Path(tempfile.mkdtemp(prefix=f".{digest}-", dir=cache_root))
                try:
                    build(scratch)
                    scratch.rename(final)
                finally:
                    shutil.rmtree(scratch, ignore_errors=True)
    return read_tiny_model(final)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _train(out: Path, recipe: TrainingRecipe) -> None:
    spec = recipe.spec
    started = time.monotonic()
    log.info("training tiny model", extra={"recipe": recipe_digest(recipe), "steps": recipe.steps})
    model = write_model_files(out, spec)
    tokens = token_stream(training_documents(), train_tokenizer_json(spec.vocab_size), spec.seed)
    initial = random_weights(spec, model.logits_width, model.tokenizer_size)
    run = train_weights(recipe, out, initial, tokens)
    write_weights(out, spec, run.weights)
    seconds = time.monotonic() - started
    tail = run.losses[-max(len(run.losses) // 10, 1) :]
    _write_card(
        out,
        recipe,
        {
            "corpus_tokens": len(tokens),
            "tokens_trained": recipe.steps * recipe.batch_size * recipe.seq_len,
            "first_loss": round(run.losses[0], 4),
            "final_loss": round(sum(tail) / len(tail), 4),
            "build_seconds": round(seconds, 1),
        },
    )
    log.info("trained tiny model", extra={"path": str(out), "seconds": round(seconds, 1)})


def _derive(out: Path, recipe: TrainingRecipe, base: TinyModel) -> None:
    from safetensors.numpy import load_file

    write_model_files(out, recipe.spec)
    write_weights(out, recipe.spec, load_file(str(base.path / "model.safetensors")))
    _write_card(out, recipe, {"derived_from": base.path.name})


def _write_card(out: Path, recipe: TrainingRecipe, facts: dict[str, object]) -> None:
    body = json.dumps({"recipe": dataclasses.asdict(recipe), **facts}, indent=2, sort_keys=True)
    (out / MODEL_CARD).write_text(
        "# Trained tiny Llama (veritap test model)\n\n"
        "Built by verifierd.models.trained_model from the standard library's sources;\n"
        "not a useful language model, a realistic fixture.\n\n"
        f"```json\n{body}\n```\n",
        encoding="utf-8",
    )

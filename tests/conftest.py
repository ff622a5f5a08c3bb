"""Session fixtures for the whole test tree.

Tiny models (verifierd.tiny_model) are built once per session into a temporary
folder, one directory per distinct `TinyModelSpec` (seed, dtype, perturbation,
shape), and shared by every test that asks for the same spec.

Trained tiny models (verifierd.models.trained_model) take minutes to build, so
they are cached across sessions in the repository's build/models/ folder (git
ignores it), one directory per recipe digest, and rebuilt only when the recipe
or the code that trains it changes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from verifierd.models.trained_model import trained_model
from verifierd.models.training import TrainingRecipe
from verifierd.tiny_model import TinyModel, TinyModelSpec, build_tiny_model

#: Where trained tiny models are cached between test sessions.
MODEL_CACHE = Path(__file__).resolve().parents[1] / "build" / "models"
#: For a test that asks for a trained model: pytest-timeout counts fixture setup, and
#: training takes two minutes on idle cores but over ten on busy shared ones.
MAY_TRAIN = pytest.mark.timeout(1800)


class TinyModels:
    """Builds each distinct spec once; ``get(spec)`` returns the built model."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._built: dict[TinyModelSpec, TinyModel] = {}

    def get(self, spec: TinyModelSpec | None = None) -> TinyModel:
        spec = spec or TinyModelSpec()
        model = self._built.get(spec)
        if model is None:
            name = f"model{len(self._built)}-seed{spec.seed}-{spec.dtype}"
            model = self._built[spec] = build_tiny_model(self._root / name, spec)
        return model


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    return TinyModels(tmp_path_factory.mktemp("tiny-models"))


@pytest.fixture(scope="session")
def tiny_model(tiny_models: TinyModels) -> TinyModel:
    """The default float32 tiny model, seed 0."""
    return tiny_models.get(TinyModelSpec())


class TrainedModels:
    """``get(spec)`` trains the default recipe at ``spec`` (shape and seed; dtype and
    perturbation are derived from the float32 weights) or takes it from the cache."""

    def __init__(self, cache_root: Path) -> None:
        self._cache_root = cache_root

    def get(self, spec: TinyModelSpec | None = None) -> TinyModel:
        return trained_model(TrainingRecipe(spec=spec or TinyModelSpec()), self._cache_root)


@pytest.fixture(scope="session")
def trained_tiny_models() -> TrainedModels:
    return TrainedModels(MODEL_CACHE)


@pytest.fixture(scope="session")
def trained_tiny_model(trained_tiny_models: TrainedModels) -> TinyModel:
    """The default trained float32 tiny model (``TrainingRecipe()``): the random tiny
    model's shape and tokenizer, trained on the standard library's sources."""
    return trained_tiny_models.get()

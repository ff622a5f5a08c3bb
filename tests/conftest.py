"""Session fixtures for the whole test tree.

Tiny models (verifierd.tiny_model) are built once per session into a temporary
folder, one directory per distinct `TinyModelSpec` (seed, dtype, perturbation,
shape), and shared by every test that asks for the same spec.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from verifierd.tiny_model import TinyModel, TinyModelSpec, build_tiny_model


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

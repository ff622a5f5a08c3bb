from __future__ import annotations

import pytest

from tests.conftest import TinyModels
from tests.verifierd.evidence.vocabulary import Vocabulary, vocabulary
from verifierd.tiny_model import TinyModelSpec


@pytest.fixture(scope="module")
def vocab(tiny_models: TinyModels) -> Vocabulary:
    pytest.importorskip("vllm")
    return vocabulary(str(tiny_models.get(TinyModelSpec()).path))

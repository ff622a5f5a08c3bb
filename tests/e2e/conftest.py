"""The live pipelines the end-to-end tests share, and the order that lets them share.

A test asks for ``random_pipeline`` (the random tiny model, vLLM's default flags),
``trained_pipeline`` (the trained tiny model) or ``tools_pipeline`` (the scripted
tool model with a tool parser and a reasoning parser): one pipeline of each name
serves every test that asks for it (tests/e2e/pipeline_pool.py), seen from the
start of the test. A test that needs a pipeline of its own takes the pool's
``pipelines.get`` with a name nobody else uses, so it too waits for the running one
to stop; a test that starts its own processes outside the pool asks for
``no_live_pipeline``.

Which tests share what, and why:

- ``random_pipeline``: echo, logprobs, other APIs, structured outputs and the
  random half of the real client. Each judges only the requests it sent (named
  by their ``user``), so the others' traffic through either door changes nothing
  it checks; they all run with the default structured-output backend.
- ``trained_pipeline``: the trained half of the real client (another model).
- ``tools_pipeline``: the tool-call tests. Its model is not the random one (it is
  scripted to reason and call a tool), so it cannot serve the others.
- Their own: the seed gateway (it checks the honest prover's share of unseeded
  verdicts since it was first seen, which another test's unseeded request would
  change) and the prover alarm (it needs a cheating prover with no alarm yet, and
  restarts verifierd behind mutual TLS). The demo test runs the demo's own
  processes.

The tests of each shared name run one after the other (the first test of a name
sets where its group runs): otherwise the pool, which runs one pipeline at a
time, would start the same one again after each test of another name.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import TinyModels, TrainedModels
from tests.e2e.pipeline_pool import PipelinePool
from tests.e2e.real_pipeline import LivePipeline
from verifierd.tiny_model import TinyModelSpec
from verifierd.tool_model import build_scripted_model, write_chat_template

#: The fixtures of the shared pipelines: a test of one of them runs in its group.
SHARED = ("random_pipeline", "trained_pipeline", "tools_pipeline")
_HERE = Path(__file__).resolve().parent


def _group(item: pytest.Item) -> str:
    """The shared pipeline ``item`` uses (directly or as a parameter's value), else its
    module: what it runs next to."""
    callspec = getattr(item, "callspec", None)
    chosen = [v for v in callspec.params.values() if isinstance(v, str)] if callspec else []
    for name in SHARED:
        if name in getattr(item, "fixturenames", ()) or name in chosen:
            return name
    return str(item.path)


@pytest.hookimpl(trylast=True)  # after pytest's own reordering by fixture scope
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run this folder's tests grouped by the pipeline they share, groups in the order
    of their first test; the other folders' tests keep their places."""
    slots = [i for i, item in enumerate(items) if _HERE in item.path.parents]
    ours = [items[i] for i in slots]
    first: dict[str, int] = {}
    for index, item in enumerate(ours):
        first.setdefault(_group(item), index)
    ours.sort(key=lambda item: first[_group(item)])
    for slot, item in zip(slots, ours, strict=True):
        items[slot] = item


@pytest.fixture(scope="session")
def pipelines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PipelinePool]:
    pytest.importorskip("vllm")
    pool = PipelinePool(tmp_path_factory.mktemp("pipelines"))
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def no_live_pipeline(pipelines: PipelinePool) -> None:
    """No pool pipeline runs during the test (it starts processes of its own)."""
    pipelines.close()


@pytest.fixture
def random_pipeline(pipelines: PipelinePool, tiny_models: TinyModels) -> LivePipeline:
    return pipelines.get("random", lambda: tiny_models.get().path)


@pytest.fixture
def trained_pipeline(pipelines: PipelinePool, trained_tiny_models: TrainedModels) -> LivePipeline:
    return pipelines.get("trained", lambda: trained_tiny_models.get().path)


@pytest.fixture(scope="session")
def tool_serving(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, ...]:
    """The tool model's vLLM flags: the Hermes-style tools template,
    ``--enable-auto-tool-choice --tool-call-parser hermes`` and
    ``--reasoning-parser deepseek_r1`` (the commitment carries the same)."""
    template = write_chat_template(tmp_path_factory.mktemp("tool-template") / "tools.jinja")
    return (
        *("--chat-template", str(template), "--enable-auto-tool-choice"),
        *("--tool-call-parser", "hermes", "--reasoning-parser", "deepseek_r1"),
    )


@pytest.fixture
def tools_pipeline(
    pipelines: PipelinePool,
    tool_serving: tuple[str, ...],
    tmp_path_factory: pytest.TempPathFactory,
) -> LivePipeline:
    """The scripted tool model (verifierd.tool_model) served with ``tool_serving``."""

    def model_dir() -> Path:
        root = tmp_path_factory.mktemp("tool-model")
        return build_scripted_model(root / "model", TinyModelSpec()).path

    return pipelines.get("tools", model_dir, tool_serving)

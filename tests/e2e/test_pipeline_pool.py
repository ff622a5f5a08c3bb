"""The pool of shared pipelines: one at a time, started again when a process died,
never started again after a failed start. Fake pipelines stand in for live ones."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.e2e.pipeline_pool import PipelinePool
from verifierd.demo.processes import DemoError


@dataclass
class FakeGroup:
    dead: bool = False

    def check_alive(self) -> None:
        if self.dead:
            raise DemoError("prover exited with code 1")


@dataclass
class FakePipeline:
    work: Path
    group: FakeGroup = field(default_factory=FakeGroup)

    def from_now(self) -> FakePipeline:
        return self


class Starts:
    """A fake `live_pipeline` that records each start and stop (by work folder)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.failure: Exception | None = None

    @contextmanager
    def __call__(
        self, work: Path, model_dir: Path, *, serving: Sequence[str]
    ) -> Iterator[FakePipeline]:
        self.events.append(("start", work.name))
        if self.failure is not None:
            raise self.failure
        try:
            yield FakePipeline(work)
        finally:
            self.events.append(("stop", work.name))


def _model(tmp_path: Path) -> Path:
    return tmp_path / "model"


def test_each_name_starts_once_and_one_runs_at_a_time(tmp_path: Path) -> None:
    starts = Starts()
    pool = PipelinePool(tmp_path, starts)
    first = pool.get("random", lambda: _model(tmp_path))
    assert pool.get("random", lambda: _model(tmp_path)) is first
    pool.get("tools", lambda: _model(tmp_path))
    pool.close()
    assert starts.events == [
        ("start", "1-random"),
        ("stop", "1-random"),
        ("start", "2-tools"),
        ("stop", "2-tools"),
    ]


def test_a_pipeline_with_a_dead_process_is_started_again_for_the_next_test(
    tmp_path: Path,
) -> None:
    starts = Starts()
    pool = PipelinePool(tmp_path, starts)
    crashed = pool.get("random", lambda: _model(tmp_path))
    crashed.group.dead = True
    fresh = pool.get("random", lambda: _model(tmp_path))
    assert fresh is not crashed and fresh.work != crashed.work
    assert starts.events == [("start", "1-random"), ("stop", "1-random"), ("start", "2-random")]


def test_a_pipeline_that_failed_to_start_is_not_tried_again(tmp_path: Path) -> None:
    starts = Starts()
    starts.failure = DemoError("timed out after 600 s waiting for the prover")
    pool = PipelinePool(tmp_path, starts)
    with pytest.raises(DemoError, match="waiting for the prover"):
        pool.get("random", lambda: _model(tmp_path))
    with pytest.raises(DemoError, match="failed to start earlier: DemoError: timed out") as later:
        pool.get("random", lambda: _model(tmp_path))
    assert "1-random/logs" in str(later.value)
    assert starts.events == [("start", "1-random")]
    starts.failure = None
    pool.get("tools", lambda: _model(tmp_path))  # another name still starts
    assert starts.events[-1] == ("start", "2-tools")

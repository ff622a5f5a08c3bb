"""Daemons for the console tests: started per test, stopped after it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.tui.daemons import Daemons


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Daemons]:
    """Collector and verifierd with intake between them (entry hashes vary per run)."""
    running = Daemons(tmp_path)
    running.start()
    yield running
    running.close()


@pytest.fixture
def fixed_daemons(tmp_path: Path) -> Iterator[Daemons]:
    """Collector and verifierd whose store holds the records with fixed entry hashes."""
    running = Daemons(tmp_path, intake=False)
    running.start()
    yield running
    running.close()

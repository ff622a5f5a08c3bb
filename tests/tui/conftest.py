"""Daemons for the console tests: started per test, stopped after it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.tui.daemons import Daemons
from tests.tui.hostile_traffic import WITH_HOSTILE


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


@pytest.fixture
def hostile_daemons(tmp_path: Path) -> Iterator[Daemons]:
    """As ``fixed_daemons``, with records from a prover that attacks the operator's terminal."""
    running = Daemons(tmp_path, intake=False, exchanges=WITH_HOSTILE)
    running.start()
    yield running
    running.close()


@pytest.fixture
def prover_daemons(tmp_path: Path) -> Iterator[Daemons]:
    """As ``fixed_daemons``, with prover tables: an honest prover and a dishonest one whose
    alarm is in force."""
    running = Daemons(tmp_path, intake=False, provers=True)
    running.start()
    yield running
    running.close()

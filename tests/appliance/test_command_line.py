"""The daemons' shared command line: --version from the package metadata, and the log level
a daemon's config sets (-v may only add to it)."""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
from collections.abc import Callable, Iterator, Sequence

import pytest

from appliance.command_line import apply_log_level
from collector.cli import main as collector_main
from tui.app import main as tui_main
from verifierd.cli import main as verifierd_main

MAINS: dict[str, Callable[[Sequence[str] | None], int]] = {
    "collector": collector_main,
    "verifierd": verifierd_main,
    "veritap-tui": tui_main,
}


@pytest.mark.parametrize("program", sorted(MAINS))
def test_every_cli_prints_the_package_version(
    program: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        MAINS[program](["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"{program} {importlib.metadata.version('veritap')}\n"


def test_every_console_script_is_covered() -> None:
    scripts = importlib.metadata.distribution("veritap").entry_points.select(
        group="console_scripts"
    )
    assert {script.name for script in scripts} == set(MAINS)


@pytest.fixture
def root_level() -> Iterator[logging.Logger]:
    root = logging.getLogger()
    saved = root.level
    yield root
    root.setLevel(saved)


@pytest.mark.parametrize(
    ("verbose", "start", "configured", "expected"),
    [
        (0, logging.WARNING, logging.INFO, logging.INFO),
        (0, logging.WARNING, logging.ERROR, logging.ERROR),
        (2, logging.DEBUG, logging.INFO, logging.DEBUG),
        (1, logging.INFO, logging.DEBUG, logging.DEBUG),
    ],
)
def test_the_configured_level_applies_unless_v_asks_for_more(
    root_level: logging.Logger, verbose: int, start: int, configured: int, expected: int
) -> None:
    root_level.setLevel(start)
    apply_log_level(argparse.Namespace(verbose=verbose), configured)
    assert root_level.level == expected

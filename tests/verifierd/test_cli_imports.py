"""`verifierd --help` (or a missing or unknown command) loads every command module to build
its parser: none of them may pull in torch or vLLM, which take seconds to import and only
the engine-side commands (run, calibrate, commit) need once they actually run."""

from __future__ import annotations

import subprocess
import sys

import pytest

_PROBE = """
import sys
import verifierd.cli
verifierd.cli.build_parser()
print(" ".join(sorted(m for m in ("torch", "vllm", "transformers") if m in sys.modules)))
"""


@pytest.mark.timeout(120)
def test_building_the_parser_imports_no_torch() -> None:
    probe = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True
    )
    assert probe.stdout.strip() == ""


def test_every_subcommand_is_still_there() -> None:
    from verifierd.cli import build_parser

    parser = build_parser()
    actions = [a for a in parser._actions if a.dest == "command"]
    choices = set(actions[0].choices) if actions and actions[0].choices else set()
    assert {"run", "calibrate", "commit", "verdicts", "intake", "vca"} <= choices

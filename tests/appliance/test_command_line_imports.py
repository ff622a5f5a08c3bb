"""A daemon's command line imports only the module of the command it runs, and answers
every other command line (help, no command, an unknown one) as the parser of every
command does."""

from __future__ import annotations

import argparse
import json
import re
import struct
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from appliance.command_line import command_modules
from collector import cli as collector_cli
from collector import commands as collector_commands
from verifierd import cli as verifierd_cli
from verifierd import commands as verifierd_commands

CONFIGS = Path(__file__).parents[2] / "appliance" / "config"

Builder = Callable[[Sequence[str] | None], argparse.ArgumentParser]
BUILDERS: dict[str, Builder] = {
    "collector": collector_cli.build_parser,
    "verifierd": verifierd_cli.build_parser,
}
COMMANDS = {
    "collector": sorted(command_modules(collector_commands)),
    "verifierd": sorted(command_modules(verifierd_commands)),
}

#: Runs a CLI's main in a fresh interpreter; writes its exit code and the command modules
#: it imported as JSON to the file named first.
_PROBE = """
import json, sys, importlib
out, program, *argv = sys.argv[1:]
try:
    code = importlib.import_module(program + ".cli").main(argv)
except SystemExit as exc:
    code = exc.code
loaded = sorted(m.rsplit(".", 1)[1] for m in sys.modules if m.startswith(program + ".commands."))
with open(out, "w") as f:
    json.dump({"code": code, "commands": loaded}, f)
"""


def probe(tmp_path: Path, program: str, *argv: str) -> tuple[int, list[str]]:
    out = tmp_path / "probe.json"
    subprocess.run(
        [sys.executable, "-c", _PROBE, str(out), program, *argv],
        capture_output=True,
        check=True,
        timeout=120,
    )
    result = json.loads(out.read_text())
    return result["code"], result["commands"]


def empty_pcap(path: Path) -> Path:
    """A pcap file with its header and no packet (Ethernet, snaplen 65535)."""
    path.write_bytes(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
    return path


@pytest.mark.timeout(120)
def test_replay_runs_with_only_its_own_command_module(tmp_path: Path) -> None:
    pcap = empty_pcap(tmp_path / "empty.pcap")
    code, loaded = probe(
        tmp_path, "collector", "replay", str(pcap), "--log", str(tmp_path / "log"), "--no-progress"
    )
    assert code == 0
    assert loaded == ["replay"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("program", sorted(BUILDERS))
def test_check_config_runs_with_only_its_own_command_module(tmp_path: Path, program: str) -> None:
    config = CONFIGS / f"{program}.toml"
    code, loaded = probe(tmp_path, program, "-v", "check-config", "--config", str(config))
    assert code == 0
    assert loaded == ["check_config"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("program", sorted(BUILDERS))
def test_version_imports_no_command_module(tmp_path: Path, program: str) -> None:
    assert probe(tmp_path, program, "--version") == (0, [])


def answer(
    parser: argparse.ArgumentParser, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> tuple[object, str, str]:
    """The exit code, stdout and stderr of parsing ``argv`` (argparse exits on help and
    errors); a parsed command line gives the command's name instead of a code."""
    try:
        code: object = parser.parse_args(argv).command
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def command_lines(program: str) -> list[list[str]]:
    """Help, no command, unknown ones and options before a command, as argparse reads
    them; and each command's own help and usage error."""
    lines = [
        [],
        ["-h"],
        ["--help"],
        ["--he"],
        ["-vh"],
        ["-h", "check-config"],
        ["-vh", "check-config"],
        ["--he", "check-config"],
        ["-v"],
        ["bogus"],
        ["check_config"],
        ["--", "check-config"],
        ["--verb", "check-config", "-h"],
        ["--unknown", "check-config", "--config", "x.toml"],
        ["-vv", "check-config", "--config", "x.toml", "--version"],
    ]
    for command in COMMANDS[program]:
        lines += [[command, "--help"], ["-v", command, "--no-such-option"]]
    return lines


@pytest.mark.parametrize("program", sorted(BUILDERS))
def test_every_command_line_is_answered_as_by_the_parser_of_every_command(
    program: str, capsys: pytest.CaptureFixture[str]
) -> None:
    build = BUILDERS[program]
    for argv in command_lines(program):
        assert answer(build(argv), argv, capsys) == answer(build(None), argv, capsys), argv


@pytest.mark.parametrize("program", sorted(BUILDERS))
def test_help_lists_every_command(program: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = answer(BUILDERS[program](["--help"]), ["--help"], capsys)
    assert code == 0
    listed = {m[1] for m in re.finditer(r"^    (\S+)", out, re.MULTILINE)}
    assert listed == set(COMMANDS[program])


@pytest.mark.parametrize("program", sorted(BUILDERS))
def test_an_unknown_command_gets_argparses_error_naming_every_command(
    program: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = answer(BUILDERS[program](["bogus"]), ["bogus"], capsys)
    assert code == 2
    choices = ", ".join(f"'{c}'" for c in COMMANDS[program])
    assert f"argument COMMAND: invalid choice: 'bogus' (choose from {choices})" in err

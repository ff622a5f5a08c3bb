"""`collector keygen` and `collector log info`."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from veritap.signing import Signer, Verifier

from collector.cli import main
from tests.collector.log.log_fixtures import ORIGIN, make_record, open_log


def test_keygen_writes_a_private_key_and_its_verifier_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "collector.key"
    assert main(["keygen", "--name", ORIGIN, "--out", str(out)]) == 0
    printed = capsys.readouterr().out.strip()
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    signer = Signer.load(out)
    verifier = Verifier.load(tmp_path / "collector.key.pub")
    assert verifier.key_string() == printed == signer.verifier().key_string()
    assert signer.name == ORIGIN
    assert main(["keygen", "--name", ORIGIN, "--out", str(out)]) == 1
    assert "exists" in capsys.readouterr().err
    assert main(["keygen", "--name", "bad name", "--out", str(tmp_path / "k2")]) == 2


def test_log_info(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    signer = Signer.generate(ORIGIN)
    with open_log(tmp_path / "log", signer) as log:
        log.append_many([make_record(i) for i in range(1, 4)])
    assert main(["log", "info", str(tmp_path / "log")]) == 0
    out = capsys.readouterr().out
    assert f"origin          {ORIGIN}" in out
    assert "head            seq 3 " in out
    assert f"key id          {signer.key_id.hex()}" in out
    assert "checkpoints     1 (latest tree size 3)" in out
    assert main(["log", "info", str(tmp_path / "missing")]) == 1
    assert main(["log", "export", str(tmp_path / "missing")]) == 1

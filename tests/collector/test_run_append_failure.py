"""`collector run` and a failing log: retry with back-pressure, then a loud non-zero exit.

The capture source is replaced by a fake that plays a generated conversation
(AF_PACKET needs root and a live interface; the loop and everything behind it
are the real ones), and the log's group commit is made to fail mid-work.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import signal
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from veritap.signing import Signer
from veritap.v1 import record_pb2

from collector.capture.linktypes import DLT_RAW
from collector.capture.live import KernelStats
from collector.cli import main
from collector.commands import run as run_command
from collector.log import Log, LogWriteError
from collector.log.append_retry import RetryingAppend
from tests.openai_traffic import Call, words
from tests.pcapgen import LINK_RAW, Conversation, frame

EXCHANGES = 12


class FakeCapture:
    """Plays frames a few at a time, then stops the collector with SIGTERM."""

    linktype = DLT_RAW

    def __init__(self, frames: list[bytes]) -> None:
        self._frames = frames
        self._ts = 1_700_000_000_000_000_000

    def read(self, timeout_s: float) -> list[tuple[int, bytes, tuple[int, ...]]]:
        if not self._frames:
            signal.raise_signal(signal.SIGTERM)
            return []
        taken, self._frames = self._frames[:8], self._frames[8:]
        self._ts += len(taken) * 1_000_000
        return [(self._ts + i * 1_000_000, data, ()) for i, data in enumerate(taken)]

    def stats(self) -> KernelStats:
        return KernelStats(packets=0, drops=0, freeze_count=0)

    def close(self) -> None:
        self._frames = []


def traffic() -> list[bytes]:
    conv = Conversation().handshake()
    for i in range(EXCHANGES):
        c = Call("/v1/completions", f"m{i}", "hi", {"seed": i}, [words(3)], response_id=f"c{i}")
        conv.exchange(c.request(), c.response())
    conv.close()
    return [frame(conv, p, link=LINK_RAW) for p in conv.packets]


@pytest.fixture
def signals() -> Iterator[None]:
    """`run` installs SIGTERM/SIGINT handlers: put the test process's own back afterwards."""
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> argparse.Namespace:
    key = tmp_path / "collector.key"
    Signer.generate("test.local/c").save(key)
    config = tmp_path / "collector.toml"
    config.write_text(
        '[collector]\norigin = "test.local/c"\n'
        '[capture]\ninterface = "lo"\nchecksums = "ignore"\n'
        f'[log]\npath = "{tmp_path / "log"}"\nkey = "{key}"\nbatch_records = 4\n'
        'batch_delay_s = 0.0\n[ledger]\nlisten = "127.0.0.1:0"\n[metrics]\nlisten = ""\n'
    )
    monkeypatch.setattr(run_command, "_open_capture", lambda _config: FakeCapture(traffic()))
    monkeypatch.setattr(
        run_command, "RetryingAppend", functools.partial(RetryingAppend, sleep=lambda _s: None)
    )
    return argparse.Namespace(config=config, interface=None, log=None, key=None, verbose=0)


def failing_after(monkeypatch: pytest.MonkeyPatch, good: int, bad: int | None) -> list[int]:
    """Make the log's append fail after `good` calls, `bad` times (None: for ever)."""
    calls = [0]
    real = Log.append_many

    def append_many(self: Log, records: Sequence[record_pb2.InferenceRecord]) -> list[int]:
        calls[0] += 1
        if calls[0] > good and (bad is None or calls[0] <= good + bad):
            raise LogWriteError("No space left on device")
        return real(self, records)

    monkeypatch.setattr(Log, "append_many", append_many)
    return calls


def stored(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """The models of the records in the log, in log order."""
    assert main(["log", "export", str(tmp_path / "log"), "--format", "jsonl"]) == 0
    return [json.loads(line)["model"] for line in capsys.readouterr().out.splitlines()]


@pytest.mark.usefixtures("signals")
def test_a_passing_append_failure_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = setup(tmp_path, monkeypatch)
    calls = failing_after(monkeypatch, good=1, bad=3)
    assert run_command.run(args) == 0
    assert "cannot be appended" not in capsys.readouterr().err
    assert calls[0] > 4
    monkeypatch.undo()
    assert stored(tmp_path, capsys) == [f"m{i}" for i in range(EXCHANGES)]


@pytest.mark.usefixtures("signals")
def test_an_append_that_keeps_failing_stops_capture_loudly(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    args = setup(tmp_path, monkeypatch)
    failing_after(monkeypatch, good=1, bad=None)
    with caplog.at_level(logging.WARNING):
        assert run_command.run(args) == 1
    err = capsys.readouterr().err
    assert "capture stopped: the log cannot be appended" in err
    assert "failed 6 times" in err
    assert any("log append failed; retrying" in r.getMessage() for r in caplog.records)
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("capture stopped" in message for message in errors)
    monkeypatch.undo()
    assert 0 < len(stored(tmp_path, capsys)) < EXCHANGES

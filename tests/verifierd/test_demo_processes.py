"""The demo's process group: no child outlives the demo, even when it is sent SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from verifierd.demo.processes import DemoError, ProcessGroup

HOLDER = """
import sys, time
from pathlib import Path
from verifierd.demo.processes import ProcessGroup
with ProcessGroup(Path(sys.argv[1])) as group:
    child = group.start("sleeper", [sys.executable, "-c", "import time; time.sleep(120)"])
    print(child.process.pid, flush=True)
    time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); its state in /proc says it is gone.
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_sigterm_to_the_demo_stops_its_children(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([".", "protos"])},
    )
    assert holder.stdout is not None
    child_pid = int(holder.stdout.readline())
    assert _alive(child_pid)

    holder.send_signal(signal.SIGTERM)
    assert holder.wait(timeout=60) == 128 + signal.SIGTERM

    deadline = time.monotonic() + 30
    while _alive(child_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child_pid)


def test_a_dead_child_fails_the_wait_with_its_log(tmp_path: Path) -> None:
    with ProcessGroup(tmp_path) as group:
        group.start("crasher", [sys.executable, "-c", "print('boom'); raise SystemExit(3)"])
        with pytest.raises(DemoError, match=r"crasher exited with code 3(.|\n)*boom"):
            group.wait_until("never", lambda: False, timeout_s=30)

"""Child processes of the demo: started with their logs in files, always cleaned up.

Each child runs in its own session, so stopping it stops everything it
started too (vLLM's engine core, for one). Leaving the ``with`` block stops
every child, first politely (SIGTERM), then for sure (SIGKILL). A SIGTERM to
the demo itself (or to the test runner around it) leaves the block too: inside
it SIGTERM raises SystemExit, so no child outlives the demo.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

log = logging.getLogger(__name__)


SignalHandler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


class DemoError(RuntimeError):
    """A step of the demo failed; the message says which and where its log is."""


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class ProcessGroup:
    """The set of children the demo started; a context manager that stops them all."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.children: list[Child] = []
        self._previous_sigterm: SignalHandler = None
        log_dir.mkdir(parents=True, exist_ok=True)

    def __enter__(self) -> ProcessGroup:
        if threading.current_thread() is threading.main_thread():
            self._previous_sigterm = signal.signal(signal.SIGTERM, _exit_on_sigterm)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop_all()
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._previous_sigterm)

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> Child:
        log_path = self.log_dir / f"{name}.log"
        merged = {**os.environ, **(env or {})}
        with log_path.open("wb") as sink:
            process = subprocess.Popen(
                list(argv),
                stdout=sink,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=merged,
                cwd=cwd,
                start_new_session=True,
            )
        child = Child(name=name, process=process, log_path=log_path)
        self.children.append(child)
        log.info("started %s (pid %d)", name, process.pid, extra={"child": name})
        return child

    def check_alive(self) -> None:
        """Raise if any child has exited: the demo cannot go on without it."""
        for child in self.children:
            code = child.process.poll()
            if code is not None:
                raise DemoError(
                    f"{child.name} exited with code {code}; last lines of {child.log_path}:\n"
                    f"{child.tail()}"
                )

    def wait_until(self, what: str, ready: Callable[[], bool], timeout_s: float) -> None:
        """Poll `ready` until it is true, failing fast when a child dies."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            if ready():
                return
            time.sleep(0.5)
        raise DemoError(f"timed out after {timeout_s:.0f} s waiting for {what}")

    def stop(self, child: Child, grace_s: float = 15.0) -> None:
        if child.process.poll() is None:
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(child.process.pid, signal.SIGTERM)
            try:
                child.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError, PermissionError):
                    os.killpg(child.process.pid, signal.SIGKILL)
                child.process.wait()
        # The session may hold grandchildren that outlived their parent.
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(child.process.pid, signal.SIGKILL)

    def stop_all(self) -> None:
        for child in reversed(self.children):
            self.stop(child)
        self.children.clear()


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def port_open(host: str, port: int) -> bool:
    """True when something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (the demo picks its ports at start)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port

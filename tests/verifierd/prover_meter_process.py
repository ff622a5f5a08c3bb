"""Run `verifierd prover-meter` as its own process, for tests.

It is started through its command module alone (not the whole `verifierd` CLI, whose other
commands import engines), exactly as the CLI would run it: parse, then `func(args)`.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

LAUNCH = """
import argparse, sys
from verifierd.commands import prover_meter
parser = argparse.ArgumentParser(prog="verifierd")
prover_meter.register(parser.add_subparsers())
args = parser.parse_args(sys.argv[1:])
sys.exit(args.func(args))
"""


@contextmanager
def prover_meter(args: Sequence[str]) -> Iterator[str]:
    """Start `verifierd prover-meter ARGS --listen 127.0.0.1:0`; yields its base URL."""
    proc = subprocess.Popen(
        [sys.executable, "-c", LAUNCH, "prover-meter", *args, "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.match(r"prover-meter: serving (http://\S+) \((\S+): ", line)
        assert match, f"unexpected first line {line!r}"
        yield match.group(1)
    finally:
        proc.terminate()
        proc.wait(timeout=30)

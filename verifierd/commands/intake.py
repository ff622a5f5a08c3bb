"""`verifierd intake --config F`: run only the intake (collectors -> verified store entries).

`verifierd run` starts the intake together with the scheduler and the gRPC service; this
command runs it alone, for operations (catching up a store) and for the crash tests.
SIGTERM or SIGINT stops it; an alert on every collector ends it with exit code 3.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

from veritap.signing import SigningError

from verifierd.config import Config, load_config
from verifierd.errors import VerifierdError
from verifierd.intake import Intake
from verifierd.store import Store


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "intake", help="subscribe to the configured collectors and store their entries"
    )
    parser.add_argument("--config", type=Path, help="verifierd TOML file")
    parser.set_defaults(func=run)


async def run_intake(config: Config) -> int:
    store = Store.open(config.store_dir, map_size=int(config.store.map_size_gib * (1 << 30)))
    try:
        intake = Intake(store, config)
        await intake.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        waiter = asyncio.create_task(stop.wait())
        links = asyncio.create_task(intake.wait())
        await asyncio.wait({waiter, links}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        await intake.stop()
        alerted = all(link.alert_reason for link in intake.links)
        return 3 if alerted and intake.links else 0
    finally:
        store.close()


def run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
        return asyncio.run(run_intake(config))
    except (VerifierdError, SigningError, OSError, ValueError) as exc:
        sys.stderr.write(f"verifierd intake: {exc}\n")
        return 2

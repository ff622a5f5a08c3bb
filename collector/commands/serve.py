"""`collector serve --config collector.toml`: serve an existing log over gRPC.

The LedgerService (with the gRPC health service and server reflection) serves the log of
`[log] path` and `[collector] origin`, as `[ledger]` says; `--log`, `--origin` and
`--listen` override those settings. The log is opened read-only, so this can run beside
the process that appends to it (`collector run` serves its own log in-process instead,
through `start_ledger_service`). New entries are found by polling every `ledger.poll_s`.
SIGTERM or SIGINT stops the server gracefully. Prints one line, `ledger listening on
HOST:PORT`, once the port is bound (useful with port 0).

Prometheus metrics are served at `[metrics] listen` ("" = not served; a taken port is logged,
not fatal): the subscribers and their streams, and the log's head and newest checkpoint as
read every second.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from veritap.config_schema import ConfigError
from veritap.tls import TlsConfigError, require_tls_off_loopback, split_host_port

from appliance.command_line import EXIT_CONFIG
from collector.config import load_config
from collector.ledger.config import LedgerConfig
from collector.ledger.errors import LedgerError
from collector.log import Log, LogError

logger = logging.getLogger(__name__)
METRICS_POLL_S = 1.0


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "serve", help="serve an existing log to verifiers over gRPC"
    )
    parser.add_argument("--config", type=Path, help="collector TOML file")
    parser.add_argument("--log", type=Path, help="the log directory, overriding log.path")
    parser.add_argument("--origin", help="the log's origin, overriding collector.origin")
    parser.add_argument("--listen", help="host:port, overriding ledger.listen")
    parser.set_defaults(func=run)


def _ledger_config(config: LedgerConfig, listen: str | None) -> LedgerConfig:
    if not listen:
        return config
    split_host_port(listen)
    require_tls_off_loopback(listen, config.tls)
    return replace(config, listen=listen)


async def _watch_log(log: Log) -> None:
    """The log's head and newest checkpoint into METRICS, every METRICS_POLL_S."""
    import asyncio

    from collector.metrics import METRICS

    while True:
        try:
            stats = await asyncio.to_thread(log.stats)
        except LogError as exc:
            logger.warning("cannot read the log's head for metrics", extra={"reason": str(exc)})
        else:
            METRICS.log_read(stats.head_seq, stats.last_checkpoint_size)
        await asyncio.sleep(METRICS_POLL_S)


async def serve(log_dir: Path, origin: str, config: LedgerConfig, metrics_listen: str = "") -> None:
    # asyncio, gRPC and prometheus_client are imported by the command that serves: every
    # `collector` command is parsed with this module loaded, and `replay` needs none of them.
    import asyncio

    from collector.ledger.server import start_ledger_service
    from collector.metrics import METRICS

    log = Log.open(log_dir, origin=origin, readonly=True)
    metrics_server = METRICS.serve_configured(metrics_listen)
    watcher = asyncio.create_task(_watch_log(log))
    try:
        server = await start_ledger_service(log, config, log_dir=log_dir)
        host, _ = split_host_port(config.listen)
        shown = f"[{host}]" if ":" in host else host
        sys.stdout.write(f"ledger listening on {shown}:{server.port}\n")
        sys.stdout.flush()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
        await server.stop()
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        if metrics_server is not None:
            await asyncio.to_thread(metrics_server.close)
        log.close()


def run(args: argparse.Namespace) -> int:
    """Serve the log; a configuration it refuses (the file, the TLS material) exits EXIT_CONFIG."""
    import asyncio

    try:
        config = load_config(args.config)
        ledger = _ledger_config(config.ledger, args.listen)
        log_dir, origin = args.log or config.log.path, args.origin or config.origin
        asyncio.run(serve(log_dir, origin, ledger, config.metrics.listen))
    except (ConfigError, TlsConfigError) as exc:
        sys.stderr.write(f"collector serve: {exc}\n")
        return EXIT_CONFIG
    except (LedgerError, LogError) as exc:
        sys.stderr.write(f"collector serve: {exc}\n")
        return 2
    return 0

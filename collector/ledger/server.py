"""Start and stop the collector's gRPC server: LedgerService, health and reflection.

`start_ledger_service` is what a daemon with an asyncio loop (`collector serve`) calls in
that loop:

    server = await start_ledger_service(log, config.ledger, log_dir=..., stats_provider=...)
    ...
    await server.stop()

`LedgerServiceThread` does the same on a loop in its own thread, for a threaded daemon
such as `collector run`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from veritap.tls import (
    MAX_STREAM_MESSAGE_BYTES,
    TlsConfigError,
    require_tls_off_loopback,
    server_credentials,
)
from veritap.v1 import ledger_pb2, ledger_pb2_grpc

from collector.ledger.config import LedgerConfig
from collector.ledger.errors import LedgerError
from collector.ledger.retention import AckBook
from collector.ledger.service import LedgerServicer, StatsProvider
from collector.ledger.wire import serialize_response
from collector.log import Log
from collector.metrics import METRICS, CollectorMetrics

logger = logging.getLogger(__name__)

LEDGER_SERVICE_NAME = ledger_pb2.DESCRIPTOR.services_by_name["LedgerService"].full_name


class _HandlerRecorder:
    """Stands in for a server to take the handlers the generated code registers."""

    def __init__(self) -> None:
        self.handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}

    def add_generic_rpc_handlers(self, handlers: object) -> None:
        """The same handlers also come through add_registered_method_handlers."""

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler[Any, Any]]
    ) -> None:
        self.handlers = dict(handlers)


def _add_ledger_service(servicer: LedgerServicer, server: grpc.aio.Server) -> None:
    """The generated LedgerService handlers, but Subscribe's serializer lets the batches
    the subscription pre-serialized (`collector.ledger.wire`) through as they are."""
    recorder = _HandlerRecorder()
    ledger_pb2_grpc.add_LedgerServiceServicer_to_server(servicer, recorder)  # type: ignore[arg-type]
    handlers = recorder.handlers
    handlers["Subscribe"] = grpc.stream_stream_rpc_method_handler(
        servicer.Subscribe,
        request_deserializer=ledger_pb2.SubscribeRequest.FromString,
        response_serializer=serialize_response,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(LEDGER_SERVICE_NAME, handlers),)
    )


class LedgerServer:
    """A running gRPC server; `port` is the bound port (useful when listening on port 0)."""

    def __init__(
        self,
        server: grpc.aio.Server,
        port: int,
        servicer: LedgerServicer,
        health_servicer: Any,
        book: AckBook,
    ) -> None:
        self.server = server
        self.port = port
        self.servicer = servicer
        self._health = health_servicer
        self.book = book

    async def stop(self, grace_s: float | None = 1.0) -> None:
        """Report NOT_SERVING, let streams end within `grace_s`, then write the ack book."""
        await self._health.enter_graceful_shutdown()
        self.servicer.close_streams()
        await self.server.stop(grace_s)
        self.book.flush()

    async def wait_for_termination(self) -> None:
        await self.server.wait_for_termination()


async def start_ledger_service(
    log: Log,
    config: LedgerConfig,
    *,
    log_dir: Path,
    stats_provider: StatsProvider | None = None,
    metrics: CollectorMetrics = METRICS,
) -> LedgerServer:
    """Serve `log` on `config.listen` in the running loop; returns once the port is bound.

    `log_dir` locates the acknowledgement book when `config.acks_file` is not set.
    `stats_provider` fills GetStatus's capture statistics (the capture daemon passes one).
    Subscribers, streamed entries and their lag are counted in `metrics`.
    """
    try:
        require_tls_off_loopback(config.listen, config.tls)
    except TlsConfigError as exc:
        raise LedgerError(str(exc)) from exc
    book = AckBook.load(config.acks_path(log_dir))
    loop = asyncio.get_running_loop()
    servicer = LedgerServicer(
        log, config, book, stats_provider=stats_provider, loop=loop, metrics=metrics
    )
    server = grpc.aio.server(
        options=[
            ("grpc.max_send_message_length", MAX_STREAM_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", 1 << 20),
            ("grpc.keepalive_time_ms", 20_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
            ("grpc.keepalive_permit_without_calls", 1),
            # A second collector on the same port must fail, not share the connections.
            ("grpc.so_reuseport", 0),
        ]
    )
    _add_ledger_service(servicer, server)
    # grpc_health's stubs lack its asyncio servicer.
    health_servicer = health.aio.HealthServicer()  # type: ignore[attr-defined]
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (LEDGER_SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    try:
        if config.tls is None:
            port = server.add_insecure_port(config.listen)
        else:
            port = server.add_secure_port(config.listen, server_credentials(config.tls))
    except RuntimeError as exc:
        raise LedgerError(f"cannot listen on {config.listen!r}: {exc}") from exc
    if port == 0:
        raise LedgerError(f"cannot listen on {config.listen!r}")
    await server.start()
    if not log.readonly:  # a read-only log is polled every config.poll_s instead
        log.add_commit_listener(servicer.notify_commit)
    await health_servicer.set(LEDGER_SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
    logger.info(
        "ledger service listening",
        extra={"listen": config.listen, "port": port, "tls": config.tls is not None},
    )
    return LedgerServer(server, port, servicer, health_servicer, book)


class LedgerServiceThread:
    """The LedgerService on an asyncio loop of its own, in a thread: for a daemon without a loop.

    service = LedgerServiceThread(log, config.ledger, log_dir=config.log.path)
    port = service.start()       # returns once listening; raises LedgerError if it cannot
    ...
    service.stop()
    """

    def __init__(
        self,
        log: Log,
        config: LedgerConfig,
        *,
        log_dir: Path,
        stats_provider: StatsProvider | None = None,
    ) -> None:
        self._log = log
        self._config = config
        self._log_dir = log_dir
        self._stats_provider = stats_provider
        self._thread = threading.Thread(target=self._run, name="ledger-service", daemon=True)
        self._started = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self.port = 0

    def start(self, timeout_s: float = 30.0) -> int:
        self._thread.start()
        if not self._started.wait(timeout_s):
            raise LedgerError("the ledger service did not start in time")
        if self._error is not None:
            raise LedgerError(f"the ledger service did not start: {self._error}") from self._error
        return self.port

    def stop(self, grace_s: float = 1.0) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(grace_s + 10.0)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported to start(), or logged once running
            if not self._started.is_set():
                self._error = exc
                self._started.set()
            else:
                logger.exception("the ledger service failed")

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await start_ledger_service(
            self._log, self._config, log_dir=self._log_dir, stats_provider=self._stats_provider
        )
        self.port = server.port
        self._started.set()
        await self._stop.wait()
        await server.stop()

"""The LedgerService servicer: Subscribe plus the unary queries over the collector's log."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from veritap.envelope import entry_hash
from veritap.v1 import ledger_pb2, ledger_pb2_grpc, log_pb2

from collector.ledger.config import LedgerConfig
from collector.ledger.retention import AckBook
from collector.ledger.subscription import SubscribeRefusedError, Subscription, check_start
from collector.log import Log, LogError
from collector.metrics import CollectorMetrics

logger = logging.getLogger(__name__)

StatsProvider = Callable[[], ledger_pb2.CaptureStats]

_Context = grpc.aio.ServicerContext[Any, Any]


def certificate_names(context: _Context) -> set[str]:
    """The client certificate's common name and subject alternative names (mutual TLS)."""
    auth = context.auth_context()
    found = [*auth.get("x509_common_name", ()), *auth.get("x509_subject_alternative_name", ())]
    return {name.decode(errors="replace") for name in found}


class LedgerServicer(ledger_pb2_grpc.LedgerServiceServicer):
    """Serves one log from the asyncio loop; `notify_commit` may be called from any thread."""

    def __init__(
        self,
        log: Log,
        config: LedgerConfig,
        book: AckBook,
        *,
        stats_provider: StatsProvider | None,
        loop: asyncio.AbstractEventLoop,
        metrics: CollectorMetrics,
    ) -> None:
        self._log = log
        self._metrics = metrics
        self._config = config
        self._book = book
        self._stats_provider = stats_provider
        self._loop = loop
        self._subscriptions: set[Subscription] = set()
        self._started_at_ns = time.time_ns()

    def notify_commit(self, head_seq: int) -> None:
        """Commit listener: called from the log's writer thread after each durable commit."""
        try:
            self._loop.call_soon_threadsafe(self._wake_all)
        except RuntimeError:  # the loop is closed: the service has stopped
            return

    def close_streams(self) -> None:
        """Let every Subscribe stream end cleanly (before the server stops)."""
        for subscription in self._subscriptions:
            subscription.close()

    def _wake_all(self) -> None:
        for subscription in self._subscriptions:
            subscription.wake()

    async def Subscribe(  # type: ignore[override]  # noqa: N802 (the gRPC method name)
        self,
        request_iterator: AsyncIterator[ledger_pb2.SubscribeRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[ledger_pb2.SubscribeResponse | bytes]:
        """Entry batches are yielded pre-serialized; see `server._add_ledger_service`."""
        requests = aiter(request_iterator)
        try:
            first = await anext(requests)
        except StopAsyncIteration:
            return
        if first.WhichOneof("kind") != "start":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message must be Start")
        start = first.start
        try:
            check_start(self._log, start)
        except SubscribeRefusedError as exc:
            logger.warning(
                "subscription refused",
                extra={
                    "verifier_id": start.verifier_id,
                    "from_seq": start.from_seq,
                    "why": str(exc),
                },
            )
            await context.abort(exc.code, str(exc))
        except LogError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"log error: {exc}")
        tls = self._config.tls
        if tls is not None and tls.client_ca is not None and start.verifier_id:
            names = certificate_names(context)
            if start.verifier_id not in names:
                await context.abort(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"verifier_id {start.verifier_id!r} is not a name in the client certificate "
                    f"({', '.join(sorted(names)) or 'none'})",
                )
        subscription = Subscription(
            self._log, self._config, self._book, start, requests=requests, metrics=self._metrics
        )
        self._subscriptions.add(subscription)
        self._metrics.subscribers.inc()
        logger.info(
            "subscription started",
            extra={"verifier_id": start.verifier_id, "from_seq": start.from_seq},
        )
        try:
            async for response in subscription.responses():
                yield response
        finally:
            self._subscriptions.discard(subscription)
            self._metrics.subscribers.dec()
            logger.info(
                "subscription ended",
                extra={"verifier_id": start.verifier_id, "acked": subscription.state().acked_seq},
            )
        if subscription.failure is not None:
            await context.abort(subscription.failure.code, str(subscription.failure))

    async def GetHead(  # noqa: N802
        self, request: ledger_pb2.GetHeadRequest, context: _Context
    ) -> ledger_pb2.GetHeadResponse:
        head = self._log.head()
        return ledger_pb2.GetHeadResponse(
            origin=self._log.origin,
            head_seq=head.seq,
            head_hash=head.hash,
            retention_floor=self._log.retention_floor,
        )

    async def _checkpoint(self, tree_size: int, context: _Context) -> log_pb2.Checkpoint:
        checkpoint = (
            self._log.latest_checkpoint() if tree_size == 0 else self._log.checkpoint_at(tree_size)
        )
        if checkpoint is None:
            what = "no checkpoint yet" if tree_size == 0 else f"no checkpoint of size {tree_size}"
            await context.abort(grpc.StatusCode.NOT_FOUND, what)
        assert checkpoint is not None
        return checkpoint

    async def GetCheckpoint(  # noqa: N802
        self, request: ledger_pb2.GetCheckpointRequest, context: _Context
    ) -> ledger_pb2.GetCheckpointResponse:
        return ledger_pb2.GetCheckpointResponse(
            checkpoint=await self._checkpoint(request.tree_size, context)
        )

    async def GetInclusionProof(  # noqa: N802
        self, request: ledger_pb2.GetInclusionProofRequest, context: _Context
    ) -> ledger_pb2.GetInclusionProofResponse:
        checkpoint = await self._checkpoint(request.tree_size, context)
        if not 1 <= request.seq <= checkpoint.tree_size:
            await context.abort(
                grpc.StatusCode.OUT_OF_RANGE,
                f"seq {request.seq} is not in the tree of size {checkpoint.tree_size}",
            )
        try:
            leaf = entry_hash(self._log.entry(request.seq))
            path = self._log.inclusion_proof(request.seq, checkpoint.tree_size)
        except LogError as exc:
            await context.abort(grpc.StatusCode.OUT_OF_RANGE, str(exc))
        return ledger_pb2.GetInclusionProofResponse(
            seq=request.seq,
            tree_size=checkpoint.tree_size,
            leaf_hash=leaf,
            path=path,
            checkpoint=checkpoint,
        )

    async def GetStatus(  # noqa: N802
        self, request: ledger_pb2.GetStatusRequest, context: _Context
    ) -> ledger_pb2.GetStatusResponse:
        stats = self._log.stats()
        response = ledger_pb2.GetStatusResponse(
            origin=self._log.origin,
            head_seq=stats.head_seq,
            retention_floor=stats.retention_floor,
            checkpoints=stats.checkpoints,
            started_at_ns=self._started_at_ns,
        )
        if self._stats_provider is not None:
            response.capture.CopyFrom(self._stats_provider())
        connected = {s.verifier_id: s.state() for s in self._subscriptions}
        known = {ack.verifier_id: ack.acked_seq for ack in self._book.entries()}
        for verifier_id in sorted(set(self._config.verifiers) | set(known) | set(connected)):
            live = connected.get(verifier_id)
            acked = max(known.get(verifier_id, 0), live.acked_seq if live else 0)
            response.subscribers.add(
                verifier_id=verifier_id, acked_seq=acked, connected=live is not None
            )
        return response

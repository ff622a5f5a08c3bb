"""verifierd's /metrics as one of the daemon's services.

Exports the commitments this verifier knows (`veritap_commitment_info`), counts every stored
verdict by commitment, status and reason (with its prefill and scoring time) and each verdict
a superseding one replaced, from the store's verdict listener, refreshes the backlog and
loaded-engine gauges every `POLL_S` seconds, and serves `verifierd.metrics.METRICS` at
`[metrics] listen` ("": not served). When the address is taken (a second verifierd on the
host) the service says so in the log and the metrics are still kept, just not served.

The provers' gauges (alarm state, unverifiable share, evidence) are refreshed with the
backlog, from verifierd.provers' tables.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence

from veritap.metrics_http import MetricsServer
from veritap.v1 import verifier_pb2

from verifierd.daemon import DaemonContext
from verifierd.metrics import METRICS, VerifierMetrics
from verifierd.store import StoredVerdict

log = logging.getLogger(__name__)

POLL_S = 2.0
_LOADED = (verifier_pb2.ENGINE_STATE_READY, verifier_pb2.ENGINE_STATE_BUSY)


class MetricsService:
    name = "metrics"

    def __init__(
        self, context: DaemonContext, metrics: VerifierMetrics = METRICS, listen: str | None = None
    ) -> None:
        """`listen` overrides `[metrics] listen`."""
        self._context = context
        self._metrics = metrics
        self._listen = context.config.metrics.listen if listen is None else listen
        self._running = False
        self._task: asyncio.Task[None] | None = None
        self._server: MetricsServer | None = None
        self._backlog_commitments: set[str] = set()
        context.store.add_verdict_listener(self._on_verdicts)

    @property
    def url(self) -> str | None:
        return None if self._server is None else self._server.url

    def _on_verdicts(self, written: Sequence[StoredVerdict]) -> None:
        if self._running:
            for stored in written:
                self._metrics.verdict_stored(stored.verdict, stored.previous)

    def refresh(self) -> None:
        """Backlog per commitment, entries awaiting a checkpoint and loaded engines, from the
        store and the pool (blocks)."""
        now = time.time_ns()
        seen = set()
        for backlog in self._context.store.backlog():
            seen.add(backlog.commitment_id)
            labels = {"commitment": backlog.commitment_id}
            self._metrics.backlog.labels(**labels).set(backlog.pending)
            age = max(0, now - backlog.oldest_enqueued_ns) / 1e9 if backlog.pending else 0.0
            self._metrics.backlog_oldest_age.labels(**labels).set(age)
        for gone in self._backlog_commitments - seen:
            self._metrics.backlog.labels(commitment=gone).set(0)
            self._metrics.backlog_oldest_age.labels(commitment=gone).set(0)
        self._backlog_commitments = seen
        self._metrics.awaiting_checkpoint.set(self._context.store.counts().awaiting_checkpoint)
        loaded = sum(1 for e in self._context.pool.status() if e.state in _LOADED)
        self._metrics.engines_loaded.set(loaded)
        provers = self._context.provers
        self._metrics.set_provers(provers.provers(), provers.config.hiding.window_s)

    async def _poll(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self.refresh)
            except Exception:
                log.exception("metrics refresh failed")
            await asyncio.sleep(POLL_S)

    async def start(self) -> None:
        self._running = True
        self._metrics.commitments_known(self._context.registry.by_id.values())
        if self._listen:
            try:
                self._server = self._metrics.serve(self._listen)
            except OSError as exc:
                log.warning(
                    "metrics kept but not served",
                    extra={"listen": self._listen, "reason": str(exc)},
                )
        self._task = asyncio.create_task(self._poll(), name="metrics-refresh")

    async def stop(self) -> None:
        self._running = False
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._server is not None:
            await asyncio.to_thread(self._server.close)
            self._server = None


def create(context: DaemonContext) -> MetricsService:
    return MetricsService(context)

"""All collector links of one verifierd, run as tasks in its asyncio loop.

intake = Intake(store, config)   # config: verifierd.config.Config
await intake.start()
... intake.status() ...          # one LinkStatus per configured collector
await intake.stop()
"""

from __future__ import annotations

import asyncio
import logging

from verifierd.config import Config, IntakeConfig
from verifierd.intake.backoff import Backoff
from verifierd.intake.link import CollectorLink, LinkStatus, load_collector_key
from verifierd.metrics import METRICS, VerifierMetrics
from verifierd.store import Store

logger = logging.getLogger(__name__)


def reconnect_backoff(intake: IntakeConfig) -> Backoff:
    """A link's own reconnect backoff, from the [intake] table."""
    return Backoff(
        initial_s=intake.reconnect_initial_s,
        maximum_s=intake.reconnect_max_s,
        factor=intake.reconnect_factor,
    )


class Intake:
    name = "intake"

    def __init__(self, store: Store, config: Config, *, metrics: VerifierMetrics = METRICS) -> None:
        self._store = store
        self.links = [
            CollectorLink(
                store,
                collector,
                key=load_collector_key(collector.public_key),
                verifier_id=config.verifier_id,
                state_dir=config.state_dir,
                backoff=reconnect_backoff(config.intake),
                metrics=metrics,
            )
            for collector in config.collectors
        ]
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Start a task per collector, except those stopped by an alert (cleared by an operator)."""
        alerts = {a.origin: a.reason for a in await asyncio.to_thread(self._store.alerts)}
        for link in self.links:
            if link.origin in alerts:
                link.set_alert_state(alerts[link.origin])
                logger.warning("intake stays stopped by an alert", extra={"origin": link.origin})
                continue
            self._tasks.append(asyncio.create_task(link.run(), name=f"intake:{link.origin}"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for link in self.links:
            if not link.alert_reason:
                link.state = "stopped"
        self._tasks.clear()

    async def wait(self) -> None:
        """Until every link has stopped (each ends only on an alert or on stop())."""
        await asyncio.gather(*self._tasks)

    def status(self) -> list[LinkStatus]:
        return [link.status() for link in self.links]

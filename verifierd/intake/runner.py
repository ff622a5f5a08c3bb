"""All collector links of one verifierd, run as tasks in its asyncio loop.

intake = Intake(store, config)   # config: verifierd.config.Config
await intake.start()
... intake.status() ...          # one LinkStatus per configured collector
await intake.clear(origin, actor=..., why=...)   # resume after an alert (operator)
await intake.stop()

A link stopped by an alert stays stopped, across restarts too, until an operator clears
the alert (`stop_alerted` stops one for an alert the pipeline raised about what was
stored from that collector); :meth:`Intake.clear` resumes it only when the collector's log
agrees again with what was stored (verifierd.intake.resume_check), and keeps the alert as
cleared.
"""

from __future__ import annotations

import asyncio
import logging

from appliance.journal import MessageId
from verifierd.config import Config, IntakeConfig
from verifierd.intake.backoff import Backoff
from verifierd.intake.link import CollectorLink, LinkStatus, load_collector_key
from verifierd.intake.resume_check import NothingToClearError, ResumeRefusedError
from verifierd.metrics import METRICS, VerifierMetrics
from verifierd.store import ClearedAlert, Store

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
        #: The running (or finished) task of each link, by origin.
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._running = False
        self._clearing = asyncio.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    def _run(self, link: CollectorLink) -> None:
        self._tasks[link.origin] = asyncio.create_task(link.run(), name=f"intake:{link.origin}")

    async def start(self) -> None:
        """Start a task per collector, except those stopped by an alert (cleared by an operator)."""
        self._running = True
        self._loop = asyncio.get_running_loop()
        alerts = {a.origin: a.reason for a in await asyncio.to_thread(self._store.alerts)}
        for link in self.links:
            if link.origin in alerts:
                link.set_alert_state(alerts[link.origin])
                logger.warning("intake stays stopped by an alert", extra={"origin": link.origin})
                continue
            self._run(link)

    async def stop(self) -> None:
        self._running = False
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for link in self.links:
            if not link.alert_reason:
                link.state = "stopped"
        self._tasks.clear()

    async def wait(self) -> None:
        """Until every link has stopped (each ends only on an alert or on stop())."""
        while not all(task.done() for task in self._tasks.values()):
            await asyncio.gather(*self._tasks.values())

    async def clear(self, origin: str, *, actor: str, why: str) -> ClearedAlert:
        """Resume intake from ``origin`` after an alert, when its collector's log agrees
        again with what was stored. The alert stays in the store as cleared by ``actor``
        for ``why``, with what the collector showed, and the audit log says so.

        Raises NothingToClearError when the origin has no alert in force, and
        ResumeRefusedError when intake may not resume (the message says why; the
        refused attempt is audited too)."""
        async with self._clearing:
            try:
                return await self._clear(origin, actor=actor, why=why)
            except ResumeRefusedError as exc:
                detail = {"origin": origin, "why": why, "refusal": str(exc)}
                await asyncio.to_thread(
                    self._store.audit, actor, "clear_intake_alert_refused", detail
                )
                raise

    async def _clear(self, origin: str, *, actor: str, why: str) -> ClearedAlert:
        alerts = await asyncio.to_thread(self._store.alerts)
        if origin not in {a.origin for a in alerts}:
            raise NothingToClearError(f"no intake alert in force for {origin!r}")
        link = next((link for link in self.links if link.origin == origin), None)
        if link is None:
            raise ResumeRefusedError(
                f"{origin!r} is not among this verifierd's [[collectors]]: nothing would resume"
            )
        task = self._tasks.get(origin)
        if not self._running or (task is not None and not task.done()):
            raise ResumeRefusedError(f"the intake from {origin!r} is not stopped here")
        check = await link.check_resume()
        if not check.ok:
            logger.warning(
                "intake alert not cleared: the collector still disagrees",
                extra={"origin": origin, "actor": actor, "check": check.summary},
            )
            raise ResumeRefusedError(check.summary)
        if not self._running:
            raise ResumeRefusedError("the intake stopped while the collector was asked")
        cleared = await asyncio.to_thread(
            self._store.clear_alert, origin, actor=actor, why=why, check=check.summary
        )
        link.clear_alert_state()
        self._run(link)
        logger.warning(
            "intake alert cleared: resuming",
            extra={
                "origin": origin,
                "actor": actor,
                "why": why,
                "alert_reason": cleared.alert.reason,
                "check": check.summary,
            },
        )
        return cleared

    def stop_alerted(self, origin: str, reason: str) -> None:
        """Stop the link from ``origin`` for an alert already stored by another part of
        verifierd (the pipeline found what was stored from it altered). Any thread may
        call it; before start() it does nothing (start() reads the stored alerts)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._stop_for_alert, origin, reason)

    def _stop_for_alert(self, origin: str, reason: str) -> None:
        link = next((link for link in self.links if link.origin == origin), None)
        if link is None or link.alert_reason:
            return
        task = self._tasks.get(origin)
        if task is not None:
            task.cancel()
        link.set_alert_state(reason)
        logger.error(
            "intake stopped by an alert about the stored log",
            extra={"message_id": MessageId.INTAKE_ALERT, "origin": origin, "reason": reason},
        )

    def status(self) -> list[LinkStatus]:
        return [link.status() for link in self.links]

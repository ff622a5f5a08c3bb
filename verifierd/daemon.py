"""verifierd's daemon: the store, the engine pool and the scheduler, plus plugged-in services.

The daemon owns one asyncio loop. The scheduler (:class:`verifierd.pipeline.Pipeline`)
runs in a worker thread, because LMDB writes, engine loads and engine batches
block; the engines themselves run in child processes. Everything else is an
async **service** on the loop: the gRPC intake from collectors, the
VerifierService, metrics, the compute meter.

A service is any object with ``name``, ``async start()`` and ``async stop()``.
Services are plugged in by adding a module to :mod:`verifierd.services` that
defines ``create(context: DaemonContext) -> Service | None`` (None when its
configuration turns it off): the daemon discovers them, starts them in module
name order after the store and pool are open, and stops them in reverse order
before the scheduler stops. Nobody edits this file to add one.

systemd: READY=1 once every service started, STATUS= lines as the daemon
starts and stops, and WATCHDOG=1 pings from the loop while the scheduler
thread is alive (appliance.sd_notify, appliance.watchdog).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import pkgutil
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from veritap.signing import Signer

from appliance.sd_notify import Notifier
from appliance.watchdog import Watchdog
from verifierd import services
from verifierd.commitments import CommitmentRegistry
from verifierd.config import Config
from verifierd.engine.pool import EnginePool
from verifierd.pipeline import Pipeline
from verifierd.provers.store import ProverTables
from verifierd.store import Store
from verifierd.verdicts import load_or_create_secret, load_or_create_signer
from verifierd.weights_cache import WeightsCache

log = logging.getLogger(__name__)

#: How long a stopping daemon lets the scheduler finish its batch before killing engines.
STOP_GRACE_S = 30.0


@dataclass(frozen=True)
class DaemonContext:
    """What a service may use. The store and pool are thread-safe; store calls block
    (run them with ``asyncio.to_thread`` from the loop)."""

    config: Config
    store: Store
    registry: CommitmentRegistry
    weights: WeightsCache
    pool: EnginePool
    pipeline: Pipeline
    #: The verifier's signing key (services publish its public half).
    signer: Signer
    #: Per-prover statistics and alarms, kept by the store's verdict hook.
    provers: ProverTables
    #: Services started so far, in start order (modules in verifierd.services start by
    #: name), so a later service can use an earlier one, e.g. the API reading intake status.
    started: list[Service] = field(default_factory=list)


class Service(Protocol):
    @property
    def name(self) -> str: ...

    async def start(self) -> None:
        """Start serving; return once ready (the work continues in tasks)."""

    async def stop(self) -> None:
        """Stop and release everything started."""


ServiceFactory = Callable[[DaemonContext], Service | None]


def discovered_services() -> list[ServiceFactory]:
    """The ``create`` function of every module in verifierd.services, by module name."""
    factories = []
    for info in sorted(pkgutil.iter_modules(services.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{services.__name__}.{info.name}")
        factories.append(module.create)
    return factories


class Daemon:
    def __init__(
        self,
        config: Config,
        *,
        factories: Sequence[ServiceFactory] | None = None,
        reverify: bool = False,
    ) -> None:
        self._config = config
        self._reverify = reverify
        self._factories = discovered_services() if factories is None else list(factories)

    async def run(self, stop: asyncio.Event | None = None) -> int:
        """Serve until SIGTERM/SIGINT (or ``stop`` is set); returns the exit code."""
        config = self._config
        stop = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        notifier = Notifier.from_env()
        notifier.status("opening the store")
        store = Store.open(config.store_dir, map_size=int(config.store.map_size_gib * (1 << 30)))
        pool = EnginePool(config.engines)
        try:
            signer = load_or_create_signer(config.key_file, config.verifier_id)
            # Before the scheduler writes a verdict: every one updates its prover.
            provers = ProverTables(store, config.provers, signer)
            registry = CommitmentRegistry.from_dir(config.commitments_dir)
            weights = WeightsCache(config.weights_dir)
            pipeline = Pipeline(
                config=config,
                store=store,
                registry=registry,
                weights=weights,
                pool=pool,
                signer=signer,
                secret=load_or_create_secret(config.secret_file),
                reverify=self._reverify,
            )
            context = DaemonContext(
                config, store, registry, weights, pool, pipeline, signer, provers
            )
            return await self._serve(context, stop, notifier)
        finally:
            pool.close()
            store.close()
            notifier.stopping(status="stopped")

    async def _serve(self, context: DaemonContext, stop: asyncio.Event, notifier: Notifier) -> int:
        halt = threading.Event()
        scheduler = asyncio.create_task(
            asyncio.to_thread(context.pipeline.run, halt), name="scheduler"
        )
        started = context.started
        try:
            for factory in self._factories:
                service = factory(context)
                if service is None:
                    continue
                notifier.status(f"starting {service.name}")
                await service.start()
                started.append(service)
                log.info("service started", extra={"service": service.name})
            commitments = len(context.registry.by_id)
            names = ", ".join(s.name for s in started) or "no services"
            notifier.ready(status=f"verifying {commitments} commitments; {names}")
            log.info("verifierd ready", extra={"commitments": commitments, "services": names})
            watchdog = asyncio.create_task(
                Watchdog.from_env(notifier).run(healthy=lambda: not scheduler.done()),
                name="watchdog",
            )
            stopper = asyncio.create_task(stop.wait(), name="stop")
            await asyncio.wait({scheduler, stopper}, return_when=asyncio.FIRST_COMPLETED)
            watchdog.cancel()
            stopper.cancel()
        finally:
            notifier.status("stopping")
            for service in reversed(started):
                try:
                    await service.stop()
                except Exception:
                    log.exception("service failed to stop", extra={"service": service.name})
            halt.set()
            done, _ = await asyncio.wait({scheduler}, timeout=STOP_GRACE_S)
            if not done:
                log.warning("scheduler still busy: stopping the engines under it")
                context.pool.close()
                await asyncio.wait({scheduler})
        error = scheduler.exception()
        if error is not None:
            log.error("scheduler failed", exc_info=error)
            return 1
        return 0

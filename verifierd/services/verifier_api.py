"""The VerifierService (gRPC query and admin API) as one of the daemon's services.

It serves the daemon's store, commitments and weights cache, and lends the engine pool
to GetEngines, and the intake and the compute meter's VCA gauge (both started before it)
to GetStats. Its configuration is the
[service] table (listen address, TLS files, admin_subjects).
"""

from __future__ import annotations

from verifierd.api import ServiceSettings, ServiceSources, VerifierServer, start_verifier_service
from verifierd.daemon import DaemonContext
from verifierd.intake import Intake
from verifierd.services.compute_meter import ComputeMeterService


class VerifierApiService:
    name = "verifier-api"

    def __init__(self, context: DaemonContext) -> None:
        self._context = context
        self._server: VerifierServer | None = None

    async def start(self) -> None:
        context = self._context
        intake = next((s for s in context.started if isinstance(s, Intake)), None)
        meter = next((s for s in context.started if isinstance(s, ComputeMeterService)), None)
        self._server = await start_verifier_service(
            context.store,
            context.registry,
            ServiceSettings.from_config(context.config.service),
            weights=context.weights,
            sources=ServiceSources(
                intake=intake,
                engines=context.pool,
                vca=None if meter is None else meter.vca_figure,
            ),
            provers=context.provers,
        )

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop()
            self._server = None


def create(context: DaemonContext) -> VerifierApiService:
    return VerifierApiService(context)

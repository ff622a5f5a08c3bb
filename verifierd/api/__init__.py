"""verifierd's VerifierService: the gRPC query and admin API operators and scripts use.

The daemon starts it inside its asyncio loop::

    server = await start_verifier_service(store, registry, ServiceSettings.from_config(config),
                                          weights=WeightsCache(config.weights_dir),
                                          sources=ServiceSources(intake=intake, engines=pool))
    ...
    await server.stop()

Modules: :mod:`identity` (who is calling, who is admin), :mod:`verdict_query` (filters and
page tokens), :mod:`record_tokens` and :mod:`tokenizer_cache` (token texts for the record
view), :mod:`verdict_hub` (fan-out of new verdicts to WatchVerdicts streams),
:mod:`rate_window` (throughput), :mod:`sources` (what the daemon lends for GetStats and
GetEngines), :mod:`servicer` (the RPCs) and :mod:`server` (gRPC server, TLS, health,
reflection).
"""

from verifierd.api.server import ServiceSettings, VerifierServer, start_verifier_service
from verifierd.api.sources import ServiceSources, VcaFigure

__all__ = [
    "ServiceSettings",
    "ServiceSources",
    "VcaFigure",
    "VerifierServer",
    "start_verifier_service",
]

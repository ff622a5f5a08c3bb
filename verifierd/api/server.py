"""Start and stop the VerifierService: gRPC server, TLS, health and reflection.

Mutual TLS is on when the service has a client CA (``service.ca_file``): every
client then needs a certificate from that CA, and the admin role is bound to
the certificate subjects in :attr:`ServiceSettings.admin_subjects`. Without a
certificate (``service.cert_file`` empty) the service listens in plaintext, which
:func:`veritap.tls.require_tls_off_loopback` allows on loopback only; no caller
is admin then.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from veritap.tls import ServerTls, TlsConfigError, require_tls_off_loopback, server_credentials
from veritap.v1 import verifier_pb2, verifier_pb2_grpc

from verifierd.api.alarm_hub import AlarmHub
from verifierd.api.errors import ApiError
from verifierd.api.identity import AdminPolicy
from verifierd.api.prover_rpcs import ProverSource
from verifierd.api.rate_window import RateWindow
from verifierd.api.servicer import VerifierServicer
from verifierd.api.sources import ServiceSources
from verifierd.api.tokenizer_cache import TokenizerCache
from verifierd.api.verdict_hub import VerdictHub
from verifierd.commitments import CommitmentRegistry
from verifierd.config import ServiceConfig
from verifierd.provers.store import ProverTables
from verifierd.store import Store, StoredVerdict
from verifierd.weights_cache import WeightsCache

logger = logging.getLogger(__name__)

VERIFIER_SERVICE_NAME = verifier_pb2.DESCRIPTOR.services_by_name["VerifierService"].full_name


@dataclass(frozen=True)
class ServiceSettings:
    #: host:port (port 0 picks a free port; see VerifierServer.port).
    listen: str = "127.0.0.1:50061"
    tls: ServerTls | None = None
    #: Certificate subjects ("CN=ops-admin,O=veritap") or common names holding the admin role.
    admin_subjects: frozenset[str] = frozenset()

    @classmethod
    def from_config(cls, service: ServiceConfig) -> ServiceSettings:
        """From verifierd's [service] table."""
        tls = None
        if service.cert_file:
            tls = ServerTls(
                cert=Path(service.cert_file),
                key=Path(service.key_file),
                client_ca=Path(service.ca_file) if service.ca_file else None,
            )
        return cls(listen=service.listen, tls=tls, admin_subjects=frozenset(service.admin_subjects))


class VerifierServer:
    """A running VerifierService; ``port`` is the bound port."""

    def __init__(
        self,
        server: grpc.aio.Server,
        port: int,
        health_servicer: Any,
        hub: VerdictHub,
        alarm_hub: AlarmHub,
    ) -> None:
        self.server = server
        self.port = port
        self._health = health_servicer
        self._hub = hub
        self._alarm_hub = alarm_hub

    @property
    def watchers(self) -> int:
        """Open WatchVerdicts streams."""
        return self._hub.subscribers

    async def stop(self, grace_s: float | None = 1.0) -> None:
        """Report NOT_SERVING, end watch streams, let calls finish within ``grace_s``."""
        await self._health.enter_graceful_shutdown()
        self._hub.close()
        self._alarm_hub.close()
        await self.server.stop(grace_s)

    async def wait_for_termination(self) -> None:
        await self.server.wait_for_termination()


async def start_verifier_service(
    store: Store,
    registry: CommitmentRegistry,
    settings: ServiceSettings,
    *,
    weights: WeightsCache | None = None,
    sources: ServiceSources | None = None,
    provers: ProverTables | None = None,
) -> VerifierServer:
    """Serve the VerifierService in the running loop; returns once the port is bound.

    ``weights`` locates the commitments' tokenizers for GetRecord's token texts;
    ``sources`` lends the intake links, engine pool and VCA figure to GetStats and
    GetEngines (each may be None: the service then reports what the store knows);
    ``provers`` serves ListProvers, GetProver, WatchAlarms and ClearAlarm (None: those
    answer UNIMPLEMENTED).
    """
    try:
        require_tls_off_loopback(settings.listen, settings.tls)
        credentials = None if settings.tls is None else server_credentials(settings.tls)
    except TlsConfigError as exc:
        raise ApiError(f"service: {exc}") from exc
    hub = VerdictHub()
    rate = RateWindow()

    def on_verdicts(batch: Sequence[StoredVerdict]) -> None:
        # Records judged: a verdict superseding another judges no new record.
        rate.add(sum(1 for stored in batch if stored.previous is None), time.time_ns())
        hub.publish(batch)

    store.add_verdict_listener(on_verdicts)
    alarm_hub = AlarmHub()
    if provers is not None:
        provers.add_alarm_listener(alarm_hub.publish)
    servicer = VerifierServicer(
        store,
        registry,
        admin=AdminPolicy.of(settings.admin_subjects),
        tokenizers=TokenizerCache(weights),
        hub=hub,
        rate=rate,
        sources=sources or ServiceSources(),
        provers=None if provers is None else ProverSource(provers, alarm_hub),
    )
    server = grpc.aio.server(
        options=[
            ("grpc.max_send_message_length", 16 << 20),
            ("grpc.max_receive_message_length", 1 << 20),
            ("grpc.keepalive_time_ms", 20_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
            ("grpc.keepalive_permit_without_calls", 1),
        ]
    )
    verifier_pb2_grpc.add_VerifierServiceServicer_to_server(servicer, server)
    # grpc_health's stubs lack its asyncio servicer.
    health_servicer = health.aio.HealthServicer()  # type: ignore[attr-defined]
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (VERIFIER_SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    try:
        if credentials is None:
            port = server.add_insecure_port(settings.listen)
        else:
            port = server.add_secure_port(settings.listen, credentials)
    except RuntimeError as exc:
        hub.close()
        alarm_hub.close()
        raise ApiError(f"service: cannot listen on {settings.listen!r}: {exc}") from exc
    if port == 0:
        hub.close()
        alarm_hub.close()
        raise ApiError(f"service: cannot listen on {settings.listen!r}")
    await server.start()
    await health_servicer.set(VERIFIER_SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    logger.info(
        "verifier service listening",
        extra={
            "listen": settings.listen,
            "port": port,
            "tls": settings.tls is not None,
            "mtls": settings.tls is not None and settings.tls.client_ca is not None,
            "admin_subjects": sorted(settings.admin_subjects),
        },
    )
    return VerifierServer(server, port, health_servicer, hub, alarm_hub)

"""Serve a prometheus-client registry at /metrics on a configurable address.

Both daemons call `serve_metrics(registry, "127.0.0.1:9400")` at start and `close()` at exit.
The server is prometheus-client's threaded WSGI server, so it answers while the daemon's own
threads or event loop are busy. Port 0 picks a free port; `MetricsServer.port` tells which.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where a server starts: config checks (`parse_listen`) need neither
    from wsgiref.simple_server import WSGIServer

    from prometheus_client import CollectorRegistry


class MetricsAddressError(ValueError):
    """A metrics listen address is not host:port."""


def parse_listen(address: str) -> tuple[str, int]:
    """`host:port` or `[v6]:port` to (host, port)."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not host:
        raise MetricsAddressError(f"metrics address {address!r}: expected host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise MetricsAddressError(f"metrics address {address!r}: write IPv6 as [addr]:port")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise MetricsAddressError(f"metrics address {address!r}: bad port")
    return host, int(port_text)


@dataclass
class MetricsServer:
    """A running /metrics endpoint."""

    host: str
    port: int
    _server: WSGIServer
    _thread: threading.Thread

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def serve_metrics(registry: CollectorRegistry, address: str) -> MetricsServer:
    """Start serving `registry` at http://ADDRESS/metrics in a background thread."""
    from prometheus_client import start_http_server

    host, port = parse_listen(address)
    server, thread = start_http_server(port, addr=host, registry=registry)
    return MetricsServer(host, int(server.server_port), server, thread)

"""A socketserver on loopback, served from a daemon thread while a ``with`` block runs."""

from __future__ import annotations

import socketserver
import threading
from http.server import ThreadingHTTPServer
from types import TracebackType
from typing import Self


class BackgroundServer:
    """Serves ``server`` from a daemon thread: a context manager that starts it on
    entry and stops it (no more accepting, socket closed) on exit."""

    def __init__(self, server: socketserver.ThreadingTCPServer | ThreadingHTTPServer) -> None:
        server.daemon_threads = True
        self._server = server
        self.port: int = server.server_address[1]
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()

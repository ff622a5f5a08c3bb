"""A byte-for-byte TCP relay on loopback: the tap sees the server's own bytes on
the relay's port, while the server's port stays out of the capture filter (so a
proxy in front of the same server is not captured a second time)."""

from __future__ import annotations

import socket
import socketserver
import threading
from contextlib import suppress

from tests.e2e.background_server import BackgroundServer


class TcpRelay(BackgroundServer):
    """Accepts on 127.0.0.1:``port`` and copies each connection both ways to
    ``target``, passing half-closes on; a context manager that stops accepting
    on exit."""

    def __init__(self, target: tuple[str, int]) -> None:
        relay = self

        class _Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                relay._pipe(self.request)

        self._target = target
        super().__init__(socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Handler))

    def _pipe(self, client: socket.socket) -> None:
        with socket.create_connection(self._target) as upstream:
            back = threading.Thread(target=_copy, args=(upstream, client), daemon=True)
            back.start()
            _copy(client, upstream)
            back.join()


def _copy(source: socket.socket, sink: socket.socket) -> None:
    """Copy until ``source`` ends, then end ``sink``'s sending side."""
    with suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    with suppress(OSError):
        sink.shutdown(socket.SHUT_WR)

"""A bound unix datagram socket standing in for systemd's notify or journal socket."""

from __future__ import annotations

import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class DatagramListener:
    """A bound unix datagram socket and the NOTIFY_SOCKET value that names it."""

    sock: socket.socket
    env_value: str

    def receive(self, timeout: float = 5.0) -> bytes:
        self.sock.settimeout(timeout)
        return self.sock.recv(1 << 20)

    def pending(self) -> list[bytes]:
        """Every datagram already queued, without waiting."""
        self.sock.setblocking(False)
        out = []
        try:
            while True:
                out.append(self.sock.recv(1 << 20))
        except BlockingIOError:
            return out

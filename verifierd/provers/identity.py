"""Which prover a verdict is about: (collector origin, server address, server port)."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from veritap.envelope import EnvelopeError, decode_envelope, decode_record
from veritap.v1 import verifier_pb2

_PORT = struct.Struct(">H")


class ProverKeyError(ValueError):
    """Bytes or a name that is not a prover key."""


@dataclass(frozen=True, order=True)
class ProverKey:
    origin: str
    #: Canonical textual address ("" when the record did not parse: its origin's
    #: unattributed traffic).
    server_address: str
    server_port: int

    def __post_init__(self) -> None:
        if "\x00" in self.origin or "\x00" in self.server_address:
            raise ProverKeyError("a prover's origin and address may not contain NUL")
        if not 0 <= self.server_port <= 0xFFFF:
            raise ProverKeyError(f"port {self.server_port} out of range")

    def to_bytes(self) -> bytes:
        """origin, NUL, address, NUL, port (2 bytes): sorts by origin, address, port."""
        return (
            self.origin.encode()
            + b"\x00"
            + self.server_address.encode()
            + b"\x00"
            + _PORT.pack(self.server_port)
        )

    @classmethod
    def from_bytes(cls, raw: bytes) -> ProverKey:
        origin, _, rest = raw.partition(b"\x00")
        address, nul, port = rest.partition(b"\x00")
        if not nul or len(port) != _PORT.size:
            raise ProverKeyError(f"not a prover key: {raw!r}")
        return cls(origin.decode(), address.decode(), _PORT.unpack(port)[0])

    @property
    def label(self) -> str:
        """``origin/address:port`` (``[v6]:port`` for IPv6), the metrics' and CLI's name."""
        host = f"[{self.server_address}]" if ":" in self.server_address else self.server_address
        return f"{self.origin}/{host}:{self.server_port}"

    def to_proto(self) -> verifier_pb2.ProverId:
        return verifier_pb2.ProverId(
            origin=self.origin, server_address=self.server_address, server_port=self.server_port
        )

    @classmethod
    def of_proto(cls, message: verifier_pb2.ProverId) -> ProverKey:
        return cls(message.origin, message.server_address, message.server_port)

    @classmethod
    def parse(cls, label: str) -> ProverKey:
        """The inverse of :attr:`label`."""
        origin, slash, endpoint = label.rpartition("/")
        host, colon, port = endpoint.rpartition(":")
        if not slash or not colon or not port.isdigit():
            raise ProverKeyError(f"expected ORIGIN/ADDRESS:PORT, got {label!r}")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        return cls(origin, host, int(port))


def prover_of_envelope(origin: str, envelope: bytes) -> ProverKey:
    """The prover whose traffic a stored log entry recorded; an entry that does not parse
    is its origin's unattributed traffic (address "", port 0)."""
    try:
        flow = decode_record(decode_envelope(envelope)).flow
    except EnvelopeError:
        return ProverKey(origin, "", 0)
    return ProverKey(origin, flow.server_address, flow.server_port)

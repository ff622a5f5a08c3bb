"""TLS for the gRPC link between collector and verifierd, configured by file paths.

The collector serves with a certificate and key; giving it a client CA turns on mutual
TLS (clients without a certificate from that CA are refused during the handshake). The
verifier pins the CA that issued the collector's certificate and presents its own
certificate for mutual TLS. Plaintext is allowed only on loopback addresses: a
configuration that would send records in clear text over a network is an error.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # grpc is imported where credentials are made: config checks need no gRPC
    import grpc


class TlsConfigError(ValueError):
    """A TLS setting is missing, unreadable or not allowed (e.g. plaintext off loopback)."""


@dataclass(frozen=True)
class ServerTls:
    """The collector's side: its certificate chain and key, and the CA for client certificates.

    With `client_ca` set every client must present a certificate issued by it (mutual TLS).
    """

    cert: Path
    key: Path
    client_ca: Path | None = None


@dataclass(frozen=True)
class ClientTls:
    """The verifier's side: the CA it pins for the server, and its own certificate for mTLS.

    `server_name` overrides the name checked against the server certificate (useful when
    the address is an IP the certificate does not name).
    """

    ca: Path
    cert: Path | None = None
    key: Path | None = None
    server_name: str | None = None


def split_host_port(address: str) -> tuple[str, int]:
    """Split `host:port` or `[v6-literal]:port`; the port must be given."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not host:
        raise TlsConfigError(f"address {address!r} needs the form host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise TlsConfigError(f"address {address!r}: write an IPv6 literal as [addr]:port")
    if not host:
        raise TlsConfigError(f"address {address!r} has no host")
    try:
        port = int(port_text)
    except ValueError as exc:
        raise TlsConfigError(f"address {address!r} has a bad port") from exc
    if not 0 <= port <= 65535:
        raise TlsConfigError(f"address {address!r} has a port out of range")
    return host, port


def is_loopback_host(host: str) -> bool:
    """True for `localhost` and for IP literals in 127.0.0.0/8 or ::1."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def require_tls_off_loopback(address: str, tls: ServerTls | ClientTls | None) -> None:
    """Refuse a plaintext listener or connection on anything but a loopback address."""
    host, _ = split_host_port(address)
    if tls is None and not is_loopback_host(host):
        raise TlsConfigError(
            f"plaintext gRPC is allowed only on loopback; {address!r} needs TLS settings"
        )


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TlsConfigError(f"cannot read the {what} {str(path)!r}: {exc.strerror}") from exc


def server_credentials(tls: ServerTls) -> grpc.ServerCredentials:
    """Server credentials; mutual TLS (client certificate required) when a client CA is set."""
    import grpc

    chain = _read(tls.cert, "server certificate")
    key = _read(tls.key, "server key")
    if tls.client_ca is None:
        return grpc.ssl_server_credentials([(key, chain)])
    return grpc.ssl_server_credentials(
        [(key, chain)],
        root_certificates=_read(tls.client_ca, "client CA"),
        require_client_auth=True,
    )


# The largest gRPC message a ledger stream carries: the collector's send limit and the
# verifier's receive limit. One entry travels alone in a message when it is large, so a
# record must stay below it (the collector bounds its records to fit).
MAX_STREAM_MESSAGE_BYTES = 16 << 20


def channel_credentials(tls: ClientTls) -> grpc.ChannelCredentials:
    """Channel credentials pinning `tls.ca`, with the client certificate when one is set."""
    import grpc

    if (tls.cert is None) != (tls.key is None):
        raise TlsConfigError("a client certificate needs its key and the key its certificate")
    return grpc.ssl_channel_credentials(
        root_certificates=_read(tls.ca, "CA"),
        private_key=None if tls.key is None else _read(tls.key, "client key"),
        certificate_chain=None if tls.cert is None else _read(tls.cert, "client certificate"),
    )


def channel_options(tls: ClientTls | None) -> list[tuple[str, str | int]]:
    """Channel options: the TLS name override, and message sizes for 1 MiB batches."""
    options: list[tuple[str, str | int]] = [
        ("grpc.max_receive_message_length", MAX_STREAM_MESSAGE_BYTES)
    ]
    if tls is not None and tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    return options

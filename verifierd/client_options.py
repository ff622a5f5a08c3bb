"""How the `verifierd` subcommands that call a running daemon reach it: the shared
--address/--ca/--cert/--key/--server-name/--timeout options and the channel they describe
(plaintext only on loopback, as the daemon's own rule)."""

from __future__ import annotations

import argparse
from pathlib import Path

import grpc
from veritap.tls import (
    ClientTls,
    TlsConfigError,
    channel_credentials,
    channel_options,
    require_tls_off_loopback,
)

from verifierd.config import ServiceConfig


def connection_parser(*, timeout_s: float) -> argparse.ArgumentParser:
    """A parent parser holding the connection options (`parents=[...]` of a subcommand)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--address", default=ServiceConfig().listen, help="host:port")
    parser.add_argument("--ca", type=Path, help="CA certificate that issued verifierd's")
    parser.add_argument("--cert", type=Path, help="client certificate (mutual TLS)")
    parser.add_argument("--key", type=Path, help="client key (mutual TLS)")
    parser.add_argument("--server-name", help="name to check in verifierd's certificate")
    parser.add_argument("--timeout", type=float, default=timeout_s, help="seconds per call")
    return parser


def open_channel(args: argparse.Namespace) -> grpc.aio.Channel:
    """The channel the connection options describe; TlsConfigError when they do not fit."""
    tls = None
    if args.ca is not None:
        tls = ClientTls(ca=args.ca, cert=args.cert, key=args.key, server_name=args.server_name)
    elif args.cert is not None or args.key is not None:
        raise TlsConfigError("--cert and --key need --ca")
    require_tls_off_loopback(args.address, tls)
    if tls is None:
        return grpc.aio.insecure_channel(args.address, options=channel_options(None))
    return grpc.aio.secure_channel(
        args.address, channel_credentials(tls), options=channel_options(tls)
    )

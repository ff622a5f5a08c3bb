"""veritap.tls: address parsing, the loopback rule, credentials from files."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from veritap.tls import (
    ClientTls,
    ServerTls,
    TlsConfigError,
    channel_credentials,
    is_loopback_host,
    require_tls_off_loopback,
    server_credentials,
    split_host_port,
)

from tests.tls import write_test_pki


@given(address=st.ip_addresses(), port=st.integers(0, 65535))
def test_ip_literals_round_trip_with_their_port(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int
) -> None:
    text = f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"
    assert split_host_port(text) == (str(address), port)
    assert is_loopback_host(str(address)) == address.is_loopback


@given(text=st.text(max_size=40))
def test_any_text_either_splits_or_says_why(text: str) -> None:
    try:
        host, port = split_host_port(text)
    except TlsConfigError:
        return
    assert host and 0 <= port <= 65535


@pytest.mark.parametrize(
    "address", ["7700", ":7700", "[]:7700", "::1:7700", "host:port", "host:70000"]
)
def test_malformed_addresses_are_refused(address: str) -> None:
    with pytest.raises(TlsConfigError):
        split_host_port(address)


def test_plaintext_only_on_loopback(tmp_path: Path) -> None:
    require_tls_off_loopback("127.0.0.1:1", None)
    require_tls_off_loopback("localhost:1", None)
    require_tls_off_loopback("[::1]:1", None)
    with pytest.raises(TlsConfigError, match="loopback"):
        require_tls_off_loopback("10.0.0.1:1", None)
    require_tls_off_loopback("10.0.0.1:1", ClientTls(tmp_path / "ca.pem"))


def test_credentials_come_from_the_files_and_name_a_missing_one(tmp_path: Path) -> None:
    pki = write_test_pki(tmp_path)
    server_credentials(ServerTls(pki.server_cert, pki.server_key, pki.ca))
    channel_credentials(ClientTls(pki.ca, pki.client_cert, pki.client_key))
    with pytest.raises(TlsConfigError, match="needs its key"):
        channel_credentials(ClientTls(pki.ca, pki.client_cert))
    with pytest.raises(TlsConfigError, match="server key"):
        server_credentials(ServerTls(pki.server_cert, tmp_path / "missing.key"))

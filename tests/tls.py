"""A throw-away PKI for tests: a CA, a server certificate for loopback, client certificates.

Everything is generated with `cryptography` at test time (EC P-256 keys, so it takes
milliseconds); nothing is checked in. `rogue_*` is a client certificate from a second,
unrelated CA: a server that pins the real CA must refuse it.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class LoopbackPki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_ca: Path
    rogue_cert: Path
    rogue_key: Path


@dataclass(frozen=True)
class _Issued:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _validity(builder: x509.CertificateBuilder) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return builder.not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(
        now + datetime.timedelta(days=2)
    )


def _make_ca(common_name: str) -> _Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )
    return _Issued(_validity(builder).sign(key, hashes.SHA256()), key)


def _issue(ca: _Issued, common_name: str, *, server: bool) -> _Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    x509.IPAddress(ipaddress.ip_address("::1")),
                ]
            ),
            critical=False,
        )
    return _Issued(_validity(builder).sign(ca.key, hashes.SHA256()), key)


def _write(issued: _Issued, cert_path: Path, key_path: Path) -> None:
    cert_path.write_bytes(issued.cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        issued.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_path.chmod(0o600)


def write_test_pki(directory: Path, *, client_name: str = "verifier-a") -> LoopbackPki:
    """Write a CA, a loopback server certificate and client certificates under `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = _make_ca("veritap test CA")
    rogue_ca = _make_ca("veritap test CA")  # same name, different key: must still be refused
    pki = LoopbackPki(
        ca=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server.key",
        client_cert=directory / "client.pem",
        client_key=directory / "client.key",
        rogue_ca=directory / "rogue-ca.pem",
        rogue_cert=directory / "rogue.pem",
        rogue_key=directory / "rogue.key",
    )
    pki.ca.write_bytes(ca.cert.public_bytes(serialization.Encoding.PEM))
    pki.rogue_ca.write_bytes(rogue_ca.cert.public_bytes(serialization.Encoding.PEM))
    _write(_issue(ca, "localhost", server=True), pki.server_cert, pki.server_key)
    _write(_issue(ca, client_name, server=False), pki.client_cert, pki.client_key)
    _write(_issue(rogue_ca, client_name, server=False), pki.rogue_cert, pki.rogue_key)
    return pki

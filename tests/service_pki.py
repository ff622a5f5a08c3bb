"""Certificates for the VerifierService tests: one CA, the daemons' server certificate, an
operator's and an admin's client certificates, verifierd's own client certificate (for its
intake from collectors), and a rogue certificate naming the admin.

The admin role is bound to a certificate subject, so the admin's certificate comes from
the same CA as everyone else's and differs only in its subject (CN ``ops-admin``,
O ``veritap``). The rogue certificate has the admin's exact subject but is issued by a
CA verifierd does not trust: the TLS handshake refuses it. EC P-256, made in milliseconds
with `cryptography`; nothing is checked in.
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
from veritap.tls import ClientTls, ServerTls

OPERATOR_CN = "ops-operator"
#: verifierd's name towards collectors (its intake's client certificate and verifier_id).
VERIFIER_CN = "verifier-a"
ADMIN_CN = "ops-admin"
#: The admin's subject as gRPC reports it (RFC 4514, most specific first).
ADMIN_SUBJECT = f"CN={ADMIN_CN},O=veritap"


@dataclass(frozen=True)
class CertFiles:
    cert: Path
    key: Path


@dataclass(frozen=True)
class ServicePki:
    ca: Path
    server: CertFiles
    operator: CertFiles
    admin: CertFiles
    verifier: CertFiles
    rogue_admin: CertFiles

    def server_tls(self) -> ServerTls:
        return ServerTls(self.server.cert, self.server.key, self.ca)

    def client_tls(self, who: CertFiles) -> ClientTls:
        return ClientTls(ca=self.ca, cert=who.cert, key=who.key)


def _name(common_name: str, organization: str = "veritap") -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
    )


@dataclass(frozen=True)
class _Ca:
    name: x509.Name
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @classmethod
    def make(cls, common_name: str) -> _Ca:
        key = ec.generate_private_key(ec.SECP256R1())
        name = _name(common_name)
        cert = (
            _builder(name, name, key)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(key, hashes.SHA256())
        )
        return cls(name, key, cert)

    def issue(self, directory: Path, stem: str, common_name: str, *, server: bool) -> CertFiles:
        key = ec.generate_private_key(ec.SECP256R1())
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            _builder(_name(common_name), self.name, key)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
        files = CertFiles(directory / f"{stem}.pem", directory / f"{stem}.key")
        files.cert.write_bytes(
            builder.sign(self.key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)
        )
        files.key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        files.key.chmod(0o600)
        return files


def write_service_pki(directory: Path) -> ServicePki:
    directory.mkdir(parents=True, exist_ok=True)
    ca = _Ca.make("veritap ops CA")
    rogue = _Ca.make("veritap rogue CA")
    ca_path = directory / "ca.pem"
    ca_path.write_bytes(ca.cert.public_bytes(serialization.Encoding.PEM))
    return ServicePki(
        ca=ca_path,
        server=ca.issue(directory, "server", "localhost", server=True),
        operator=ca.issue(directory, "operator", OPERATOR_CN, server=False),
        admin=ca.issue(directory, "admin", ADMIN_CN, server=False),
        verifier=ca.issue(directory, "verifier", VERIFIER_CN, server=False),
        rogue_admin=rogue.issue(directory, "rogue-admin", ADMIN_CN, server=False),
    )

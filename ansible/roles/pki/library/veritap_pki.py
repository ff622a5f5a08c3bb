#!/usr/bin/python
"""Ansible module: veritap's PKI on the controller (run it with delegate_to: localhost).

Three kinds of object, each created once and then left alone while it is still good:

* ``ca``: an ECDSA P-256 certificate authority (``ca.key`` 0600, ``ca.pem``).
* ``certificate``: a key and a certificate issued by that CA for TLS
  (``certs/NAME.key`` 0600, ``certs/NAME.pem``); reissued when the CA, the
  subject alternative names or the usages changed, or it expires within
  ``renew_days``. The key is kept across reissues.
* ``signing_key``: a collector's Ed25519 log-signing key in the C2SP signed-note
  text forms that veritap.signing reads: ``signing/NAME.key`` holds
  ``PRIVATE+KEY+<origin>+<keyid>+<base64>`` (0600) and ``signing/NAME.vkey``
  the verifier key ``<origin>+<keyid>+<base64>`` the verifiers pin.

Needs the ``cryptography`` package, which ansible-core itself requires, so the
controller always has it.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import os
import tempfile
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DOCUMENTATION = r"""
module: veritap_pki
short_description: A CA, TLS certificates and Ed25519 signing keys for veritap, kept in a directory
options:
  kind:
    type: str
    choices: [ca, certificate, signing_key]
    required: true
  dir:
    description: The PKI directory on the controller.
    type: path
    required: true
  name:
    description: File name stem of a certificate or signing key.
    type: str
  common_name:
    description: Subject CN (the CA's name for kind=ca).
    type: str
  sans:
    description: DNS names and IP addresses the certificate is valid for.
    type: list
    elements: str
    default: []
  usages:
    description: Extended key usages.
    type: list
    elements: str
    choices: [server, client]
    default: [server, client]
  days:
    type: int
    default: 825
  renew_days:
    type: int
    default: 30
  origin:
    description: Key name of a signing key (the collector's log origin).
    type: str
"""

#: datetime.UTC is Python 3.11+; controllers of ansible-core 2.17 may run 3.10.
_UTC = datetime.timezone.utc  # noqa: UP017
#: C2SP signature-type byte of Ed25519 keys.
_ED25519 = b"\x01"
_EKU = {"server": ExtendedKeyUsageOID.SERVER_AUTH, "client": ExtendedKeyUsageOID.CLIENT_AUTH}


def _now() -> datetime.datetime:
    return datetime.datetime.now(_UTC)


def _write(path: str, data: bytes, mode: int) -> None:
    """Atomically replace `path` with `data` at `mode`."""
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def _new_ec_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: Any) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def ensure_ca(directory: str, common_name: str, days: int, check: bool) -> tuple[bool, str]:
    key_path = os.path.join(directory, "ca.key")
    pem_path = os.path.join(directory, "ca.pem")
    if _read(key_path) is not None and _read(pem_path) is not None:
        return False, pem_path
    if check:
        return True, pem_path
    key = _new_ec_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write(key_path, _key_pem(key), 0o600)
    _write(pem_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return True, pem_path


def _spki(public_key: Any) -> bytes:
    return public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _general_names(sans: list[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for san in sans:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(san)))
        except ValueError:
            names.append(x509.DNSName(san))
    return names


def _certificate_is_good(
    cert: x509.Certificate,
    *,
    key: Any,
    ca: x509.Certificate,
    sans: list[x509.GeneralName],
    usages: list[x509.ObjectIdentifier],
    renew_days: int,
) -> bool:
    # Written for old cryptography releases too (Debian 12 ships 38): no key
    # equality, no verify_directly_issued_by, no not_valid_after_utc there.
    if _spki(cert.public_key()) != _spki(key.public_key()) or cert.issuer != ca.subject:
        return False
    try:
        ca.public_key().verify(
            cert.signature,
            cert.tbs_certificate_bytes,
            ec.ECDSA(cert.signature_hash_algorithm),
        )
    except (ValueError, TypeError, InvalidSignature):
        return False
    expires = getattr(cert, "not_valid_after_utc", None)
    if expires is None:
        expires = cert.not_valid_after.replace(tzinfo=_UTC)
    if expires - _now() < datetime.timedelta(days=renew_days):
        return False
    extensions = {ext.oid: ext.value for ext in cert.extensions}
    have_sans = extensions.get(x509.SubjectAlternativeName.oid, [])
    have_eku = extensions.get(x509.ExtendedKeyUsage.oid, [])
    return set(have_sans) == set(sans) and set(have_eku) == set(usages)


def ensure_certificate(
    directory: str,
    name: str,
    *,
    common_name: str,
    sans: list[str],
    usages: list[str],
    days: int,
    renew_days: int,
    check: bool,
) -> tuple[bool, dict[str, str]]:
    ca_key_pem = _read(os.path.join(directory, "ca.key"))
    ca_pem = _read(os.path.join(directory, "ca.pem"))
    if ca_key_pem is None or ca_pem is None:
        raise ValueError(f"no CA in {directory}: run kind=ca first")
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    ca = x509.load_pem_x509_certificate(ca_pem)
    key_path = os.path.join(directory, "certs", f"{name}.key")
    pem_path = os.path.join(directory, "certs", f"{name}.pem")
    paths = {"key": key_path, "cert": pem_path}
    wanted_sans = _general_names(sans)
    wanted_usages = [_EKU[u] for u in usages]
    key_pem = _read(key_path)
    key = serialization.load_pem_private_key(key_pem, password=None) if key_pem else None
    cert_pem = _read(pem_path)
    if key is not None and cert_pem is not None:
        cert = x509.load_pem_x509_certificate(cert_pem)
        if _certificate_is_good(
            cert, key=key, ca=ca, sans=wanted_sans, usages=wanted_usages, renew_days=renew_days
        ):
            return False, paths
    if check:
        return True, paths
    if key is None:
        key = _new_ec_key()
        _write(key_path, _key_pem(key), 0o600)
    now = _now()
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(wanted_usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.public_key()),
            critical=False,
        )
    )
    if wanted_sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(wanted_sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    _write(pem_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return True, paths


def _c2sp_key_id(origin: str, public_key: bytes) -> str:
    return hashlib.sha256(origin.encode() + b"\n" + _ED25519 + public_key).digest()[:4].hex()


def _c2sp_seed(text: str, origin: str) -> bytes | None:
    """The seed of a ``PRIVATE+KEY+origin+id+b64`` string for `origin`, or None."""
    parts = text.strip().split("+", 4)  # base64 may hold "+"; the name may not
    if len(parts) != 5 or parts[:2] != ["PRIVATE", "KEY"] or parts[2] != origin:
        return None
    raw = base64.b64decode(parts[4])
    if len(raw) != 33 or raw[0] != 1:
        return None
    return raw[1:]


def ensure_signing_key(
    directory: str, name: str, origin: str, check: bool
) -> tuple[bool, dict[str, str]]:
    if not origin or "+" in origin or any(c.isspace() for c in origin):
        raise ValueError(f"origin {origin!r} is not a valid C2SP key name")
    key_path = os.path.join(directory, "signing", f"{name}.key")
    vkey_path = os.path.join(directory, "signing", f"{name}.vkey")
    paths = {"key": key_path, "vkey": vkey_path}
    existing = _read(key_path)
    seed = _c2sp_seed(existing.decode(), origin) if existing else None
    changed = seed is None
    if seed is None:
        seed = os.urandom(32)
    public = (
        Ed25519PrivateKey.from_private_bytes(seed)
        .public_key()
        .public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    )
    kid = _c2sp_key_id(origin, public)
    private_b64 = base64.b64encode(_ED25519 + seed).decode()
    public_b64 = base64.b64encode(_ED25519 + public).decode()
    private_text = f"PRIVATE+KEY+{origin}+{kid}+{private_b64}\n"
    public_text = f"{origin}+{kid}+{public_b64}\n"
    if _read(vkey_path) != public_text.encode():
        changed = True
    if changed and not check:
        _write(key_path, private_text.encode(), 0o600)
        _write(vkey_path, public_text.encode(), 0o644)
    return changed, {**paths, "verifier_key": public_text.strip()}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "kind": {
                "type": "str",
                "required": True,
                "choices": ["ca", "certificate", "signing_key"],
            },
            "dir": {"type": "path", "required": True},
            "name": {"type": "str"},
            "common_name": {"type": "str"},
            "sans": {"type": "list", "elements": "str", "default": []},
            "usages": {
                "type": "list",
                "elements": "str",
                "choices": ["server", "client"],
                "default": ["server", "client"],
            },
            "days": {"type": "int", "default": 825},
            "renew_days": {"type": "int", "default": 30},
            "origin": {"type": "str"},
        },
        required_if=[
            ("kind", "ca", ["common_name"]),
            ("kind", "certificate", ["name", "common_name"]),
            ("kind", "signing_key", ["name", "origin"]),
        ],
        supports_check_mode=True,
    )
    p = module.params
    check = module.check_mode
    try:
        if p["kind"] == "ca":
            changed, pem = ensure_ca(p["dir"], p["common_name"], p["days"], check)
            module.exit_json(changed=changed, cert=pem)
        elif p["kind"] == "certificate":
            changed, paths = ensure_certificate(
                p["dir"],
                p["name"],
                common_name=p["common_name"],
                sans=p["sans"],
                usages=p["usages"],
                days=p["days"],
                renew_days=p["renew_days"],
                check=check,
            )
            module.exit_json(changed=changed, **paths)
        else:
            changed, paths = ensure_signing_key(p["dir"], p["name"], p["origin"], check)
            module.exit_json(changed=changed, **paths)
    except (ValueError, OSError) as exc:
        module.fail_json(msg=str(exc))


if __name__ == "__main__":
    main()

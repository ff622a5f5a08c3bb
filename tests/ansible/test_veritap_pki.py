"""The pki role's module: a CA, certificates that do mutual TLS, C2SP signing keys."""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path

import pytest
from cryptography import x509
from veritap.signing import Signer, Verifier

from tests.ansible.module_runner import import_module, run_module


def pki(kind: str, directory: Path, **args: object) -> dict[str, object]:
    result = run_module("pki", "veritap_pki", {"kind": kind, "dir": str(directory), **args})
    assert not result.get("failed"), result
    return result


@pytest.fixture
def ca_dir(tmp_path: Path) -> Path:
    assert pki("ca", tmp_path, common_name="test CA")["changed"] is True
    assert pki("ca", tmp_path, common_name="test CA")["changed"] is False
    assert (tmp_path / "ca.key").stat().st_mode & 0o777 == 0o600
    return tmp_path


def test_certificates_are_kept_until_something_they_certify_changes(ca_dir: Path) -> None:
    args = {"name": "tap-01", "common_name": "tap-01", "sans": ["tap-01", "192.0.2.11"]}
    first = pki("certificate", ca_dir, **args)
    assert first["changed"] is True
    key_before = Path(str(first["key"])).read_bytes()
    assert pki("certificate", ca_dir, **args)["changed"] is False
    assert pki("certificate", ca_dir, **args, usages=["client"])["changed"] is True
    more = {**args, "sans": ["tap-01", "192.0.2.11", "tap-01.example"]}
    assert pki("certificate", ca_dir, **more)["changed"] is True
    assert pki("certificate", ca_dir, **more)["changed"] is False
    assert pki("certificate", ca_dir, **more, renew_days=10_000)["changed"] is True
    cert = x509.load_pem_x509_certificate(Path(str(first["cert"])).read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["tap-01", "tap-01.example"]
    assert Path(str(first["key"])).read_bytes() == key_before


def test_a_certificate_without_sans_is_stable(ca_dir: Path) -> None:
    args = {"name": "operator", "common_name": "veritap-operator", "usages": ["client"]}
    assert pki("certificate", ca_dir, **args)["changed"] is True
    assert pki("certificate", ca_dir, **args)["changed"] is False


def test_a_new_ca_reissues_every_certificate(ca_dir: Path) -> None:
    args = {"name": "v1", "common_name": "v1", "sans": ["v1"]}
    pki("certificate", ca_dir, **args)
    (ca_dir / "ca.key").unlink()
    pki("ca", ca_dir, common_name="test CA")
    assert pki("certificate", ca_dir, **args)["changed"] is True


def test_the_certificates_do_mutual_tls(ca_dir: Path) -> None:
    """A collector-side server and a verifier-side client, each with its issued pair."""
    server = pki("certificate", ca_dir, name="tap-01", common_name="tap-01", sans=["tap-01"])
    client = pki("certificate", ca_dir, name="v1", common_name="v1", sans=["v1"])
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=ca_dir / "ca.pem")
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    server_ctx.load_cert_chain(str(server["cert"]), str(server["key"]))
    client_ctx = ssl.create_default_context(cafile=ca_dir / "ca.pem")
    client_ctx.load_cert_chain(str(client["cert"]), str(client["key"]))
    left, right = socket.socketpair()
    peer: dict[str, object] = {}

    def serve() -> None:
        with server_ctx.wrap_socket(left, server_side=True) as tls:
            peer.update(tls.getpeercert() or {})
            tls.sendall(tls.recv(5))

    thread = threading.Thread(target=serve)
    thread.start()
    with client_ctx.wrap_socket(right, server_hostname="tap-01") as tls:
        tls.sendall(b"hello")
        assert tls.recv(5) == b"hello"
    thread.join(timeout=30)
    assert peer["subject"] == ((("commonName", "v1"),),)


def test_signing_keys_are_what_veritap_signing_reads(tmp_path: Path) -> None:
    origin = "veritap.example/tap-01"
    first = pki("signing_key", tmp_path, name="tap-01", origin=origin)
    assert first["changed"] is True
    signer = Signer.load(Path(str(first["key"])))
    verifier = Verifier.load(Path(str(first["vkey"])))
    assert signer.name == origin
    assert verifier.key_string() == signer.verifier().key_string() == first["verifier_key"]
    assert verifier.verify(b"checkpoint", signer.sign(b"checkpoint"))
    assert Path(str(first["key"])).stat().st_mode & 0o777 == 0o600
    again = pki("signing_key", tmp_path, name="tap-01", origin=origin)
    assert again["changed"] is False
    assert again["verifier_key"] == first["verifier_key"]


def test_many_signing_keys_round_trip(tmp_path: Path) -> None:
    """Base64 holds '+' about half the time: every key must still be kept, not remade."""
    module = import_module("pki", "veritap_pki")
    for i in range(40):
        origin = f"veritap.example/tap-{i:02d}"
        changed, first = module.ensure_signing_key(str(tmp_path), f"k{i}", origin, False)
        again_changed, again = module.ensure_signing_key(str(tmp_path), f"k{i}", origin, False)
        assert (changed, again_changed) == (True, False)
        assert again["verifier_key"] == first["verifier_key"]
        assert Signer.load(Path(first["key"])).verifier().key_string() == first["verifier_key"]


def test_bad_origin_is_refused(tmp_path: Path) -> None:
    result = run_module(
        "pki",
        "veritap_pki",
        {"kind": "signing_key", "dir": str(tmp_path), "name": "x", "origin": "has space"},
    )
    assert result.get("failed") is True

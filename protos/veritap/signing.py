"""Ed25519 keys in the C2SP signed-note encodings.

A key has a *name* (the log's origin, e.g. ``collector.example/edge-1``) and a
4-byte *key id*: SHA-256(name || 0x0A || 0x01 || 32-byte public key)[:4].

Text forms (the ones golang.org/x/mod/sumdb/note uses):

* verifier key: ``<name>+<8 hex digits of key id>+<base64(0x01 || public key)>``
* signer key:   ``PRIVATE+KEY+<name>+<8 hex digits>+<base64(0x01 || 32-byte seed)>``
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

ALG_ED25519 = 0x01
KEY_ID_SIZE = 4
SIGNATURE_SIZE = 64
_PRIVATE_PREFIX = "PRIVATE+KEY+"


class SigningError(Exception):
    """Base of the errors raised by this module."""


class KeyFormatError(SigningError):
    """A key string or key file is malformed."""


def check_key_name(name: str) -> None:
    """Raise KeyFormatError unless `name` is a valid C2SP key name."""
    if not name:
        raise KeyFormatError("key name is empty")
    if "+" in name or any(ch.isspace() for ch in name):
        raise KeyFormatError(f"key name {name!r} contains a space or '+'")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in name):
        raise KeyFormatError(f"key name {name!r} contains a control character")


def key_id(name: str, public_key: bytes) -> bytes:
    """C2SP key id of an Ed25519 key: SHA-256(name || 0x0A || 0x01 || key)[:4]."""
    digest = hashlib.sha256(name.encode() + b"\n" + bytes([ALG_ED25519]) + public_key).digest()
    return digest[:KEY_ID_SIZE]


def _public_bytes(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _decode_key_string(text: str, what: str) -> tuple[str, bytes, bytes]:
    """Split ``name+hexid+base64`` into (name, key id, raw key bytes after the type byte)."""
    # The name and the hex id hold no '+'; the base64 key may.
    parts = text.strip().split("+", 2)
    if len(parts) != 3:
        raise KeyFormatError(f"{what} is not of the form name+keyid+key")
    name, hex_id, b64 = parts
    check_key_name(name)
    if len(hex_id) != 2 * KEY_ID_SIZE:
        raise KeyFormatError(f"{what} key id {hex_id!r} is not 8 hex digits")
    try:
        kid = bytes.fromhex(hex_id)
        raw = base64.b64decode(b64, validate=True)
    except (ValueError, binascii.Error) as exc:
        raise KeyFormatError(f"{what} does not decode: {exc}") from exc
    if len(raw) != 33 or raw[0] != ALG_ED25519:
        raise KeyFormatError(f"{what} is not an Ed25519 key (type byte 0x01 and 32 bytes)")
    return name, kid, raw[1:]


class Verifier:
    """An Ed25519 public key with its C2SP name and key id."""

    __slots__ = ("_key", "key_id", "name", "public_key_bytes")

    def __init__(self, name: str, public_key: bytes) -> None:
        check_key_name(name)
        if len(public_key) != 32:
            raise KeyFormatError("an Ed25519 public key is 32 bytes")
        self.name = name
        self.public_key_bytes = public_key
        self.key_id = key_id(name, public_key)
        self._key = Ed25519PublicKey.from_public_bytes(public_key)

    @classmethod
    def parse(cls, text: str) -> Verifier:
        """Parse a verifier key string; the key id must match the name and key."""
        name, kid, pub = _decode_key_string(text, "verifier key")
        verifier = cls(name, pub)
        if verifier.key_id != kid:
            raise KeyFormatError(
                f"verifier key id {kid.hex()} does not match its name and key "
                f"(expected {verifier.key_id.hex()})"
            )
        return verifier

    @classmethod
    def load(cls, path: Path) -> Verifier:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise KeyFormatError(f"cannot read verifier key {path}: {exc}") from exc
        return cls.parse(text)

    def verify(self, message: bytes, signature: bytes) -> bool:
        """True when `signature` is this key's Ed25519 signature of `message`."""
        if len(signature) != SIGNATURE_SIZE:
            return False
        try:
            self._key.verify(signature, message)
        except InvalidSignature:
            return False
        return True

    def key_string(self) -> str:
        b64 = base64.b64encode(bytes([ALG_ED25519]) + self.public_key_bytes).decode()
        return f"{self.name}+{self.key_id.hex()}+{b64}"

    def __repr__(self) -> str:
        return f"Verifier({self.name!r}, key_id={self.key_id.hex()})"


class Signer:
    """An Ed25519 private key with its C2SP name and key id."""

    __slots__ = ("_key", "_seed", "key_id", "name", "public_key_bytes")

    def __init__(self, name: str, seed: bytes) -> None:
        check_key_name(name)
        if len(seed) != 32:
            raise KeyFormatError("an Ed25519 private key seed is 32 bytes")
        self.name = name
        self._seed = seed
        self._key = Ed25519PrivateKey.from_private_bytes(seed)
        self.public_key_bytes = _public_bytes(self._key.public_key())
        self.key_id = key_id(name, self.public_key_bytes)

    @classmethod
    def generate(cls, name: str) -> Signer:
        return cls(name, os.urandom(32))

    @classmethod
    def parse(cls, text: str) -> Signer:
        """Parse a ``PRIVATE+KEY+name+hexid+base64`` signer key string."""
        text = text.strip()
        if not text.startswith(_PRIVATE_PREFIX):
            raise KeyFormatError("signer key does not start with PRIVATE+KEY+")
        name, kid, seed = _decode_key_string(text[len(_PRIVATE_PREFIX) :], "signer key")
        signer = cls(name, seed)
        if signer.key_id != kid:
            raise KeyFormatError(
                f"signer key id {kid.hex()} does not match its name and key "
                f"(expected {signer.key_id.hex()})"
            )
        return signer

    @classmethod
    def load(cls, path: Path) -> Signer:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise KeyFormatError(f"cannot read signer key {path}: {exc}") from exc
        return cls.parse(text)

    def sign(self, message: bytes) -> bytes:
        return self._key.sign(message)

    def verifier(self) -> Verifier:
        return Verifier(self.name, self.public_key_bytes)

    def key_string(self) -> str:
        b64 = base64.b64encode(bytes([ALG_ED25519]) + self._seed).decode()
        return f"{_PRIVATE_PREFIX}{self.name}+{self.key_id.hex()}+{b64}"

    def save(self, path: Path) -> None:
        """Write the signer key string to a new file readable by its owner only (0600)."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(self.key_string() + "\n")
        os.chmod(path, 0o600)

    def __repr__(self) -> str:
        return f"Signer({self.name!r}, key_id={self.key_id.hex()})"

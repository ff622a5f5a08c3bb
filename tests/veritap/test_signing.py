"""veritap.signing: C2SP key ids and key strings, against the Go sumdb/note example key."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from veritap.signing import KeyFormatError, Signer, Verifier, key_id

# The example key of golang.org/x/mod/sumdb/note (its base64 holds a '+').
GO_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
GO_SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"


def test_reference_keys_parse_and_agree() -> None:
    verifier = Verifier.parse(GO_VKEY)
    signer = Signer.parse(GO_SKEY)
    assert verifier.name == "PeterNeumann"
    assert verifier.key_id.hex() == "c74f20a3"
    assert signer.key_id == verifier.key_id
    assert signer.public_key_bytes == verifier.public_key_bytes
    assert signer.verifier().key_string() == GO_VKEY
    assert signer.key_string() == GO_SKEY
    assert key_id("PeterNeumann", verifier.public_key_bytes).hex() == "c74f20a3"


def test_sign_and_verify() -> None:
    signer = Signer.generate("collector.test/edge")
    verifier = Verifier.parse(signer.verifier().key_string())
    signature = signer.sign(b"message")
    assert verifier.verify(b"message", signature)
    assert not verifier.verify(b"messagE", signature)
    assert not verifier.verify(b"message", signature[:-1])
    assert not Signer.generate("collector.test/edge").verifier().verify(b"message", signature)


def test_manglings_of_the_verifier_key_are_refused() -> None:
    # As the Go implementation's own test does: every substring and every one-character
    # change of a good key must fail to parse.
    for i in range(len(GO_VKEY)):
        for j in (i + 1, len(GO_VKEY)):
            if (i, j) != (0, len(GO_VKEY)):
                with pytest.raises(KeyFormatError):
                    Verifier.parse(GO_VKEY[i:j])
        changed = GO_VKEY[:i] + chr(ord(GO_VKEY[i]) + 1) + GO_VKEY[i + 1 :]
        with pytest.raises(KeyFormatError):
            Verifier.parse(changed)


@given(st.text(max_size=120))
def test_arbitrary_key_strings_fail_cleanly(text: str) -> None:
    for parse in (Verifier.parse, Signer.parse):
        try:
            parse(text)
        except KeyFormatError:
            continue


@pytest.mark.parametrize("name", ["", "a+b", "a b", "tab\there", "nl\n"])
def test_bad_key_names(name: str) -> None:
    with pytest.raises(KeyFormatError):
        Signer.generate(name)


def test_saved_key_is_owner_only_and_loads_back(tmp_path: Path) -> None:
    signer = Signer.generate("collector.test/edge")
    path = tmp_path / "key"
    old_umask = os.umask(0)
    try:
        signer.save(path)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert Signer.load(path).key_string() == signer.key_string()
    with pytest.raises(FileExistsError):
        signer.save(path)

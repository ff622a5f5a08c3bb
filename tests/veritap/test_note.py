"""veritap.note: C2SP signed notes and checkpoints, strict parsing, the Go reference note."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st
from veritap.note import (
    CheckpointBody,
    NoteFormatError,
    NoteSignatureError,
    open_checkpoint,
    open_note,
    parse_checkpoint,
    parse_note,
    sign_checkpoint,
    sign_note,
)
from veritap.signing import Signer, Verifier

GO_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
GO_SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
GO_TEXT = (
    "If you think cryptography is the answer to your problem,\n"
    "then you don't know what your problem is.\n"
)
GO_NOTE = (
    GO_TEXT + "\n"
    "\u2014 PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqd"
    "ngotpRZb6KE6RyyBwJnAM=\n"
).encode()

SIGNER = Signer.generate("collector.test/edge")
ROOT = bytes(range(32))


def test_go_reference_note_signs_and_opens_byte_for_byte() -> None:
    assert sign_note(GO_TEXT, [Signer.parse(GO_SKEY)]) == GO_NOTE
    note = open_note(GO_NOTE, [Verifier.parse(GO_VKEY)])
    assert note.text == GO_TEXT
    assert [(s.name, s.key_id.hex()) for s in note.signatures] == [("PeterNeumann", "c74f20a3")]


def test_checkpoint_round_trip() -> None:
    body = CheckpointBody("collector.test/edge", 1234, ROOT)
    note = sign_checkpoint(body, SIGNER)
    root = base64.b64encode(ROOT).decode()
    assert note.decode().startswith(
        f"collector.test/edge\n1234\n{root}\n\n\u2014 collector.test/edge "
    )
    assert open_checkpoint(note, SIGNER.verifier(), origin="collector.test/edge") == body
    with pytest.raises(NoteFormatError, match="origin"):
        open_checkpoint(note, SIGNER.verifier(), origin="other.test/log")


def test_unknown_keys_are_ignored_and_known_bad_signatures_reject() -> None:
    other = Signer.generate("other.test/witness")
    note = sign_note("hello\n", [other, SIGNER])
    assert [s.name for s in open_note(note, [SIGNER.verifier()]).signatures] == [SIGNER.name]
    with pytest.raises(NoteSignatureError, match="none of them trusted"):
        open_note(note, [Signer.generate("collector.test/edge").verifier()])
    tampered = note.replace(b"hello", b"jello")
    with pytest.raises(NoteSignatureError, match="does not verify"):
        open_note(tampered, [SIGNER.verifier()])


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"text\n", "blank line"),
        (b"text\n\n", "no signature lines"),
        (b"text\n\nno dash sig\n", "em dash"),
        ("text\n\n\u2014 name\n".encode(), "name signature"),
        ("text\n\n\u2014 name !!!!\n".encode(), "base64"),
        ("text\n\n\u2014 name AAAA\n".encode(), "too short"),
        ("text\n\n\u2014 a+b AAAAAAAA\n".encode(), "space or"),
        ("te\x01xt\n\n\u2014 name AAAAAAAA\n".encode(), "control"),
        ("text\n\n\u2014 name AAAAAAAA".encode(), "newline"),
        (b"\xff\n\n", "UTF-8"),
    ],
)
def test_malformed_notes_name_the_problem(data: bytes, reason: str) -> None:
    with pytest.raises(NoteFormatError, match=reason):
        parse_note(data)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("origin\n12\n", "needs origin"),
        ("\n12\n" + base64.b64encode(ROOT).decode() + "\n", "empty"),
        ("origin\n012\n" + base64.b64encode(ROOT).decode() + "\n", "leading zero"),
        ("origin\n-1\n" + base64.b64encode(ROOT).decode() + "\n", "decimal"),
        ("origin\n\u0661\n" + base64.b64encode(ROOT).decode() + "\n", "decimal"),
        ("origin\n1\n" + base64.b64encode(ROOT[:31]).decode() + "\n", "32 bytes"),
        ("origin\n1\n" + base64.b64encode(ROOT).decode() + "\n\n", "extension"),
        ("origin\n18446744073709551616\n" + base64.b64encode(ROOT).decode() + "\n", "64 bits"),
        ("origin\n1\n" + base64.b64encode(ROOT).decode(), "newline"),
    ],
)
def test_malformed_checkpoints_name_the_problem(text: str, reason: str) -> None:
    with pytest.raises(NoteFormatError, match=reason):
        parse_checkpoint(text)


@given(st.binary(max_size=300))
def test_arbitrary_bytes_parse_or_fail_cleanly(data: bytes) -> None:
    try:
        note = parse_note(data)
    except NoteFormatError:
        return
    assert note.text.endswith("\n")
    assert note.signatures


@given(
    st.text(
        st.characters(codec="utf-8", categories=("L", "N", "P", "S"), exclude_characters="+"),
        min_size=1,
        max_size=30,
    ),
    st.integers(0, 2**64 - 1),
    st.binary(min_size=32, max_size=32),
    st.lists(st.text(st.characters(codec="utf-8", min_codepoint=0x20), min_size=1), max_size=3),
)
def test_checkpoint_bodies_round_trip(
    origin: str, size: int, root: bytes, extensions: list[str]
) -> None:
    body = CheckpointBody(origin, size, root, tuple(extensions))
    assert parse_checkpoint(parse_note(sign_checkpoint(body, SIGNER)).text) == body

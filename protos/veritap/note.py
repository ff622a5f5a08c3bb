"""C2SP signed notes (c2sp.org/signed-note) and tlog checkpoints (c2sp.org/tlog-checkpoint).

A signed note is a UTF-8 text ending in a newline, a blank line, then one or
more signature lines ``— <key name> <base64(4-byte key id || signature)>``.
The signature covers the text including its final newline. A checkpoint is a
note whose text is ``<origin>\\n<tree size>\\n<base64 root hash>\\n`` followed
by optional extension lines.

Parsing is strict: anything the specifications do not allow is a
`NoteFormatError` naming what is wrong; a signature by a known key that does
not verify, or a note no known key signed, is a `NoteSignatureError`.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass

from veritap.signing import KEY_ID_SIZE, KeyFormatError, Signer, Verifier, check_key_name

MAX_NOTE_SIZE = 1 << 20
MAX_SIGNATURES = 100
_SIG_PREFIX = "\u2014 "
_HASH_SIZE = 32
_MAX_TREE_SIZE = (1 << 64) - 1


class NoteError(Exception):
    """Base of the errors raised by this module."""


class NoteFormatError(NoteError):
    """The bytes are not a well-formed signed note or checkpoint."""


class NoteSignatureError(NoteError):
    """No trusted key signed the note, or a trusted key's signature is bad."""


@dataclass(frozen=True)
class NoteSignature:
    name: str
    key_id: bytes
    # The algorithm's signature bytes, without the key id.
    signature: bytes


@dataclass(frozen=True)
class Note:
    # The signed text, including its final newline.
    text: str
    signatures: tuple[NoteSignature, ...]


@dataclass(frozen=True)
class CheckpointBody:
    origin: str
    tree_size: int
    root_hash: bytes
    extensions: tuple[str, ...] = ()


def _check_text_chars(text: str, what: str) -> None:
    for i, ch in enumerate(text):
        if ch != "\n" and ord(ch) < 0x20:
            raise NoteFormatError(f"{what} holds control character 0x{ord(ch):02x} at {i}")


def parse_note(data: bytes) -> Note:
    """Split a signed note into its text and signatures, checking the syntax only."""
    if len(data) > MAX_NOTE_SIZE:
        raise NoteFormatError(f"note is {len(data)} bytes, over the {MAX_NOTE_SIZE} limit")
    try:
        whole = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NoteFormatError(f"note is not valid UTF-8: {exc}") from exc
    _check_text_chars(whole, "note")
    if not whole.endswith("\n"):
        raise NoteFormatError("note does not end with a newline")
    split = whole.rfind("\n\n")
    if split < 0:
        raise NoteFormatError("note has no blank line before its signatures")
    text = whole[: split + 1]
    lines = whole[split + 2 :].split("\n")[:-1]
    if not lines:
        raise NoteFormatError("note has no signature lines")
    if len(lines) > MAX_SIGNATURES:
        raise NoteFormatError(f"note has {len(lines)} signatures, over {MAX_SIGNATURES}")
    signatures = []
    for number, line in enumerate(lines, 1):
        if not line.startswith(_SIG_PREFIX):
            raise NoteFormatError(f"signature line {number} does not start with an em dash")
        fields = line[len(_SIG_PREFIX) :].split(" ")
        if len(fields) != 2:
            raise NoteFormatError(f"signature line {number} is not '— name signature'")
        name, b64 = fields
        try:
            check_key_name(name)
        except KeyFormatError as exc:
            raise NoteFormatError(f"signature line {number}: {exc}") from exc
        try:
            raw = base64.b64decode(b64, validate=True)
        except (ValueError, binascii.Error) as exc:
            raise NoteFormatError(f"signature line {number} is not base64: {exc}") from exc
        if len(raw) <= KEY_ID_SIZE:
            raise NoteFormatError(f"signature line {number} is too short")
        signatures.append(NoteSignature(name, raw[:KEY_ID_SIZE], raw[KEY_ID_SIZE:]))
    return Note(text, tuple(signatures))


def sign_note(text: str, signers: Sequence[Signer]) -> bytes:
    """Sign `text` (ending in a newline, no blank line last) with every signer."""
    if not text.endswith("\n") or text.endswith("\n\n") or text == "\n":
        raise NoteFormatError("note text must be non-empty and end in exactly one newline")
    _check_text_chars(text, "note text")
    if not signers:
        raise NoteFormatError("a note needs at least one signer")
    message = text.encode()
    lines = []
    for signer in signers:
        sig = base64.b64encode(signer.key_id + signer.sign(message)).decode()
        lines.append(f"{_SIG_PREFIX}{signer.name} {sig}\n")
    return (text + "\n" + "".join(lines)).encode()


def open_note(data: bytes, verifiers: Sequence[Verifier]) -> Note:
    """Parse and verify a note: every signature by a known key must verify, and one must exist.

    Signatures whose (name, key id) match no verifier are ignored, as the
    specification requires. The returned note lists only the verified signatures.
    """
    note = parse_note(data)
    known = {(v.name, v.key_id): v for v in verifiers}
    message = note.text.encode()
    verified = []
    for sig in note.signatures:
        verifier = known.get((sig.name, sig.key_id))
        if verifier is None:
            continue
        if not verifier.verify(message, sig.signature):
            raise NoteSignatureError(
                f"signature by {sig.name} (key id {sig.key_id.hex()}) does not verify"
            )
        verified.append(sig)
    if not verified:
        names = ", ".join(f"{s.name}/{s.key_id.hex()}" for s in note.signatures)
        wanted = ", ".join(f"{v.name}/{v.key_id.hex()}" for v in verifiers)
        raise NoteSignatureError(f"note is signed by [{names}], none of them trusted [{wanted}]")
    return Note(note.text, tuple(verified))


def format_checkpoint(body: CheckpointBody) -> str:
    """The checkpoint note text for `body` (checked the way parse_checkpoint checks)."""
    text = f"{body.origin}\n{body.tree_size}\n{base64.b64encode(body.root_hash).decode()}\n"
    text += "".join(f"{line}\n" for line in body.extensions)
    if parse_checkpoint(text) != body:
        raise NoteFormatError("checkpoint fields do not survive formatting")
    return text


def parse_checkpoint(text: str) -> CheckpointBody:
    """Parse a checkpoint note text (the signed part, ending in a newline)."""
    if not text.endswith("\n"):
        raise NoteFormatError("checkpoint text does not end with a newline")
    lines = text[:-1].split("\n")
    if len(lines) < 3:
        raise NoteFormatError(f"checkpoint has {len(lines)} lines, needs origin, size and root")
    origin, size_text, root_text, *extensions = lines
    if not origin:
        raise NoteFormatError("checkpoint origin line is empty")
    if any(ch.isspace() for ch in origin):
        raise NoteFormatError(f"checkpoint origin {origin!r} contains a space")
    if not size_text.isascii() or not size_text.isdigit():
        raise NoteFormatError(f"checkpoint tree size {size_text!r} is not a decimal number")
    if size_text != "0" and size_text.startswith("0"):
        raise NoteFormatError(f"checkpoint tree size {size_text!r} has a leading zero")
    tree_size = int(size_text)
    if tree_size > _MAX_TREE_SIZE:
        raise NoteFormatError(f"checkpoint tree size {size_text} does not fit in 64 bits")
    try:
        root = base64.b64decode(root_text, validate=True)
    except (ValueError, binascii.Error) as exc:
        raise NoteFormatError(f"checkpoint root hash is not base64: {exc}") from exc
    if len(root) != _HASH_SIZE or base64.b64encode(root).decode() != root_text:
        raise NoteFormatError("checkpoint root hash is not 32 bytes in canonical base64")
    for number, line in enumerate(extensions, 4):
        if not line:
            raise NoteFormatError(f"checkpoint line {number} (an extension line) is empty")
    return CheckpointBody(origin, tree_size, root, tuple(extensions))


def sign_checkpoint(body: CheckpointBody, signer: Signer) -> bytes:
    return sign_note(format_checkpoint(body), [signer])


def open_checkpoint(
    data: bytes, verifier: Verifier, *, origin: str | None = None
) -> CheckpointBody:
    """Verify a signed checkpoint with `verifier` and parse it; check its origin when given."""
    note = open_note(data, [verifier])
    body = parse_checkpoint(note.text)
    if origin is not None and body.origin != origin:
        raise NoteFormatError(f"checkpoint origin is {body.origin!r}, expected {origin!r}")
    return body

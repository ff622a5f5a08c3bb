"""`collector keygen`: make the Ed25519 key that signs the log's checkpoints."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from veritap.signing import KeyFormatError, Signer


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "keygen",
        help="create a checkpoint signing key",
        description=(
            "Write a new Ed25519 signing key to OUT (mode 0600, C2SP signer-key form) and its "
            "public half to OUT.pub (C2SP verifier-key form: name+keyid+base64)."
        ),
    )
    parser.add_argument("--name", required=True, help="key name: the log's origin")
    parser.add_argument("--out", required=True, type=Path, help="private key file to create")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out: Path = args.out
    public = out.with_name(out.name + ".pub")
    try:
        signer = Signer.generate(args.name)
    except KeyFormatError as exc:
        print(f"collector keygen: {exc}", file=sys.stderr)
        return 2
    for path in (out, public):
        if path.exists():
            print(f"collector keygen: {path} exists; not overwriting it", file=sys.stderr)
            return 1
    try:
        signer.save(out)
        public.write_text(signer.verifier().key_string() + "\n", encoding="utf-8")
    except OSError as exc:
        print(f"collector keygen: {exc}", file=sys.stderr)
        return 1
    print(signer.verifier().key_string())
    return 0

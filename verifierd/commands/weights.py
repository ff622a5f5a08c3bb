"""`verifierd weights add|verify`: the content-addressed weights cache.

``add COMMITMENT MODEL_DIR`` copies a model's committed files into the cache,
checking every digest; ``verify`` checks every commitment of the configuration
against the cache (hashing only files whose size, times or inode changed since
their last check, or every file with ``--reverify``) and exits 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from verifierd.commitments import CommitmentRegistry, load_commitment
from verifierd.config import load_config
from verifierd.errors import VerifierdError
from verifierd.weights_cache import WeightsCache, WeightsError


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "weights", help="install or verify committed model files in the weights cache"
    )
    parser.add_argument("--config", type=Path, help="verifierd TOML file")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = actions.add_parser("add", help="copy a model's committed files into the cache")
    add.add_argument("commitment", type=Path, metavar="COMMITMENT")
    add.add_argument("model_dir", type=Path, metavar="MODEL_DIR")
    add.set_defaults(func=run_add)
    verify = actions.add_parser("verify", help="check every commitment's cached files")
    verify.add_argument("--reverify", action="store_true", help="hash every file again")
    verify.set_defaults(func=run_verify)


def run_add(args: argparse.Namespace) -> int:
    try:
        cache = WeightsCache(load_config(args.config).weights_dir)
        path = cache.install(load_commitment(args.commitment), args.model_dir)
    except (VerifierdError, OSError) as exc:
        sys.stderr.write(f"verifierd weights add: {exc}\n")
        return 2
    sys.stdout.write(f"{path}\n")
    return 0


def run_verify(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
        registry = CommitmentRegistry.from_dir(config.commitments_dir)
    except (VerifierdError, OSError) as exc:
        sys.stderr.write(f"verifierd weights verify: {exc}\n")
        return 2
    cache = WeightsCache(config.weights_dir)
    bad = 0
    for cid, commitment in sorted(registry.by_id.items()):
        names = ",".join(commitment.served_model_names)
        try:
            checked = cache.verify(commitment, reverify=args.reverify)
        except WeightsError as exc:
            bad += 1
            sys.stdout.write(f"{cid[:12]} {names}: {exc.reason}: {exc}\n")
            continue
        sys.stdout.write(
            f"{cid[:12]} {names}: ok ({checked.files_hashed} files, "
            f"{checked.bytes_hashed} bytes hashed)\n"
        )
    return 1 if bad else 0

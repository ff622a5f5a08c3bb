"""Reference logprobs computed on CPU: each ``--logprobs-mode`` by vLLM's own sampler steps,
and the chat ``logprobs`` a vLLM server would state from them.

The logits may come from any model (transformers on CPU, `model_logits`), so a
test can state honest values or another model's for the same tokens.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from verifierd.difr import SamplingSettings
from verifierd.evidence.logprobs import FLOOR, LogprobsClaim, claimed_logprobs


def mode_values(logits: torch.Tensor, mode: str, sampling: SamplingSettings) -> torch.Tensor:
    """What vLLM's sampler reports for float32 ``logits`` rows in ``mode``
    (vllm/v1/sample/sampler.py), the logits processors and penalties aside: its own
    temperature, min_p processor, top-k / top-p masks and log_softmax."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p
    from vllm.v1.sample.sampler import Sampler

    z = logits.to(torch.float32).clone()
    if mode == "raw_logprobs":
        return Sampler.compute_logprobs(z)
    if mode == "raw_logits":
        return z
    s = sampling.effective()
    if not s.is_greedy:
        rows = z.shape[0]
        z = Sampler.apply_temperature(z, torch.full((rows,), s.temperature), all_random=True)
        if s.min_p > 0:
            z = vllm_min_p(rows, s.min_p).apply(z)
        # vLLM's input batch takes a top_k of the vocabulary's size or more as none.
        on = 0 < s.top_k < z.shape[1]
        k = torch.full((rows,), s.top_k, dtype=torch.int32) if on else None
        p = torch.full((rows,), s.top_p) if s.top_p < 1 else None
        z = apply_top_k_top_p(z, k, p)
    return Sampler.compute_logprobs(z) if mode == "processed_logprobs" else z


def vllm_min_p(rows: int, min_p: float) -> Any:
    """vLLM's own MinPLogitsProcessor, holding ``rows`` requests of ``min_p``."""
    from types import SimpleNamespace

    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor.builtin import MinPLogitsProcessor
    from vllm.v1.sample.logits_processor.interface import BatchUpdate

    config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=rows))
    processor = MinPLogitsProcessor(config, torch.device("cpu"), False)  # type: ignore[arg-type]
    params = SamplingParams(temperature=1.0, min_p=min_p)
    added = [(i, params, None, []) for i in range(rows)]
    processor.update_state(BatchUpdate(batch_size=rows, removed=[], added=added, moved=[]))
    return processor


def model_logits(model_dir: Path, prompt: Sequence[int], output: Sequence[int]) -> torch.Tensor:
    """The float32 logits rows that predict each of ``output``'s tokens after ``prompt``,
    computed by transformers on CPU."""
    with torch.no_grad():
        logits = _model(model_dir)(torch.tensor([[*prompt, *output]])).logits[0]
    return logits[len(prompt) - 1 : len(prompt) - 1 + len(output)].to(torch.float32)


@functools.cache
def _model(model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def chat_claim(
    values: torch.Tensor, output: Sequence[int], top: int, tokenizer: Any
) -> LogprobsClaim:
    """The chat logprobs a vLLM server states for ``output`` from ``values`` (one row per
    output token): the sampled token first, then the most likely others, ``top`` in all,
    each clamped at -9999, read back as the verifier reads a captured response."""
    from vllm.tokenizers.detokenizer_utils import convert_ids_list_to_tokens

    content = []
    for row, token in zip(values, output, strict=True):
        ranked = [int(t) for t in torch.argsort(row, descending=True, stable=True)]
        listed = [token, *[t for t in ranked if t != token][: max(0, top - 1)]][:top]
        names = convert_ids_list_to_tokens(tokenizer, [token, *listed])
        entries = [_entry(n, float(row[t])) for n, t in zip(names, [token, *listed], strict=True)]
        content.append({**entries[0], "top_logprobs": entries[1:]})
    body = {"choices": [{"index": 0, "logprobs": {"content": content}}]}
    return claimed_logprobs("openai-chat", json.dumps(body).encode(), False, True)[0]


def _entry(name: str, value: float) -> dict[str, Any]:
    return {
        "token": name,
        "logprob": max(FLOOR, value),
        "bytes": list(name.encode("utf-8", "replace")),
    }

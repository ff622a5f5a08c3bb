"""Tiny random-weight Llama models built offline, for tests, benchmarks and the demo.

A model directory in the Hugging Face layout (config.json, generation_config.json,
model.safetensors, tokenizer.json, tokenizer_config.json with a chat template,
special_tokens_map.json) that vLLM and transformers load like any checkpoint.

- The tokenizer is a byte-level BPE trained with `tokenizers` on the running
  interpreter's standard-library sources (files taken in name order until about
  1 MB), so nothing is downloaded and the same Python builds the same tokenizer.
- The weights are drawn from ``numpy.random.default_rng(seed)`` in a fixed
  tensor order: the same spec gives the same bytes in every file.
- The logits width (``vocab_size`` in config.json) is padded past
  ``len(tokenizer)`` like real checkpoints, so code that sizes sampler noise by
  the tokenizer instead of the logits dimension is caught. The padded lm_head
  rows are zero, as in checkpoints whose padding was never trained.
- A ``Perturbation`` rewrites the decoder-layer weights the way a dishonest
  prover's deployment would differ: 8-bit or 4-bit weight quantization
  (round-trip through the integer grid) or additive Gaussian noise.
"""

from __future__ import annotations

import json
import logging
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt

from verifierd.errors import VerifierdError

log = logging.getLogger(__name__)

DTYPES = ("float32", "bfloat16", "float16")
PerturbKind = Literal["int8", "int4", "noise"]
PERTURB_KINDS: tuple[PerturbKind, ...] = ("int8", "int4", "noise")

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END, PAD)

#: ChatML-style template, written with explicit string pieces so that Jinja's
#: whitespace handling cannot change the prompt.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

#: Characters of standard-library source the tokenizer is trained on.
_CORPUS_CHARS = 1_000_000
#: Standard deviation of the logits the random lm_head produces (final RMSNorm
#: output has unit RMS): wide enough that temperature and top-p matter.
_LOGIT_STD = 2.0
#: Group size of the simulated 4-bit quantization (along the input dimension).
_INT4_GROUP = 32


class TinyModelError(VerifierdError):
    """A tiny-model spec is invalid or the model could not be written."""


@dataclass(frozen=True)
class Perturbation:
    """How a dishonest prover's weights differ from the committed ones.

    ``int8``: per-output-row symmetric absmax quantization to 8 bits.
    ``int4``: per-group (32 inputs) symmetric absmax quantization to 4 bits.
    ``noise``: add N(0, (noise_scale * std(W))^2) to every weight, drawn from ``seed``.
    """

    kind: PerturbKind
    noise_scale: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in PERTURB_KINDS:
            raise TinyModelError(f"unknown perturbation {self.kind!r}")
        if self.kind == "noise" and not self.noise_scale > 0:
            raise TinyModelError("noise perturbation needs noise_scale > 0")


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape, seed and dtype of a tiny Llama."""

    seed: int = 0
    #: Target size of the trained tokenizer (special tokens included).
    vocab_size: int = 2048
    #: The logits width is the next multiple of this strictly above len(tokenizer).
    pad_multiple: int = 128
    hidden_size: int = 128
    intermediate_size: int = 256
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    max_position_embeddings: int = 4096
    dtype: str = "float32"
    perturb: Perturbation | None = None
    #: Rows of lm_head beyond the tokenizer are zero, like untrained padding (their
    #: logits tie at 0). False draws them like the others, so that the whole logits
    #: width behaves as a vocabulary: for cost measurements at a real model's width.
    zero_padding: bool = True

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise TinyModelError(f"dtype must be one of {DTYPES}, not {self.dtype!r}")
        if self.seed < 0:
            raise TinyModelError("seed must be >= 0")
        if self.vocab_size < 300:
            raise TinyModelError("vocab_size must be >= 300 (256 bytes + merges + specials)")
        if self.pad_multiple < 1:
            raise TinyModelError("pad_multiple must be >= 1")
        if self.hidden_size % self.num_heads:
            raise TinyModelError("hidden_size must be a multiple of num_heads")
        if self.num_heads % self.num_kv_heads:
            raise TinyModelError("num_heads must be a multiple of num_kv_heads")
        if min(self.intermediate_size, self.num_layers, self.max_position_embeddings) < 1:
            raise TinyModelError("sizes must be positive")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass(frozen=True)
class TinyModel:
    """A built model directory."""

    path: Path
    #: len(tokenizer): the ids the tokenizer can produce.
    tokenizer_size: int
    #: The model's logits dimension (config vocab_size), > tokenizer_size.
    logits_width: int
    eos_token_id: int
    im_end_token_id: int


def build_tiny_model(out_dir: Path, spec: TinyModelSpec) -> TinyModel:
    """Write a tiny model for ``spec`` into ``out_dir`` (created; existing files replaced)."""
    model = write_model_files(out_dir, spec)
    write_weights(out_dir, spec, random_weights(spec, model.logits_width, model.tokenizer_size))
    log.info(
        "built tiny model",
        extra={"path": str(out_dir), "seed": spec.seed, "logits_width": model.logits_width},
    )
    return model


def write_model_files(out_dir: Path, spec: TinyModelSpec) -> TinyModel:
    """Write everything but the weights: the tokenizer, config.json (with ``spec.dtype``),
    generation_config.json, tokenizer_config.json and special_tokens_map.json."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer_json = train_tokenizer_json(spec.vocab_size)
    (out_dir / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    tokenizer_size, added = _tokenizer_ids(tokenizer_json)
    width = (tokenizer_size // spec.pad_multiple + 1) * spec.pad_multiple
    eos_id, im_end_id, pad_id = added[ENDOFTEXT], added[IM_END], added[PAD]

    _write_json(out_dir / "config.json", _config(spec, width, eos_id, pad_id))
    _write_json(
        out_dir / "generation_config.json",
        {"bos_token_id": eos_id, "eos_token_id": [eos_id, im_end_id], "pad_token_id": pad_id},
    )
    _write_json(out_dir / "tokenizer_config.json", _tokenizer_config(spec, added))
    _write_json(
        out_dir / "special_tokens_map.json",
        {"bos_token": ENDOFTEXT, "eos_token": ENDOFTEXT, "pad_token": PAD},
    )
    return TinyModel(
        path=out_dir,
        tokenizer_size=tokenizer_size,
        logits_width=width,
        eos_token_id=eos_id,
        im_end_token_id=im_end_id,
    )


def write_weights(
    out_dir: Path, spec: TinyModelSpec, weights: dict[str, npt.NDArray[np.float32]]
) -> None:
    """Write ``weights`` (float32) as model.safetensors in ``spec.dtype``, after applying
    ``spec.perturb`` if the spec has one."""
    if spec.perturb is not None:
        weights = perturb_weights(weights, spec.perturb)
    _save_safetensors(out_dir / "model.safetensors", weights, spec.dtype)


def read_tiny_model(model_dir: Path) -> TinyModel:
    """The ``TinyModel`` of a directory written by ``write_model_files``."""
    tokenizer_size, added = _tokenizer_ids((model_dir / "tokenizer.json").read_text("utf-8"))
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    return TinyModel(
        path=model_dir,
        tokenizer_size=tokenizer_size,
        logits_width=int(config["vocab_size"]),
        eos_token_id=added[ENDOFTEXT],
        im_end_token_id=added[IM_END],
    )


def _tokenizer_ids(tokenizer_json: str) -> tuple[int, dict[str, int]]:
    """len(tokenizer) and the ids of the added (special) tokens."""
    data = json.loads(tokenizer_json)
    added = {t["content"]: t["id"] for t in data["added_tokens"]}
    return max([*data["model"]["vocab"].values(), *added.values()]) + 1, added


def corpus_files() -> list[Path]:
    """Standard-library sources the tokenizer is trained on, in name order."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files: list[Path] = []
    total = 0
    for path in sorted(stdlib.glob("*.py")):
        files.append(path)
        total += path.stat().st_size
        if total >= _CORPUS_CHARS:
            break
    if not files:
        raise TinyModelError(f"no Python sources under {stdlib} to train a tokenizer on")
    return files


@lru_cache(maxsize=4)
def train_tokenizer_json(vocab_size: int) -> str:
    """Train the byte-level BPE tokenizer and return its tokenizer.json text (cached:
    training is deterministic for a given interpreter's standard library)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = [p.read_text(encoding="utf-8", errors="replace") for p in corpus_files()]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    text: str = tokenizer.to_str(pretty=True)
    return text


def random_weights(
    spec: TinyModelSpec, width: int, tokenizer_size: int
) -> dict[str, npt.NDArray[np.float32]]:
    """The model's float32 weights, drawn in a fixed order from ``default_rng(spec.seed)``."""
    rng = np.random.default_rng(spec.seed)
    h, inter, hd = spec.hidden_size, spec.intermediate_size, spec.head_dim
    q_out, kv_out = spec.num_heads * hd, spec.num_kv_heads * hd

    def normal(shape: tuple[int, int], std: float) -> npt.NDArray[np.float32]:
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(std)

    weights: dict[str, npt.NDArray[np.float32]] = {}
    weights["model.embed_tokens.weight"] = normal((width, h), 1.0)
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        weights[p + "self_attn.q_proj.weight"] = normal((q_out, h), h**-0.5)
        weights[p + "self_attn.k_proj.weight"] = normal((kv_out, h), h**-0.5)
        weights[p + "self_attn.v_proj.weight"] = normal((kv_out, h), h**-0.5)
        weights[p + "self_attn.o_proj.weight"] = normal((h, q_out), q_out**-0.5)
        weights[p + "mlp.gate_proj.weight"] = normal((inter, h), h**-0.5)
        weights[p + "mlp.up_proj.weight"] = normal((inter, h), h**-0.5)
        weights[p + "mlp.down_proj.weight"] = normal((h, inter), inter**-0.5)
        weights[p + "input_layernorm.weight"] = np.ones(h, dtype=np.float32)
        weights[p + "post_attention_layernorm.weight"] = np.ones(h, dtype=np.float32)
    weights["model.norm.weight"] = np.ones(h, dtype=np.float32)
    lm_head = normal((width, h), _LOGIT_STD * h**-0.5)
    if spec.zero_padding:
        lm_head[tokenizer_size:] = 0.0
    weights["lm_head.weight"] = lm_head
    return weights


def perturb_weights(
    weights: dict[str, npt.NDArray[np.float32]], perturb: Perturbation
) -> dict[str, npt.NDArray[np.float32]]:
    """Apply ``perturb`` to the decoder layers' projection matrices (not norms, embeddings
    or lm_head, which quantized deployments usually keep in high precision)."""
    rng = np.random.default_rng(perturb.seed)
    out: dict[str, npt.NDArray[np.float32]] = {}
    for name, w in weights.items():
        if not (name.startswith("model.layers.") and w.ndim == 2):
            out[name] = w
        elif perturb.kind == "int8":
            out[name] = _quantize(w, levels=127, group=w.shape[1])
        elif perturb.kind == "int4":
            out[name] = _quantize(w, levels=7, group=_INT4_GROUP)
        else:
            std = np.float32(perturb.noise_scale * float(w.std()))
            out[name] = w + rng.standard_normal(w.shape, dtype=np.float32) * std
    return out


def _quantize(w: npt.NDArray[np.float32], levels: int, group: int) -> npt.NDArray[np.float32]:
    """Symmetric absmax round trip through {-levels-1, ..., levels} per group of inputs."""
    rows, cols = w.shape
    if cols % group:
        raise TinyModelError(f"quantization group {group} does not divide {cols} columns")
    g = w.reshape(rows, cols // group, group)
    scale = np.abs(g).max(axis=2, keepdims=True) / np.float32(levels)
    scale[scale == 0] = 1.0
    q = np.clip(np.rint(g / scale), -levels - 1, levels)
    out: npt.NDArray[np.float32] = (q * scale).astype(np.float32).reshape(rows, cols)
    return out


def _config(spec: TinyModelSpec, width: int, eos_id: int, pad_id: int) -> dict[str, object]:
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=width,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        rms_norm_eps=1e-5,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        tie_word_embeddings=False,
        dtype=spec.dtype,
    )
    config.architectures = ["LlamaForCausalLM"]
    data: dict[str, object] = config.to_dict()
    return data


def _tokenizer_config(spec: TinyModelSpec, added: dict[str, int]) -> dict[str, object]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": ENDOFTEXT,
        "pad_token": PAD,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": spec.max_position_embeddings,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {
            str(i): {
                "content": tok,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for tok, i in sorted(added.items(), key=lambda kv: kv[1])
        },
    }


def _write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _save_safetensors(path: Path, weights: dict[str, npt.NDArray[np.float32]], dtype: str) -> None:
    import torch
    from safetensors.torch import save_file

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    tensors = {
        name: torch.from_numpy(w).to(torch_dtype[dtype]).contiguous()
        for name, w in sorted(weights.items())
    }
    save_file(tensors, str(path), metadata={"format": "pt"})

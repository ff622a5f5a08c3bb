"""Training a tiny Llama on the corpus token stream, reproducibly on CPU.

Reproducible means: the same recipe, interpreter, library versions and CPU
instruction set give bit-identical weights. Everything random is drawn from
numpy generators seeded by the spec (the initial weights are the random tiny
model's, ``verifierd.tiny_model.random_weights``; the training windows come from
``default_rng(seed)``), torch runs with deterministic algorithms and a fixed
thread count (the recipe's: float reductions split differently across other
thread counts), and there is no dropout. The process's torch settings are
restored afterwards.

The loop: AdamW (betas 0.9/0.95, no weight decay), linear warm-up then cosine
decay to a tenth of the peak learning rate, gradients clipped to norm 1, each
step on ``batch_size`` windows of ``seq_len + 1`` tokens drawn uniformly from the
stream. The softmax spans the whole logits width, so the padding rows of lm_head
(never a target) are pushed down as in checkpoints trained with a padded vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from verifierd.tiny_model import TinyModelError, TinyModelSpec

#: Gradients are clipped to this global norm.
_CLIP_NORM = 1.0
#: The learning rate decays to this fraction of its peak.
_FINAL_LR_FRACTION = 0.1


class TrainingError(TinyModelError):
    """A training recipe is invalid."""


@dataclass(frozen=True)
class TrainingRecipe:
    """What a trained tiny model is: its spec (shape, seed, written dtype and
    perturbation) and how long and how it is trained.

    The defaults train the default spec's shape on about 2.4 M tokens (five passes
    over the corpus): about two minutes on two idle cores.
    """

    spec: TinyModelSpec = field(default_factory=TinyModelSpec)
    steps: int = 300
    batch_size: int = 16
    seq_len: int = 512
    learning_rate: float = 2e-2
    #: The first ``round(steps * warmup_fraction)`` steps ramp the learning rate up.
    warmup_fraction: float = 0.1
    #: torch's intra-op thread count while training; part of the recipe because
    #: the weights' last bits depend on it.
    threads: int = 2

    def __post_init__(self) -> None:
        if min(self.steps, self.batch_size, self.seq_len, self.threads) < 1:
            raise TrainingError("steps, batch_size, seq_len and threads must be >= 1")
        if not 0 <= self.warmup_fraction < 1:
            raise TrainingError("warmup_fraction must be in [0, 1)")
        if not self.learning_rate > 0:
            raise TrainingError("learning_rate must be > 0")
        if self.seq_len >= self.spec.max_position_embeddings:
            raise TrainingError("seq_len must be below the spec's max_position_embeddings")

    def honest_base(self) -> TrainingRecipe:
        """The recipe whose weights this one writes: float32 and unperturbed (what is
        trained; other dtypes and perturbations are derived from it)."""
        honest = TinyModelSpec(**{**self.spec.__dict__, "dtype": "float32", "perturb": None})
        return TrainingRecipe(**{**self.__dict__, "spec": honest})


@dataclass(frozen=True)
class TrainingRun:
    """The trained float32 weights and the loss of every step."""

    weights: dict[str, npt.NDArray[np.float32]]
    losses: tuple[float, ...]


def lr_factor(step: int, recipe: TrainingRecipe) -> float:
    """The learning rate at ``step`` as a fraction of the peak."""
    warmup = round(recipe.steps * recipe.warmup_fraction)
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(recipe.steps - warmup, 1)
    cosine = 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    return _FINAL_LR_FRACTION + (1 - _FINAL_LR_FRACTION) * cosine


def train_weights(
    recipe: TrainingRecipe,
    model_dir: Path,
    initial: dict[str, npt.NDArray[np.float32]],
    tokens: npt.NDArray[np.int64],
) -> TrainingRun:
    """Train the Llama that ``model_dir/config.json`` describes from ``initial`` on
    ``tokens`` for ``recipe.steps`` steps."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if len(tokens) <= recipe.seq_len + 1:
        raise TrainingError(f"{len(tokens)} tokens are too few for windows of {recipe.seq_len}")
    with _deterministic_torch(recipe.threads):
        config = LlamaConfig.from_pretrained(model_dir, attn_implementation="sdpa")
        with torch.random.fork_rng(devices=[]):
            net = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
        net.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in initial.items()})
        net.train()
        optimizer = torch.optim.AdamW(
            net.parameters(), lr=recipe.learning_rate, betas=(0.9, 0.95), weight_decay=0.0
        )
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: lr_factor(step, recipe)
        )
        stream = torch.from_numpy(tokens)
        offsets = torch.arange(recipe.seq_len + 1)
        rng = np.random.default_rng(recipe.spec.seed)
        losses: list[float] = []
        for _ in range(recipe.steps):
            starts = rng.integers(0, len(tokens) - recipe.seq_len - 1, size=recipe.batch_size)
            batch = stream[torch.from_numpy(starts)[:, None] + offsets]
            logits = net(input_ids=batch[:, :-1]).logits
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1)
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            torch.nn.utils.clip_grad_norm_(net.parameters(), _CLIP_NORM)
            optimizer.step()
            schedule.step()
            losses.append(float(loss.detach()))
        weights = {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}
    return TrainingRun(weights=weights, losses=tuple(losses))


@contextmanager
def _deterministic_torch(threads: int) -> Iterator[None]:
    import torch

    threads_before = torch.get_num_threads()
    deterministic_before = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(threads_before)
        torch.use_deterministic_algorithms(deterministic_before)

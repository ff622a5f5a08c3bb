"""vLLM's request-specific logit adjustments, replayed on the verifier's raw logits.

A structured-output request first has its grammar mask applied: vLLM's runner
(vllm/v1/structured_output/utils.py ``apply_grammar_bitmask``) sets every token
the grammar does not allow after the output so far to -inf with xgrammar's
``apply_token_bitmask_inplace``, before the sampler. The mask depends on the
output prefix only, so `AdjustmentPlan` takes it from `TokenMasks`
(verifierd.engine.grammar rebuilds it); -inf stays -inf through every step below.

Then, before temperature, min_p, top-k/top-p and the noise, vLLM 0.32's V1 sampler
(vllm/v1/sample/sampler.py ``Sampler.apply_logits_processors``) changes the
float32 logits row of a request that asks for it, in this order:

1. ``allowed_token_ids``: every other id becomes -inf (``masked_fill_``).
2. ``bad_words`` (token sequences, vllm/v1/sample/ops/bad_words.py): the last id of
   a sequence becomes -inf when the output so far ends with the rest of it (a
   one-token bad word always); only output tokens count, never the prompt.
3. Logits processors that can change the argmax (logits_processor/builtin.py):
   ``min_tokens`` sets every stop id (the request's ``stop_token_ids``, the
   tokenizer's EOS and the generation config's EOS ids: ``all_stop_token_ids``)
   to -inf while fewer than ``min_tokens`` tokens were output; ``logit_bias``
   adds float32(bias) (vLLM clamps it to [-100, 100]). Their order does not
   matter: -inf + bias is -inf.
4. Penalties (model_executor/layers/utils.py ``apply_penalties``), with c the
   count of a token among the output tokens so far:
   repetition, for tokens in the prompt or the output so far: x * (1/r) if x > 0
   else x * r, with 1/r rounded to float32 (the torch path vLLM takes on the
   CPU, and the V2 runner's Triton kernel); V1's CUDA kernel divides, x / r;
   then x -= float32(f) * c (frequency) and x -= float32(p) * [c > 0] (presence).

Tokens a step does not touch keep their value (vLLM computes x * 1.0, x - 0.0,
which can only turn -0.0 into +0.0: no comparison, sum or exp downstream can
tell). So `AdjustmentPlan` works on the columns of the tokens that occur, not
the whole vocabulary: the distinct ids of prompt and output, with per-row
counts as a cumulative sum over the output positions of a chunk. Rows are
output positions: row t predicts output token t from output tokens [0, t).

The verifier's logits come from one prefill over prompt + output (the engine's
``compute_logits`` on hidden states, verifierd.engine.worker_extension): raw
logits, before every step above, so all of them are re-applied here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import torch

from verifierd.errors import VerifierdError
from verifierd.structured_outputs import StructuredOutput, StructuredOutputError

#: vLLM clamps each logit_bias value to this magnitude (SamplingParams.from_optional).
MAX_LOGIT_BIAS = 100.0
#: vLLM's accepted range of presence and frequency penalties.
MAX_ADDITIVE_PENALTY = 2.0


class LogitAdjustmentError(VerifierdError):
    """Adjustments vLLM would have refused, or inputs that do not fit them."""


class TokenMasks(Protocol):
    """Per-position masks of allowed tokens that depend on the output prefix only."""

    def fill(self, x: torch.Tensor, start: int, output: npt.NDArray[np.int64]) -> None:
        """Set the disallowed logits of output rows [start, start + len(x)) of the
        output ``output`` to -inf, in place."""


class RepetitionArithmetic(StrEnum):
    """How the prover's engine divided a positive logit by the repetition penalty."""

    #: x * float32(1 / r): vLLM's torch path (every CPU) and Model Runner V2's kernel.
    RECIPROCAL = "reciprocal"
    #: x / r: vLLM V1's CUDA kernel (``apply_repetition_penalties_``).
    DIVIDE = "divide"


def repetition_arithmetic(device: torch.device, profile: str) -> RepetitionArithmetic:
    """The arithmetic of the prover's engine, inferred from the verifier's device (the
    verifier runs on the prover's kind of device) and the sampler profile's runner."""
    if device.type == "cuda" and not profile.startswith("vllm-v2"):
        return RepetitionArithmetic.DIVIDE
    return RepetitionArithmetic.RECIPROCAL


@dataclass(frozen=True)
class LogitAdjustments:
    """The logit-changing parameters of one request, as vLLM's SamplingParams holds them.

    ``bad_words`` are strings: the engine tokenizes them (with and without a
    leading space, as vLLM does); ``stop_token_ids`` are the request's own, to
    which the engine adds the model's EOS ids for ``min_tokens``.
    """

    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    #: (token id, bias) sorted by id, biases already clamped to [-100, 100].
    logit_bias: tuple[tuple[int, float], ...] = ()
    #: Empty: every token is allowed.
    allowed_token_ids: tuple[int, ...] = ()
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    bad_words: tuple[str, ...] = ()
    #: The request's grammar constraint (None: none).
    structured_output: StructuredOutput | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise LogitAdjustmentError(
                f"repetition_penalty must be finite and > 0, not {self.repetition_penalty}"
            )
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if not -MAX_ADDITIVE_PENALTY <= value <= MAX_ADDITIVE_PENALTY:
                raise LogitAdjustmentError(f"{name} must be in [-2, 2], not {value}")
        if self.min_tokens < 0:
            raise LogitAdjustmentError(f"min_tokens must be >= 0, not {self.min_tokens}")
        ids = [i for i, _ in self.logit_bias]
        if ids != sorted(set(ids)):
            raise LogitAdjustmentError("logit_bias ids must be sorted and distinct")
        if any(not -MAX_LOGIT_BIAS <= b <= MAX_LOGIT_BIAS for _, b in self.logit_bias):
            raise LogitAdjustmentError("logit_bias values must be in [-100, 100]")
        if min(self.token_ids(), default=0) < 0:
            raise LogitAdjustmentError("token ids must be >= 0")
        if any(not word for word in self.bad_words):
            raise LogitAdjustmentError("bad_words cannot contain an empty string")

    @classmethod
    def from_request(
        cls,
        *,
        repetition_penalty: float = 1.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        logit_bias: Mapping[int, float] | None = None,
        allowed_token_ids: Sequence[int] | None = None,
        min_tokens: int = 0,
        stop_token_ids: Sequence[int] = (),
        bad_words: Sequence[str] = (),
        structured_output: StructuredOutput | None = None,
    ) -> LogitAdjustments:
        """Normalised as vLLM's SamplingParams does: logit_bias clamped to [-100, 100],
        duplicate stop ids and bad words dropped (first kept)."""
        return cls(
            repetition_penalty=float(repetition_penalty),
            frequency_penalty=float(frequency_penalty),
            presence_penalty=float(presence_penalty),
            logit_bias=tuple(
                (int(i), min(MAX_LOGIT_BIAS, max(-MAX_LOGIT_BIAS, float(b))))
                for i, b in sorted((logit_bias or {}).items())
            ),
            allowed_token_ids=tuple(int(i) for i in allowed_token_ids or ()),
            min_tokens=int(min_tokens),
            stop_token_ids=tuple(dict.fromkeys(int(i) for i in stop_token_ids)),
            bad_words=tuple(dict.fromkeys(bad_words)),
            structured_output=structured_output,
        )

    @property
    def has_penalties(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
        )

    @property
    def is_neutral(self) -> bool:
        """Whether vLLM leaves the logits as they are (nothing to re-apply)."""
        return not (
            self.has_penalties
            or self.logit_bias
            or self.allowed_token_ids
            or self.min_tokens
            or self.bad_words
            or self.structured_output is not None
        )

    def token_ids(self) -> tuple[int, ...]:
        """Every token id these adjustments name (all must be logits columns)."""
        return (
            *(i for i, _ in self.logit_bias),
            *self.allowed_token_ids,
            *self.stop_token_ids,
        )

    def to_json(self) -> dict[str, object]:
        """Plain JSON-like values (for SamplingParams.extra_args); `from_json` inverts it."""
        return {
            "repetition_penalty": self.repetition_penalty,
            "frequency_penalty": self.frequency_penalty,
            "presence_penalty": self.presence_penalty,
            "logit_bias": [[i, b] for i, b in self.logit_bias],
            "allowed_token_ids": list(self.allowed_token_ids),
            "min_tokens": self.min_tokens,
            "stop_token_ids": list(self.stop_token_ids),
            "bad_words": list(self.bad_words),
            "structured_output": (
                None if self.structured_output is None else self.structured_output.to_json()
            ),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LogitAdjustments:
        """Raises LogitAdjustmentError on a malformed value."""
        try:
            structured = data.get("structured_output")
            return cls(
                repetition_penalty=float(data["repetition_penalty"]),
                frequency_penalty=float(data["frequency_penalty"]),
                presence_penalty=float(data["presence_penalty"]),
                logit_bias=tuple((int(i), float(b)) for i, b in data["logit_bias"]),
                allowed_token_ids=tuple(int(i) for i in data["allowed_token_ids"]),
                min_tokens=int(data["min_tokens"]),
                stop_token_ids=tuple(int(i) for i in data["stop_token_ids"]),
                bad_words=tuple(str(w) for w in data["bad_words"]),
                structured_output=(
                    None if structured is None else StructuredOutput.from_json(structured)
                ),
            )
        except (KeyError, TypeError, ValueError, StructuredOutputError) as exc:
            raise LogitAdjustmentError(f"bad logit adjustments: {exc!r}") from exc


NEUTRAL = LogitAdjustments()


class AdjustmentPlan:
    """The adjustments of one response, ready to apply to any range of its rows.

    ``stop_token_ids`` (what ``min_tokens`` masks) and ``bad_words_token_ids`` are
    the engine's resolution of the request's values (SamplingParams'
    ``all_stop_token_ids`` and ``bad_words_token_ids``); they are needed only
    when the adjustments use min_tokens or bad words. ``token_masks`` is the
    grammar's (required when the adjustments have a structured output).
    """

    def __init__(
        self,
        adjustments: LogitAdjustments,
        prompt_ids: Sequence[int] | npt.NDArray[np.int64],
        output_ids: Sequence[int] | npt.NDArray[np.int64],
        width: int,
        device: torch.device,
        *,
        stop_token_ids: Sequence[int] = (),
        bad_words_token_ids: Sequence[Sequence[int]] = (),
        arithmetic: RepetitionArithmetic = RepetitionArithmetic.RECIPROCAL,
        token_masks: TokenMasks | None = None,
    ) -> None:
        self.adjustments = a = adjustments
        if (a.structured_output is None) != (token_masks is None):
            raise LogitAdjustmentError("token masks go with a structured output, and only then")
        self._token_masks = token_masks
        self.width = width
        self.device = device
        self.arithmetic = arithmetic
        prompt = np.asarray(prompt_ids, dtype=np.int64).reshape(-1)
        output = np.asarray(output_ids, dtype=np.int64).reshape(-1)
        self.n_out = int(output.size)
        self._output = output
        stop = np.unique(np.asarray(stop_token_ids, dtype=np.int64))
        named = np.concatenate([prompt, output, stop, np.asarray(a.token_ids(), dtype=np.int64)])
        if named.size and (named.min() < 0 or named.max() >= width):
            raise LogitAdjustmentError(f"a token id is outside the {width} logits")

        def on_device(values: npt.NDArray[np.generic] | Sequence[float]) -> torch.Tensor:
            return torch.as_tensor(np.asarray(values)).to(device)

        self._disallowed: torch.Tensor | None = None
        if a.allowed_token_ids:
            disallowed = torch.ones(width, dtype=torch.bool)
            disallowed[list(a.allowed_token_ids)] = False
            self._disallowed = disallowed.to(device)
        self._bad_rows, self._bad_tokens = _bad_word_hits(output, bad_words_token_ids, width)
        self._stop = on_device(stop)
        self._bias_ids = on_device(np.asarray([i for i, _ in a.logit_bias], dtype=np.int64))
        self._bias = on_device(np.asarray([b for _, b in a.logit_bias], dtype=np.float32))
        self._repetition = torch.tensor(a.repetition_penalty, dtype=torch.float32, device=device)
        self._frequency = torch.tensor(a.frequency_penalty, dtype=torch.float32, device=device)
        self._presence = torch.tensor(a.presence_penalty, dtype=torch.float32, device=device)
        # Columns that penalties can touch: tokens of the output, and of the prompt
        # when the repetition penalty is on.
        seen = np.concatenate([prompt, output]) if a.repetition_penalty != 1.0 else output
        columns = np.unique(seen) if a.has_penalties else np.zeros(0, dtype=np.int64)
        self._columns = on_device(columns)
        self._in_prompt = on_device(np.isin(columns, prompt))
        self._output_columns = np.searchsorted(columns, output)
        self._output_columns_device = on_device(self._output_columns)

    def apply(self, z: torch.Tensor, start: int) -> torch.Tensor:
        """Adjusted float32 logits of output positions [start, start + len(z)) from raw
        logits ``z`` [n, width] (``z`` itself when there is nothing to do)."""
        n = z.shape[0]
        if z.ndim != 2 or z.shape[1] != self.width or not 0 <= start <= start + n <= self.n_out:
            raise LogitAdjustmentError(
                f"rows {start}..{start + n} of {self.n_out} with logits {tuple(z.shape)}"
            )
        a = self.adjustments
        if a.is_neutral or n == 0:
            return z
        x = z.to(device=self.device, dtype=torch.float32, copy=True)
        if self._token_masks is not None:
            self._token_masks.fill(x, start, self._output)
        if self._disallowed is not None:
            x.masked_fill_(self._disallowed, -math.inf)
        hit = (self._bad_rows >= start) & (self._bad_rows < start + n)
        if hit.any():
            rows = torch.from_numpy(self._bad_rows[hit] - start).to(self.device)
            x[rows, torch.from_numpy(self._bad_tokens[hit]).to(self.device)] = -math.inf
        masked_rows = min(max(a.min_tokens - start, 0), n)
        if masked_rows and self._stop.numel():
            x[:masked_rows, self._stop] = -math.inf
        if self._bias_ids.numel():
            x[:, self._bias_ids] += self._bias
        if self._columns.numel():
            x[:, self._columns] = self._penalised(x[:, self._columns], start, n)
        return x

    def _penalised(self, g: torch.Tensor, start: int, n: int) -> torch.Tensor:
        """Penalties on the occurring tokens' columns ``g`` [n, columns] of rows
        [start, start + n)."""
        a = self.adjustments
        counts = self._counts(start, n)
        seen = counts > 0
        if a.repetition_penalty != 1.0:
            repeated = seen | self._in_prompt
            r = self._repetition
            if self.arithmetic is RepetitionArithmetic.DIVIDE:
                g = torch.where(repeated, torch.where(g > 0, g / r, g * r), g)
            else:
                penalties = torch.where(repeated, r, 1.0)
                g = g * torch.where(g > 0, 1.0 / penalties, penalties)
        if a.frequency_penalty != 0.0:
            g = g - self._frequency * counts
        if a.presence_penalty != 0.0:
            g = g - self._presence * seen
        return g

    def _counts(self, start: int, n: int) -> torch.Tensor:
        """int32 [n, columns]: occurrences of each column's token in output[0:t] for
        t = start .. start + n - 1 (a cumulative sum over the chunk's positions)."""
        width = int(self._columns.numel())
        steps = torch.zeros((n, width), dtype=torch.int32, device=self.device)
        steps[0] = torch.from_numpy(np.bincount(self._output_columns[:start], minlength=width))
        # Row i also counts the chunk's own tokens before it: output[start + i - 1] at row i.
        steps[
            torch.arange(1, n, device=self.device),
            self._output_columns_device[start : start + n - 1],
        ] = 1
        return torch.cumsum(steps, dim=0, dtype=torch.int32)


def _bad_word_hits(
    output: npt.NDArray[np.int64], bad_words: Sequence[Sequence[int]], width: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(rows, tokens) that vLLM's bad-words step sets to -inf: for each token sequence,
    its last id at every output position t whose output[0:t] ends with the rest."""
    rows: list[npt.NDArray[np.int64]] = []
    tokens: list[npt.NDArray[np.int64]] = []
    n = int(output.size)
    for word in bad_words:
        word_ids = np.asarray(word, dtype=np.int64)
        if word_ids.size == 0 or not 0 <= word_ids[-1] < width:
            continue  # vLLM writes logits[last:last + 1]: nothing outside the row
        prefix = word_ids[:-1]
        if prefix.size == 0:
            at = np.arange(n, dtype=np.int64)
        elif n <= prefix.size:
            continue
        else:
            windows = np.lib.stride_tricks.sliding_window_view(output[: n - 1], prefix.size)
            at = np.flatnonzero((windows == prefix).all(axis=1)) + prefix.size
        rows.append(at)
        tokens.append(np.full(at.size, word_ids[-1], dtype=np.int64))
    if not rows:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(rows), np.concatenate(tokens)

"""The verifier's own logprobs, taken from the rows a scoring job already computes.

A scoring request whose response states logprobs carries a `LogprobsSpec` in
``SamplingParams.extra_args`` beside its job spec. The worker's hook then gives
the job a ``compute_logits`` that also keeps, for each row it returns, the
scored token's value and the ``top`` largest values with their ids, taken as
vLLM's sampler takes them for the committed ``logprobs_mode``: ``raw_logprobs``
is ``log_softmax`` of the raw logits in float32, ``raw_logits`` the raw logits
cast to float32 (vllm/v1/sample/sampler.py). A spec that carries the request's
sampling (the processed modes) also has the recorder keep each row's kept-set
bands (`verifierd.engine.kept_sets`), which it can only compute while it holds
the whole row. No second engine pass: the rows are the ones the margins come
from, in the order the job asks for them (output positions ``score_from``
onwards, the lookahead row last).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from verifierd.difr import DifrError, SamplingSettings
from verifierd.engine.kept_sets import BAND, SLACKS, bands

#: Key of the logprobs spec in SamplingParams.extra_args.
LOGPROBS_KEY = "veritap_logprobs"

ComputeLogits = Callable[[torch.Tensor], torch.Tensor | None]
RowsTuple = tuple[str, int, bytes, bytes, bytes, bytes]
_SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p")


@dataclass(frozen=True)
class LogprobsSpec:
    top: int
    mode: str
    #: The request's effective sampling, whose kept-set bands each row also records
    #: (None: no bands).
    sampling: SamplingSettings | None = None

    def to_extra(self) -> dict[str, object]:
        spec: dict[str, object] = {"top": self.top, "mode": self.mode}
        if self.sampling is not None:
            spec["sampling"] = {f: getattr(self.sampling, f) for f in _SAMPLING_FIELDS}
        return {LOGPROBS_KEY: spec}

    @classmethod
    def from_extra(cls, extra: object) -> LogprobsSpec | None:
        """The spec in ``extra_args``; None when there is none or it does not read."""
        if not isinstance(extra, dict) or not isinstance(extra.get(LOGPROBS_KEY), dict):
            return None
        d = extra[LOGPROBS_KEY]
        top, mode, sampling = d.get("top"), d.get("mode"), d.get("sampling")
        if not isinstance(top, int) or top < 1 or mode not in ("raw_logprobs", "raw_logits"):
            return None
        if sampling is None:
            return cls(top, mode)
        if not isinstance(sampling, dict) or set(sampling) != set(_SAMPLING_FIELDS):
            return None
        try:
            return cls(top, mode, SamplingSettings(**sampling))
        except (DifrError, TypeError):
            return None


@dataclass(frozen=True)
class LogprobRows:
    """One job's rows: output positions ``first`` onwards."""

    job_id: str
    first: int
    #: rows x top, descending per row.
    top_ids: npt.NDArray[np.int64]
    top_values: npt.NDArray[np.float32]
    #: The scored (following) token's value per row (NaN on the lookahead row).
    sampled: npt.NDArray[np.float32]
    #: rows x len(SLACKS) x len(BAND): the kept-set bands (None: not recorded).
    bands: npt.NDArray[np.float32] | None = None

    def to_tuple(self) -> RowsTuple:
        return (
            self.job_id,
            self.first,
            self.top_ids.astype("<i8").tobytes(),
            self.top_values.astype("<f4").tobytes(),
            self.sampled.astype("<f4").tobytes(),
            b"" if self.bands is None else self.bands.astype("<f4").tobytes(),
        )

    @classmethod
    def from_tuple(cls, t: Sequence[Any]) -> LogprobRows:
        job_id, first, ids, values, sampled, kept = t
        scored = np.frombuffer(bytes(sampled), dtype="<f4").astype(np.float32)
        rows = len(scored)
        top_ids = np.frombuffer(bytes(ids), dtype="<i8").astype(np.int64)
        top_values = np.frombuffer(bytes(values), dtype="<f4").astype(np.float32)
        width = len(top_ids) // rows if rows else 0
        banded = np.frombuffer(bytes(kept), dtype="<f4").astype(np.float32)
        return cls(
            str(job_id),
            int(first),
            top_ids.reshape(rows, width),
            top_values.reshape(rows, width),
            scored,
            banded.reshape(rows, len(SLACKS), len(BAND)) if len(kept) else None,
        )


class LogprobRecorder:
    """Keeps a job's logprob rows as its ``compute_logits`` produces them."""

    def __init__(self, job_id: str, spec: LogprobsSpec, prompt_len: int, score_from: int) -> None:
        self._job_id = job_id
        self._spec = spec
        self._first = score_from
        #: Index in the sequence of the token the next row scores.
        self._next_token = prompt_len + score_from
        self._ids: list[torch.Tensor] = []
        self._values: list[torch.Tensor] = []
        self._sampled: list[torch.Tensor] = []
        self._bands: list[torch.Tensor] = []

    def wrap(self, compute_logits: ComputeLogits, token_ids: Sequence[int]) -> ComputeLogits:
        """``compute_logits`` that also records the rows it returns."""

        def recorded(hidden: torch.Tensor) -> torch.Tensor | None:
            z = compute_logits(hidden)
            if z is not None:
                self._record(z, token_ids)
            return z

        return recorded

    def _record(self, z: torch.Tensor, token_ids: Sequence[int]) -> None:
        if self._spec.mode == "raw_logprobs":
            values = torch.log_softmax(z, dim=-1, dtype=torch.float32)
        else:
            values = z.to(torch.float32)
        n = values.shape[0]
        following = list(token_ids[self._next_token : self._next_token + n])
        self._next_token += n
        k = len(following)
        top = torch.topk(values, min(self._spec.top, values.shape[1]), dim=-1)
        sampled = torch.full((n,), float("nan"), dtype=torch.float32)
        if k:
            index = torch.tensor(following, dtype=torch.int64, device=values.device)
            sampled[:k] = values[:k].gather(-1, index.unsqueeze(-1)).squeeze(-1).to("cpu")
        self._ids.append(top.indices.to("cpu"))
        self._values.append(top.values.to("cpu"))
        self._sampled.append(sampled)
        if self._spec.sampling is not None:
            self._bands.append(bands(z.to("cpu"), self._spec.sampling))

    def rows(self) -> LogprobRows:
        width = self._spec.top
        banded = self._spec.sampling is not None
        if not self._ids:
            empty = np.zeros((0, width))
            return LogprobRows(
                self._job_id,
                self._first,
                empty.astype(np.int64),
                empty.astype(np.float32),
                np.zeros(0, dtype=np.float32),
                np.zeros((0, len(SLACKS), len(BAND)), dtype=np.float32) if banded else None,
            )
        return LogprobRows(
            self._job_id,
            self._first,
            torch.cat(self._ids).numpy().astype(np.int64),
            torch.cat(self._values).numpy().astype(np.float32),
            torch.cat(self._sampled).numpy().astype(np.float32),
            torch.cat(self._bands).numpy().astype(np.float32) if banded else None,
        )

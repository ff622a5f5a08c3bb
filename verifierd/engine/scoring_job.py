"""One response's Token-DiFR scoring, fed with hidden states as the engine prefills it.

The engine prefills prompt + output as one prompt, possibly in several chunks
(chunked prefill), in position order. A `ScoringJob` turns the hidden states of
the positions that predicted output tokens (prompt_len - 1 ... prompt_len - 2 + n)
into logits rows with the engine's own ``compute_logits``, re-applies the
request's logit adjustments (penalties, logit_bias, min_tokens, allowed ids, bad
words: verifierd.logit_adjustments) as the prover's sampler did, scores them
against the claimed tokens (the prompt's own later tokens) and keeps only the
per-token margins. Full logits rows never leave the engine's device. The rows of
all the jobs one engine step feeds get their logits in shared calls and are
scored together where their settings allow (`StepScoring`), and a response's
noise stream resumes where its previous pass began
(verifierd.engine.stream_cache): a tokenization search scores a response in many
short passes, and their fixed cost is paid per call.

`JobSpec` travels to the engine inside ``SamplingParams.extra_args`` (plain
JSON-like values, as vLLM's MessagePack transport needs); `JobOutcome` comes
back as a tuple of plain values for the same reason.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from verifierd.difr import SamplingSettings, token_scores
from verifierd.engine.stream_cache import StreamCache
from verifierd.errors import VerifierdError
from verifierd.logit_adjustments import (
    NEUTRAL,
    AdjustmentPlan,
    LogitAdjustmentError,
    LogitAdjustments,
    TokenMasks,
    repetition_arithmetic,
)
from verifierd.samplers import NoiseStream, StreamRows, get_profile

#: Key of the job spec in SamplingParams.extra_args.
JOB_KEY = "veritap_difr_job"

log = logging.getLogger(__name__)

ComputeLogits = Callable[[torch.Tensor], torch.Tensor | None]
OutcomeTuple = tuple[str, bytes, bytes, str, int, int]


class ScoringJobError(VerifierdError):
    """A job spec could not be decoded."""


@dataclass(frozen=True)
class JobSpec:
    job_id: str
    prompt_len: int
    n_out: int
    sampling: SamplingSettings
    profile: str
    chunk_rows: int
    adjustments: LogitAdjustments = NEUTRAL
    #: Output positions before this one are not scored (an earlier pass did): the
    #: prefix cache may serve them.
    score_from: int = 0
    #: Also report the sampler's pick after the last output token (the row that
    #: predicts what would follow it); its margin is not reported.
    lookahead: bool = False

    def to_extra(self) -> dict[str, object]:
        s = self.sampling
        return {
            JOB_KEY: {
                "job_id": self.job_id,
                "prompt_len": self.prompt_len,
                "n_out": self.n_out,
                "temperature": s.temperature,
                "top_k": s.top_k,
                "top_p": s.top_p,
                "min_p": s.min_p,
                "seed": s.seed,
                "profile": self.profile,
                "chunk_rows": self.chunk_rows,
                "adjustments": self.adjustments.to_json(),
                "score_from": self.score_from,
                "lookahead": self.lookahead,
            }
        }

    @classmethod
    def from_extra(cls, extra: object) -> JobSpec | None:
        """The spec in ``extra_args``, None when the request carries none."""
        if not isinstance(extra, dict) or JOB_KEY not in extra:
            return None
        d = extra[JOB_KEY]
        try:
            seed = d["seed"]
            return cls(
                job_id=str(d["job_id"]),
                prompt_len=int(d["prompt_len"]),
                n_out=int(d["n_out"]),
                sampling=SamplingSettings(
                    temperature=float(d["temperature"]),
                    top_k=int(d["top_k"]),
                    top_p=float(d["top_p"]),
                    min_p=float(d["min_p"]),
                    seed=None if seed is None else int(seed),
                ),
                profile=str(d["profile"]),
                chunk_rows=int(d["chunk_rows"]),
                adjustments=LogitAdjustments.from_json(d["adjustments"]),
                score_from=int(d["score_from"]),
                lookahead=bool(d["lookahead"]),
            )
        except (KeyError, TypeError, ValueError, LogitAdjustmentError) as exc:
            raise ScoringJobError(f"bad {JOB_KEY}: {exc}") from exc


@dataclass(frozen=True)
class JobOutcome:
    job_id: str
    #: Raw margins of output positions [score_from, n_out), float64 little-endian
    #: (+inf = claimed token outside the mask).
    raw_margins: bytes
    #: The sampler's own pick at the same positions (and the lookahead row when
    #: asked), int64 little-endian.
    raw_best: bytes
    #: Empty when the job completed.
    error: str
    #: Mask + noise + margin time (excludes the lm_head that made the logits).
    scoring_ns: int
    #: Time in the engine's compute_logits for the scored rows.
    logits_ns: int

    def to_tuple(self) -> OutcomeTuple:
        return (
            self.job_id,
            self.raw_margins,
            self.raw_best,
            self.error,
            self.scoring_ns,
            self.logits_ns,
        )

    @classmethod
    def from_tuple(cls, t: Sequence[Any]) -> JobOutcome:
        """From `to_tuple`'s value (a list after a MessagePack round trip)."""
        job_id, raw, best, error, scoring_ns, logits_ns = t
        return cls(
            str(job_id), bytes(raw), bytes(best), str(error), int(scoring_ns), int(logits_ns)
        )

    def margins(self) -> npt.NDArray[np.float64]:
        return np.frombuffer(self.raw_margins, dtype="<f8").astype(np.float64)

    def best(self) -> npt.NDArray[np.int64]:
        return np.frombuffer(self.raw_best, dtype="<i8").astype(np.int64)


class ScoringJob:
    """Scores one response incrementally from prefill chunks.

    With tensor parallelism every rank runs the same job and ``compute_logits`` is
    a collective (only the first rank gets the gathered logits), so the chunk loop
    depends on positions only: every rank makes the same calls whatever happens
    to the scoring, which only the rank holding logits does.

    ``stop_token_ids`` and ``bad_words_token_ids`` are the engine's resolution of
    the spec's min_tokens stop ids (with the model's EOS ids) and bad words
    (tokenized), as vLLM's SamplingParams holds them; ``token_masks`` the request's
    grammar masks (verifierd.engine.grammar) when it has a structured output;
    ``streams`` the worker's noise streams of earlier passes (a fresh one by default).
    """

    def __init__(
        self,
        spec: JobSpec,
        width: int,
        device: torch.device,
        *,
        stop_token_ids: Sequence[int] = (),
        bad_words_token_ids: Sequence[Sequence[int]] = (),
        token_masks: TokenMasks | None = None,
        streams: StreamCache | None = None,
    ) -> None:
        self.spec = spec
        self._streams = StreamCache(max_streams=1) if streams is None else streams
        self._token_masks = token_masks
        self._stop_token_ids = tuple(stop_token_ids)
        self._bad_words_token_ids = tuple(tuple(w) for w in bad_words_token_ids)
        self._plan: AdjustmentPlan | None = None
        #: The spec's sampling settings as vLLM applies them.
        self.sampling = spec.sampling.effective()
        self._first = spec.prompt_len - 1
        self._end = self._first + spec.n_out + (1 if spec.lookahead else 0)
        self._next = self._first + spec.score_from
        self._parts: list[torch.Tensor] = []
        self._best: list[torch.Tensor] = []
        self._stream: NoiseStream | None = None
        self._width = width
        self._device = device
        self._stopped = False
        self.error = ""
        self.scoring_ns = 0
        self.logits_ns = 0
        #: Whether this rank receives logits (None until the first chunk).
        self.holds_logits: bool | None = None
        if spec.prompt_len < 1 or spec.n_out < 0:
            self.error = "prompt must have at least one token"
            self._stopped = True
        elif not 0 <= spec.score_from <= spec.n_out:
            self.error = f"score_from {spec.score_from} outside the {spec.n_out} output tokens"
            self._stopped = True

    @property
    def done(self) -> bool:
        return self._stopped or self._next >= self._end

    def feed(
        self,
        first_pos: int,
        hidden: torch.Tensor,
        token_ids: Sequence[int],
        compute_logits: ComputeLogits,
        step: StepScoring | None = None,
    ) -> None:
        """Hidden states of positions [first_pos, first_pos + len(hidden)) of the
        sequence ``token_ids`` (prompt + claimed output).

        The rows join ``step``, which computes their logits together with the other
        jobs' rows of the same engine step and scores them when it is flushed;
        without one they are scored before this returns."""
        if self.done:
            return
        if first_pos > self._next:
            self.error = (
                f"positions {self._next}..{first_pos - 1} were not computed "
                "(prefix-cache hit inside the scored output)"
            )
            self._stopped = True
            return
        own_step = step is None
        step = StepScoring() if step is None else step
        lo = max(first_pos, self._next)
        hi = min(first_pos + hidden.shape[0], self._end)
        for a in range(lo, hi, self.spec.chunk_rows):
            b = min(a + self.spec.chunk_rows, hi)
            self._next = b
            hidden_rows = hidden[a - first_pos : b - first_pos]
            step.add_span(PendingSpan(self, a, hidden_rows, token_ids, compute_logits))
        if own_step:
            step.flush()

    def take_logits(
        self,
        z: torch.Tensor | None,
        span: PendingSpan,
        logits_ns: int,
        step: StepScoring,
    ) -> None:
        """The logits rows of ``span`` (None on a rank that receives no logits): they
        join ``step``'s scoring, adjusted as the prover's sampler adjusted them."""
        self.holds_logits = z is not None
        if z is None or self.error:
            return
        self.logits_ns += logits_ns
        t0 = time.perf_counter_ns()
        try:
            rows = self._rows(z, span.token_ids, span.first)
        except Exception as exc:  # keep making the collective calls; report the job
            self.fail(exc)
            return
        finally:
            self.scoring_ns += time.perf_counter_ns() - t0
        step.add(rows)

    def _rows(self, z: torch.Tensor, token_ids: Sequence[int], a: int) -> PendingRows:
        """The logits rows ``z`` of positions [a, a + len(z)), adjusted as the
        prover's sampler adjusted them, with what scoring them needs."""
        start = a - self._first
        n = z.shape[0]
        if self._stream is None and not self.sampling.is_greedy:
            self._stream = self._streams.open_at(
                self.sampling,
                get_profile(self.spec.profile),
                self.spec.prompt_len,
                self._width,
                self._device,
                start=start,
            )
        # The lookahead row has no claimed token: any id serves, its margin is dropped.
        following = list(token_ids[a + 1 : a + 1 + n])
        k = len(following)
        if not self.spec.adjustments.is_neutral:
            if self._plan is None:
                self._plan = self._adjustment_plan(token_ids, z)
            z = (
                self._plan.apply(z, start)
                if k == n
                else torch.cat([self._plan.apply(z[:k], start), z[k:]])
            )
        noise = None if self._stream is None else StreamRows(self._stream, start, start + n)
        return PendingRows(self, z, following + [0] * (n - k), k, noise)

    def fail(self, exc: Exception) -> None:
        """Scoring this job's rows raised ``exc``: the job reports it (and scores no more)."""
        log.error("scoring job failed", exc_info=exc, extra={"job_id": self.spec.job_id})
        if not self.error:
            self.error = f"scoring failed: {exc!r}"

    def take(self, margins: torch.Tensor, best: torch.Tensor, scoring_ns: int) -> None:
        """The scores of rows this job handed to a `StepScoring` (in the order it did):
        the claimed tokens' margins and the sampler's picks of all its rows (CPU)."""
        self.scoring_ns += scoring_ns
        if self.error:
            return
        k = margins.shape[0]
        if not self.spec.adjustments.is_neutral and k < best.shape[0]:
            # The adjustments are defined for output rows only: no pick after the end.
            best = best.clone()
            best[k:] = -1
        self._parts.append(margins)
        self._best.append(best)

    def _adjustment_plan(self, token_ids: Sequence[int], z: torch.Tensor) -> AdjustmentPlan:
        spec = self.spec
        return AdjustmentPlan(
            spec.adjustments,
            token_ids[: spec.prompt_len],
            token_ids[spec.prompt_len : spec.prompt_len + spec.n_out],
            z.shape[1],
            z.device,
            stop_token_ids=self._stop_token_ids,
            bad_words_token_ids=self._bad_words_token_ids,
            arithmetic=repetition_arithmetic(z.device, spec.profile),
            token_masks=self._token_masks,
        )

    def outcome(self) -> JobOutcome:
        raw = torch.cat(self._parts) if self._parts else torch.zeros(0, dtype=torch.float64)
        best = torch.cat(self._best) if self._best else torch.zeros(0, dtype=torch.int64)
        return JobOutcome(
            job_id=self.spec.job_id,
            raw_margins=raw.numpy().astype("<f8").tobytes(),
            raw_best=best.numpy().astype("<i8").tobytes(),
            error=self.error,
            scoring_ns=self.scoring_ns,
            logits_ns=self.logits_ns,
        )


@dataclass(frozen=True, eq=False)
class PendingSpan:
    """Hidden states of one job's rows waiting in a `StepScoring` for their logits."""

    job: ScoringJob
    #: The position of the first row.
    first: int
    #: [n, hidden] hidden states of positions [first, first + n).
    hidden: torch.Tensor
    #: The job's sequence (prompt + claimed output).
    token_ids: Sequence[int]
    compute_logits: ComputeLogits

    @property
    def batch(self) -> Hashable:
        """Spans with equal batches get their logits from one ``compute_logits`` call:
        the same function (a job that records its logprobs brings its own), device,
        dtype and bound on rows per call."""
        h = self.hidden
        return (self.compute_logits, h.device, h.dtype, self.job.spec.chunk_rows)


@dataclass(frozen=True, eq=False)
class PendingRows:
    """Logits rows of one job waiting in a `StepScoring`."""

    job: ScoringJob
    #: [n, width] raw logits, the job's adjustments applied.
    z: torch.Tensor
    #: The claimed token of each row (any id for a lookahead row).
    claimed: list[int]
    #: The rows with a claimed token (the first k; the rest is the lookahead row).
    k: int
    #: The rows' noise (None for greedy settings).
    noise: StreamRows | None

    @property
    def group(self) -> Hashable:
        """Rows with equal groups are scored in one call: the same mask settings, the
        same kind of noise (seeds may differ), the same logits device and dtype, and
        the same bound on rows per call."""
        s = self.job.sampling
        kind = "greedy" if self.noise is None else self.noise.stream.join_key
        if kind is None:
            return self  # rows whose stream scores alone form a group of their own
        return (
            kind,
            s.is_greedy or (s.temperature, s.top_k, s.top_p, s.min_p),
            self.z.device,
            self.z.dtype,
            self.job.spec.chunk_rows,
        )


class StepScoring:
    """The rows the jobs of one engine step fed: their logits computed, and the rows
    scored, together.

    Every call has a fixed cost however few rows it has: the lm_head's matmul in
    ``compute_logits``, and scoring's mask, noise, margins and copies to the CPU;
    a search pass often scores a handful of rows. The hidden states of all the
    step's spans that share a batch (`PendingSpan.batch`) go through one
    ``compute_logits`` call of at most ``chunk_rows`` rows (the lm_head gives each
    row the logits it gets alone: tests/verifierd/test_engine_backend.py checks it
    on the engine). Rows of different jobs that share a group (`PendingRows.group`)
    are stacked into one `token_scores` call of at most ``chunk_rows`` rows, which
    gives every row the values it gets alone (each operation works row by row; the
    tests check it bit for bit); rows that one ``compute_logits`` call returned one
    after another are scored where they are, without a copy.

    The batches depend on positions and specs only, so with tensor parallelism
    every rank makes the same ``compute_logits`` calls.
    """

    def __init__(self) -> None:
        self._batches: dict[Hashable, list[PendingSpan]] = {}
        self._groups: dict[Hashable, list[PendingRows]] = {}

    def add_span(self, span: PendingSpan) -> None:
        key = span.batch
        batch = self._batches.setdefault(key, [])
        held = sum(s.hidden.shape[0] for s in batch)
        if batch and held + span.hidden.shape[0] > span.job.spec.chunk_rows:
            self._compute(batch)
            batch = self._batches[key] = []
        batch.append(span)

    def add(self, rows: PendingRows) -> None:
        key = rows.group
        group = self._groups.setdefault(key, [])
        held = sum(r.z.shape[0] for r in group)
        if group and held + rows.z.shape[0] > rows.job.spec.chunk_rows:
            _score_group(group)
            group = self._groups[key] = []
        group.append(rows)

    def flush(self) -> None:
        """Compute and score every row still waiting."""
        batches, self._batches = self._batches, {}
        for batch in batches.values():
            self._compute(batch)
        groups, self._groups = self._groups, {}
        for group in groups.values():
            _score_group(group)

    def _compute(self, batch: Sequence[PendingSpan]) -> None:
        hidden = _stacked([s.hidden for s in batch])
        t0 = time.perf_counter_ns()
        z = batch[0].compute_logits(hidden)
        elapsed = time.perf_counter_ns() - t0
        offset = 0
        for s in batch:
            n = s.hidden.shape[0]
            rows = None if z is None else z[offset : offset + n]
            s.job.take_logits(rows, s, elapsed * n // hidden.shape[0], self)
            offset += n


def _stacked(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """The rows of 2-D ``parts`` as one tensor: a view where they lie one after another
    in one tensor's memory (the slices of one ``compute_logits`` result), else a copy."""
    first = parts[0]
    if len(parts) == 1:
        return first
    width = first.shape[1]
    storage, at = first.untyped_storage().data_ptr(), first.storage_offset()
    for p in parts:
        adjacent = (
            p.is_contiguous()
            and p.shape[1] == width
            and p.untyped_storage().data_ptr() == storage
            and p.storage_offset() == at
        )
        if not adjacent:
            return torch.cat(list(parts))
        at += p.numel()
    return first.as_strided((sum(p.shape[0] for p in parts), width), (width, 1))


def _score_group(group: Sequence[PendingRows]) -> None:
    t0 = time.perf_counter_ns()
    try:
        z = _stacked([r.z for r in group])
        claimed = torch.tensor([c for r in group for c in r.claimed], dtype=torch.int64)
        noise = [r.noise for r in group if r.noise is not None]
        scored = token_scores(z, claimed, group[0].job.sampling, noise)
        margins, best = scored.margins.to("cpu"), scored.best.to("cpu")
    except Exception as exc:  # every job of the group reports it
        for r in group:
            r.job.fail(exc)
        return
    elapsed = time.perf_counter_ns() - t0
    offset = 0
    for r in group:
        n = r.z.shape[0]
        r.job.take(
            margins[offset : offset + r.k],
            best[offset : offset + n],
            elapsed * n // z.shape[0],
        )
        offset += n

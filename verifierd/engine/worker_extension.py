"""The vLLM worker extension that scores responses where the logits are.

vLLM mixes this class into its worker when the engine is built with
``worker_extension_cls="verifierd.engine.worker_extension.VeritapWorkerExtension"``;
its methods are then reachable with ``LLM.collective_rpc("veritap_...")`` in every
executor (in-process, multiprocess, tensor parallel).

``veritap_install`` wraps the V1 model runner's ``_get_prompt_logprobs_dict``
(vllm/v1/worker/gpu_model_runner.py, vLLM 0.32; the CPU runner inherits it).
That method is called after every forward pass with the hidden states of all
scheduled tokens, which is the one place the runner exposes per-position hidden
states of a prefill. The wrapper hands the chunk of every request that carries
a `JobSpec` in ``SamplingParams.extra_args`` to its `ScoringJob`, scores the
step's rows of all jobs together (`StepScoring`), then calls the
original unchanged (such requests ask for no prompt logprobs, so the original
does nothing for them). Margins wait in the worker until ``veritap_take``; a
job whose request also carries a `LogprobsSpec` gets a ``compute_logits`` that
keeps the verifier's logprobs of the same rows (verifierd.engine.logprob_rows),
taken with ``veritap_take_logprobs``.
The job also gets vLLM's resolution of the request's min_tokens stop ids (EOS
included) and bad words (tokenized) from the request's SamplingParams, which the
backend fills with the prover's values for exactly that. A job whose adjustments
carry a structured output gets the request's grammar masks
(verifierd.engine.grammar), compiled in the worker with this engine's tokenizer
and the stop ids vLLM resolved for the request.

This depends on vLLM internals by name: `install` fails loudly on an engine
whose runner lacks them (e.g. Model Runner V2, which the backend turns off).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from verifierd.engine.grammar import GrammarCompiler, GrammarError, GrammarMasks
from verifierd.engine.logprob_rows import LogprobRecorder, LogprobsSpec, RowsTuple
from verifierd.engine.scoring_job import (
    JobSpec,
    OutcomeTuple,
    ScoringJob,
    ScoringJobError,
    StepScoring,
)
from verifierd.engine.stream_cache import StreamCache
from verifierd.errors import VerifierdError

log = logging.getLogger(__name__)

_HOOKED = "_get_prompt_logprobs_dict"


class WorkerHookError(VerifierdError):
    """The engine's model runner does not have what the scoring hook needs."""


class PrefillScoringHook:
    """Replaces the runner's prompt-logprobs step; feeds scoring jobs first."""

    def __init__(self, runner: Any, original: Callable[..., Any]) -> None:
        self._runner = runner
        self._original = original
        self.jobs: dict[str, ScoringJob] = {}
        self._grammars: GrammarCompiler | None = None
        self._streams = StreamCache()
        #: The verifier's logprobs of the jobs whose request asks for them.
        self.logprobs: dict[str, LogprobRecorder] = {}

    def __call__(self, hidden_states: torch.Tensor, num_scheduled_tokens: dict[str, int]) -> Any:
        runner = self._runner
        step = StepScoring()
        for req_id, n_scheduled in num_scheduled_tokens.items():
            state = runner.requests.get(req_id)
            if state is None or state.sampling_params is None:
                continue
            try:
                spec = JobSpec.from_extra(state.sampling_params.extra_args)
            except ScoringJobError:
                log.exception("undecodable scoring job", extra={"request_id": req_id})
                continue
            if spec is None:
                continue
            job = self.jobs.get(spec.job_id)
            if job is None:
                width = runner.model_config.get_vocab_size()
                params = state.sampling_params
                job = self.jobs[spec.job_id] = ScoringJob(
                    spec,
                    width,
                    runner.device,
                    stop_token_ids=sorted(params.all_stop_token_ids),
                    bad_words_token_ids=params.bad_words_token_ids or (),
                    token_masks=self._grammar_masks(spec, params.all_stop_token_ids),
                    streams=self._streams,
                )
                logprobs = LogprobsSpec.from_extra(params.extra_args)
                if logprobs is not None:
                    self.logprobs[spec.job_id] = LogprobRecorder(
                        spec.job_id, logprobs, spec.prompt_len, spec.score_from
                    )
            start = state.num_computed_tokens
            if job.done or start >= state.num_prompt_tokens:
                continue
            offset = int(runner.query_start_loc.np[runner.input_batch.req_id_to_index[req_id]])
            compute_logits = runner.model.compute_logits
            recorder = self.logprobs.get(spec.job_id)
            if recorder is not None:
                compute_logits = recorder.wrap(compute_logits, state.prompt_token_ids)
            job.feed(
                start,
                hidden_states[offset : offset + n_scheduled],
                state.prompt_token_ids,
                compute_logits,
                step,
            )
        step.flush()
        return self._original(hidden_states, num_scheduled_tokens)

    def _grammar_masks(self, spec: JobSpec, stop_token_ids: Any) -> GrammarMasks | None:
        """The job's grammar masks (None without a structured output, or when the grammar
        cannot be rebuilt: the job then fails, naming the missing masks)."""
        structured = spec.adjustments.structured_output
        if structured is None:
            return None
        if self._grammars is None:
            from vllm.tokenizers import cached_tokenizer_from_config

            runner = self._runner
            tokenizer = cached_tokenizer_from_config(model_config=runner.model_config)
            vocab = runner.model_config.get_vocab_size()
            self._grammars = GrammarCompiler(runner.vllm_config, tokenizer, vocab)
        try:
            return GrammarMasks(self._grammars.compile(structured, sorted(stop_token_ids)))
        except GrammarError:
            log.exception("grammar not rebuilt", extra={"job_id": spec.job_id})
            return None


class VeritapWorkerExtension:
    """Methods vLLM adds to its worker (``self`` is the worker)."""

    model_runner: Any

    def veritap_install(self) -> int:
        """Hook the model runner (idempotent); returns the logits width."""
        runner = self.model_runner
        if not isinstance(getattr(runner, "_veritap_hook", None), PrefillScoringHook):
            original = getattr(runner, _HOOKED, None)
            if original is None or not hasattr(runner, "requests"):
                raise WorkerHookError(
                    f"{type(runner).__name__} has no {_HOOKED}: this vLLM runner is not supported"
                )
            hook = PrefillScoringHook(runner, original)
            setattr(runner, _HOOKED, hook)
            runner._veritap_hook = hook
        width: int = runner.model_config.get_vocab_size()
        return width

    def veritap_take(self, job_ids: list[str]) -> list[OutcomeTuple]:
        """Outcomes of the finished jobs among ``job_ids``; all of them are forgotten."""
        hook: PrefillScoringHook = self.model_runner._veritap_hook
        out: list[OutcomeTuple] = []
        for job_id in job_ids:
            job = hook.jobs.pop(job_id, None)
            # Ranks without the gathered logits (tensor parallel) have nothing to report.
            if job is not None and job.done and job.holds_logits is not False:
                out.append(job.outcome().to_tuple())
        return out

    def veritap_take_logprobs(self, job_ids: list[str]) -> list[RowsTuple]:
        """The logprob rows of ``job_ids`` that asked for them (call before
        ``veritap_take``, which forgets the jobs); all of them are forgotten."""
        hook: PrefillScoringHook = self.model_runner._veritap_hook
        out: list[RowsTuple] = []
        for job_id in job_ids:
            recorder = hook.logprobs.pop(job_id, None)
            job = hook.jobs.get(job_id)
            if recorder is not None and job is not None and job.holds_logits is not False:
                out.append(recorder.rows().to_tuple())
        return out

"""Scheduling decisions, without I/O: which records are checked, in what batches, when.

- **Sampling policy.** A record is recomputed when HMAC-SHA256(verifier secret,
  record id), read as a 64-bit integer, is below ``f · 2^64`` for the
  commitment's sample rate ``f``. The prover does not know the secret, so it
  cannot tell which of its responses will be checked; the verifier's choice is
  still reproducible by anyone given the secret.
- **Batches.** A batch is the work of one commitment's engine in one call. Its
  requests are ordered by prompt token ids, so the turns of a conversation (each
  prompt extending the previous one) sit next to each other and the engine's
  prefix cache serves their shared prefix once. A record's choices stay in one
  batch; batches respect a request and a token budget.
- **Which engine next.** Keep feeding the engine that is loaded while it has
  work, unless another commitment's oldest record has waited longer than the
  switch delay: loading an engine costs far more than a batch.
- **Retries.** An engine failure retries the record after an exponential
  backoff; after ``max_attempts`` the record becomes UNVERIFIABLE(engine_error).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from verifierd.store import Backlog

T = TypeVar("T")

_TWO_64 = 1 << 64


def selected(secret: bytes, record_id: str, sample_rate: float) -> bool:
    """Whether the sampling policy picks ``record_id`` at rate ``sample_rate`` (0..1)."""
    if sample_rate >= 1.0:
        return True
    mac = hmac.new(secret, record_id.encode(), hashlib.sha256).digest()
    return int.from_bytes(mac[:8], "big") < int(sample_rate * _TWO_64)


def retry_delay_ns(attempts: int, *, initial_s: float, maximum_s: float) -> int:
    """Backoff before attempt ``attempts + 1`` (``attempts`` >= 1 failures so far)."""
    return int(min(maximum_s, initial_s * 2 ** max(0, attempts - 1)) * 1e9)


@dataclass(frozen=True)
class Job(Generic[T]):
    """One record's share of a batch: its requests (one per choice) and their size."""

    item: T
    #: Sort key: the prompt token ids of the record (its first choice's).
    prompt: tuple[int, ...]
    tokens: int
    requests: int


def plan_batch(jobs: Sequence[Job[T]], *, max_requests: int, max_tokens: int) -> list[Job[T]]:
    """The next batch from ``jobs``: oldest job first (so nothing starves), then the jobs
    that fit, ordered by prompt so shared prefixes are adjacent. A single job larger
    than the budget still goes alone."""
    if not jobs:
        return []
    chosen = [jobs[0]]
    requests, tokens = jobs[0].requests, jobs[0].tokens
    for job in jobs[1:]:
        if requests + job.requests > max_requests or tokens + job.tokens > max_tokens:
            continue
        chosen.append(job)
        requests += job.requests
        tokens += job.tokens
    return sorted(chosen, key=lambda j: j.prompt)


def next_commitment(
    backlog: Sequence[Backlog],
    *,
    loaded: Callable[[str], bool],
    now_ns: int,
    switch_after_s: float,
    runnable: Callable[[str], bool] = lambda _: True,
) -> str | None:
    """The commitment whose engine should run next, or None when there is no work.

    A loaded engine with work keeps running unless an unloaded commitment's oldest
    record has waited more than ``switch_after_s``; otherwise the oldest work wins.
    ``runnable`` filters out commitments that cannot run now (engine backing off).
    """
    waiting = [b for b in backlog if b.pending > 0 and runnable(b.commitment_id)]
    if not waiting:
        return None
    oldest = min(waiting, key=lambda b: b.oldest_enqueued_ns)
    warm = [b for b in waiting if loaded(b.commitment_id)]
    if warm and not (
        not loaded(oldest.commitment_id)
        and now_ns - oldest.oldest_enqueued_ns > switch_after_s * 1e9
    ):
        return min(warm, key=lambda b: b.oldest_enqueued_ns).commitment_id
    return oldest.commitment_id

"""Scheduling policy: HMAC sampling, backoff, batch planning, which engine runs next."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from verifierd.scheduler import Job, next_commitment, plan_batch, retry_delay_ns, selected
from verifierd.store import Backlog

SECRET = b"k" * 32


def test_sampling_rate_is_honoured_and_keyed() -> None:
    ids = [f"01J{i:023d}" for i in range(20_000)]
    picked = {i for i in ids if selected(SECRET, i, 0.25)}
    assert 0.23 < len(picked) / len(ids) < 0.27
    other = {i for i in ids if selected(b"x" * 32, i, 0.25)}
    assert len(picked & other) < 0.35 * len(picked)
    assert all(selected(SECRET, i, 1.0) for i in ids[:100])
    assert not any(selected(SECRET, i, 0.0) for i in ids)


@settings(deadline=None)
@given(st.text(max_size=30), st.floats(0, 1), st.floats(0, 1))
def test_selection_is_monotone_in_the_rate(record_id: str, a: float, b: float) -> None:
    low, high = min(a, b), max(a, b)
    if selected(SECRET, record_id, low):
        assert selected(SECRET, record_id, high)


def test_backoff_doubles_up_to_the_cap() -> None:
    delays = [retry_delay_ns(n, initial_s=2, maximum_s=10) for n in range(1, 6)]
    assert delays == [2_000_000_000, 4_000_000_000, 8_000_000_000, 10**10, 10**10]


def job(name: str, prompt: tuple[int, ...], tokens: int = 10, requests: int = 1) -> Job[str]:
    return Job(name, prompt, tokens, requests)


def test_batch_keeps_the_oldest_and_orders_by_prompt() -> None:
    jobs = [
        job("turn2", (1, 2, 3, 4)),
        job("other", (9, 9)),
        job("turn1", (1, 2)),
        job("big", (5,), tokens=1000),
        job("turn3", (1, 2, 3, 4, 5, 6)),
    ]
    batch = plan_batch(jobs, max_requests=10, max_tokens=100)
    assert [j.item for j in batch] == ["turn1", "turn2", "turn3", "other"]
    assert [j.item for j in plan_batch(jobs, max_requests=2, max_tokens=100)] == ["turn2", "other"]
    assert [j.item for j in plan_batch([jobs[3], jobs[0]], max_requests=5, max_tokens=50)] == [
        "big"
    ]
    assert plan_batch([], max_requests=1, max_tokens=1) == []


@settings(deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 50), st.integers(1, 4)), min_size=1, max_size=30),
    st.integers(1, 8),
    st.integers(1, 200),
)
def test_batches_respect_budgets(
    sizes: list[tuple[int, int]], max_requests: int, max_tokens: int
) -> None:
    jobs = [job(str(i), (i,), t, r) for i, (t, r) in enumerate(sizes)]
    batch = plan_batch(jobs, max_requests=max_requests, max_tokens=max_tokens)
    assert jobs[0] in batch
    if len(batch) > 1:
        assert sum(j.requests for j in batch) <= max_requests
        assert sum(j.tokens for j in batch) <= max_tokens
    assert [j.prompt for j in batch] == sorted(j.prompt for j in batch)


def test_next_commitment_prefers_the_warm_engine_until_others_wait_too_long() -> None:
    backlog = [Backlog("cold", 5, oldest_enqueued_ns=0), Backlog("warm", 3, oldest_enqueued_ns=50)]

    def warm(cid: str) -> bool:
        return cid == "warm"

    pick = next_commitment(backlog, loaded=warm, now_ns=10 * 10**9, switch_after_s=30)
    assert pick == "warm"
    late = next_commitment(backlog, loaded=warm, now_ns=40 * 10**9, switch_after_s=30)
    assert late == "cold"
    none_loaded = next_commitment(backlog, loaded=lambda _: False, now_ns=0, switch_after_s=30)
    assert none_loaded == "cold"
    blocked = next_commitment(
        backlog, loaded=warm, now_ns=0, switch_after_s=30, runnable=lambda c: c != "warm"
    )
    assert blocked == "cold"
    assert next_commitment([], loaded=warm, now_ns=0, switch_after_s=1) is None

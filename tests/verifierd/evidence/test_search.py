"""The tokenization search recovers any sequence an honest sampler produced from its text.

A stand-in sampler picks each token deterministically from the tokens before it
(a hash), mixing the kinds of ids that make text fail to tokenize back: whole
words, single bytes that are half a UTF-8 character or invalid UTF-8 (shown as
U+FFFD), special and padding ids that decode to nothing. The honest text is what
vLLM's own detokenizer makes of the sequence; the search, scored by the same
sampler, must find exactly that sequence.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.cpu_bound import cpu_bound
from tests.verifierd.evidence.vocabulary import Vocabulary
from verifierd.engine.evidence_scoring import RequestText
from verifierd.evidence import search
from verifierd.evidence.vllm_views import decode_output

PROMPT = (5, 17, 42)


def _pick(vocab: Vocabulary, seed: int, prefix: Sequence[int], end_at: int | None) -> int:
    """The stand-in sampler: EOS at ``end_at`` tokens, a hashed choice elsewhere."""
    if end_at is not None and len(prefix) >= end_at:
        return vocab.eos
    digest = hashlib.blake2b(repr((seed, tuple(prefix))).encode(), digest_size=8).digest()
    h = int.from_bytes(digest, "little")
    kind, which = h % 100, h // 100
    if kind < 80:
        pool = vocab.words
    elif kind < 90:
        pool = vocab.high_bytes
    elif kind < 95:
        pool = vocab.invisible
    else:
        pool = list(range(vocab.width))
    token = pool[which % len(pool)]
    return token if token != vocab.eos else vocab.words[which % len(vocab.words)]


def _honest(vocab: Vocabulary, seed: int, n: int, end: bool) -> list[int]:
    out: list[int] = []
    while len(out) < n + (1 if end else 0):
        out.append(_pick(vocab, seed, out, n if end else None))
    return out


def _params() -> Any:
    from vllm import SamplingParams

    return SamplingParams(max_tokens=1000)


Sampler = Callable[[Sequence[int]], int]


def _scorer(sampler: Sampler) -> search.Scorer:
    def score(passes: Sequence[search.ScorePass]) -> list[search.PassResult | None]:
        out: list[search.PassResult | None] = []
        for p in passes:
            best = [sampler(p.output[:i]) for i in range(p.score_from, len(p.output) + 1)]
            margins = [
                0.0 if p.output[i] == best[i - p.score_from] else 1.0
                for i in range(p.score_from, len(p.output))
            ]
            out.append(search.PassResult(np.array(margins), np.array(best, dtype=np.int64)))
        return out

    return score


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    seed=st.integers(0, 2**32),
    n=st.integers(1, 48),
    end=st.booleans(),
    shape=st.tuples(
        st.sampled_from([(0.0, 1.0), (1.0, 10.0), (search.PASS_COST, search.PRIOR_POSITIONS)]),
        st.sampled_from([1, 5, search.GUESS_CHARS]),
        st.sampled_from([1, 4, 128]),
    ),
)
def test_an_honest_sequence_is_recovered_from_its_text(
    vocab: Vocabulary, seed: int, n: int, end: bool, shape: tuple[tuple[float, float], int, int]
) -> None:
    """Whatever the windows the rounds score (one position at a time included, or
    moved to a cache block's start) and however little of the text a re-guess
    segments."""
    honest = _honest(vocab, seed, n, end)
    ends = frozenset({vocab.eos})
    decoded = decode_output(vocab.tokenizer, _params(), PROMPT, honest, ends)
    model = RequestText(vocab.text, ends, vocab.eos)
    ending = search.Ending.END_TOKEN if end else search.Ending.LENGTH
    (pass_cost, prior_positions), guess_chars, cache_block = shape
    state = search.initial_state(
        decoded.text,
        ending,
        "",
        None if end else len(honest),
        model,
        pass_cost=pass_cost,
        prior_positions=prior_positions,
        guess_chars=guess_chars,
        cache_block=cache_block,
        cache_offset=len(PROMPT),
    )
    search.run_search(
        [state], _scorer(lambda prefix: _pick(vocab, seed, prefix, n if end else None))
    )
    assert not state.exhausted
    assert state.output == honest
    assert state.margins == [0.0] * len(honest)


def test_a_text_the_sampler_did_not_write_keeps_text_consistent_tokens_and_scores_high(
    vocab: Vocabulary,
) -> None:
    ends = frozenset({vocab.eos})
    model = RequestText(vocab.text, ends, vocab.eos)
    text = "this text was written by another model entirely"
    state = search.initial_state(text, search.Ending.END_TOKEN, "", None, model)
    search.run_search([state], _scorer(lambda prefix: _pick(vocab, 7, prefix, None)))
    decoded = decode_output(vocab.tokenizer, _params(), PROMPT, state.output, ends)
    assert decoded.text == text
    assert np.mean(state.margins) > 0.5


def test_the_restart_bound_ends_a_search_as_exhausted(vocab: Vocabulary) -> None:
    ends = frozenset({vocab.eos})
    model = RequestText(vocab.text, ends, vocab.eos)
    text = "the " * 100
    state = search.initial_state(text, search.Ending.LENGTH, "", 10_000, model)

    def next_byte(prefix: Sequence[int]) -> int:
        # A sampler that spells the text one byte at a time: always consistent with
        # the text, never the tokenizer's merged guess, so every pass adopts once more.
        done, _ = vocab.text.text_after(prefix)
        rest = text[len(done) :].encode() or b" "
        return vocab.text.byte_tokens(rest[:1])[0]  # type: ignore[index]

    search.run_search([state], _scorer(next_byte))
    assert state.exhausted
    first_guess = search.initial_state(text, search.Ending.LENGTH, "", 10_000, model).output
    assert state.restarts == state.restart_bound == search.max_restarts(len(first_guess))


def test_a_text_of_endless_invalid_bytes_is_read_in_linear_time(vocab: Vocabulary) -> None:
    invalid = vocab.text.byte_tokens(b"\x80")[0]  # type: ignore[index]
    ids = [vocab.text.byte_tokens(b"a")[0], *[invalid] * 20_000]  # type: ignore[index]
    with cpu_bound(2.0):
        text, held = vocab.text.text_after(ids)
    assert (text, held) == ("a", b"")
    few = vocab.text.text_after(ids[:4])
    assert few == ("a", b"\x80\x80\x80")


@pytest.mark.parametrize(
    ("held", "rest", "fits"),
    [
        (b"\xe2\x82", "\u20ac!", True),  # the start of the euro sign
        (b"\xe2\x82", "a", False),
        (b"\xe2\x82", "\ufffda", True),  # made invalid by what follows
        (b"\xef\xbf\xe1", "\ufffd\x1b", False),  # one invalid sequence, then E1 made invalid
        (b"\xef\xbf\xe1", "\ufffd\ufffd\x1b", True),
        (b"\xef\xbf\xe1", "\ufffd\u1234", True),  # E1 completed to U+1234
        (b"\x80\x80", "\ufffd", False),
        (b"\x80", "", True),  # at the end: never emitted
    ],
)
def test_held_back_bytes_must_show_as_the_text_continues(
    held: bytes, rest: str, fits: bool
) -> None:
    """A dishonest text must not adopt a pick whose held-back bytes make more (or fewer)
    U+FFFD than the client saw: they would decode to another text."""
    assert search._pending_fits(held, rest) is fits


def _counting(scorer: search.Scorer, passes: list[search.ScorePass]) -> search.Scorer:
    def score(batch: Sequence[search.ScorePass]) -> Sequence[search.PassResult | None]:
        passes.extend(batch)
        return scorer(batch)

    return score


def _replaying(honest: Sequence[int], otherwise: int) -> Sampler:
    """A sampler that wrote ``honest`` (and ``otherwise`` off its path)."""

    def pick(prefix: Sequence[int]) -> int:
        n = len(prefix)
        return honest[n] if n < len(honest) and list(prefix) == honest[:n] else otherwise

    return pick


def test_a_u_fffd_is_read_by_a_lookahead_row_without_rescoring_a_window(
    vocab: Vocabulary,
) -> None:
    """Invalid bytes show only as U+FFFD, so the guess is wrong there: a window ends
    before each one and its lookahead row reads the sampler's bytes, so when those are
    the only divergences no output position is scored twice."""
    model = RequestText(vocab.text, frozenset({vocab.eos}), vocab.eos)
    invalid = vocab.text.byte_tokens(b"\x80")[0]  # type: ignore[index]
    words = [model.segment(f" word{i} and more words") for i in range(12)]
    honest = [t for w in words for t in (invalid, *w)]
    text, _ = vocab.text.text_after(honest)
    assert text.count("\ufffd") == len(words)
    state = search.initial_state(text, search.Ending.LENGTH, "", len(honest), model)
    passes: list[search.ScorePass] = []
    search.run_search([state], _counting(_scorer(_replaying(honest, vocab.eos)), passes))
    assert state.output == honest
    assert state.restarts == len(words)
    assert sum(len(p.output) - p.score_from for p in passes) <= len(honest)


def test_a_text_of_u_fffd_the_sampler_spelled_does_not_end_every_window(
    vocab: Vocabulary,
) -> None:
    """Where the sampler wrote the replacement character itself, a look before each
    U+FFFD restarts nothing: after BASE_RESTARTS such looks the windows stop there,
    and widen with the positions settled without a divergence."""
    model = RequestText(vocab.text, frozenset({vocab.eos}), vocab.eos)
    text = "\ufffd " * 300
    honest = model.segment(text)
    state = search.initial_state(text, search.Ending.LENGTH, "", len(honest), model)
    passes: list[search.ScorePass] = []
    search.run_search([state], _counting(_scorer(_replaying(honest, vocab.eos)), passes))
    assert state.output == honest
    assert state.restarts == 0
    assert len(passes) <= search.BASE_RESTARTS + 2 + math.isqrt(len(honest))


def test_a_window_ends_one_position_into_a_cache_block(vocab: Vocabulary) -> None:
    """The prefix cache serves whole blocks: a round that restarts nothing ends where
    the next round recomputes only the position it reads first."""
    model = RequestText(vocab.text, frozenset({vocab.eos}), vocab.eos)
    honest = model.segment(" ".join(f"word{i}" for i in range(400)))
    text, _ = vocab.text.text_after(honest)
    state = search.initial_state(
        text, search.Ending.LENGTH, "", len(honest), model, cache_block=32, cache_offset=len(PROMPT)
    )
    passes: list[search.ScorePass] = []
    search.run_search([state], _counting(_scorer(_replaying(honest, vocab.eos)), passes))
    assert state.output == honest
    assert all((len(PROMPT) + len(p.output) - 1) % 32 == 0 for p in passes[:-1])


def _split_every(model: RequestText, words: Sequence[str], every: int) -> list[int]:
    """The segmentation of ``words``, every ``every``-th word segmented in two
    pieces instead: a divergence from the guess nothing in the text foresees."""
    out: list[int] = []
    for i, word in enumerate(words):
        pieces = (word[:3], word[3:]) if i % every == every - 1 else (word,)
        out += [t for piece in pieces for t in model.segment(piece)]
    return out


def _widths(passes: Sequence[search.ScorePass]) -> list[int]:
    return [len(p.output) - p.score_from for p in passes]


def test_windows_narrow_where_divergences_come_often_and_widen_where_none_come(
    vocab: Vocabulary,
) -> None:
    """The rows a divergence wastes are the rest of its window: a response whose
    guess diverges every few words gets narrow windows, one that never diverges
    wide ones, and both are recovered exactly."""
    model = RequestText(vocab.text, frozenset({vocab.eos}), vocab.eos)
    words = [f" word{i}" for i in range(300)]
    widths, restarts = {}, {}
    for every in (4, len(words) + 1):
        honest = _split_every(model, words, every)
        text, _ = vocab.text.text_after(honest)
        state = search.initial_state(text, search.Ending.LENGTH, "", len(honest), model)
        passes: list[search.ScorePass] = []
        search.run_search([state], _counting(_scorer(_replaying(honest, vocab.eos)), passes))
        assert state.output == honest
        widths[every] = _widths(passes)
        restarts[every] = state.restarts
    diverging, clean = widths[4], widths[len(words) + 1]
    assert restarts[4] >= len(words) // 8 and restarts[len(words) + 1] == 0
    assert max(diverging[len(diverging) // 2 :]) < min(clean[1:])
    # Without a divergence no position is scored twice: each lookahead row settles
    # the position after its window, but the last.
    assert sum(clean) + len(clean) - 1 == len(model.segment("".join(words)))

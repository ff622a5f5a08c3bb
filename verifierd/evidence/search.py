"""Finding the output tokens of a response from its text: the tokenization search.

A client receives text, not token ids, and text does not tokenize back to the
ids a sampler produced: byte-level tokens that are half a UTF-8 character (or
invalid UTF-8, shown as U+FFFD), a non-canonical split of the same characters,
special or padding ids that decode to nothing. So the verifier does not trust
one re-tokenization; it searches for the sequence that the committed sampler
itself produces *and* that decodes to the received text:

1. Guess: the tokenizer's segmentation of the text (plus the end-of-sequence
   token when the choice stopped on one, or the stop string when it stopped
   on that).
2. Score a window of the guess in one prefill (`Scorer`): per output position,
   the margin of the guessed token and the sampler's own pick; one row more
   predicts the token after the window.
3. Walk the positions in order. Where the sampler's pick differs from the
   guess and *is consistent with the text* (appending it to the tokens before
   keeps the decoded text a prefix of the received text, or it is an end token
   exactly where the text ends), adopt it, re-segment the rest of the text
   after it, and score again from that position: a **restart**. The prefix
   cache makes a restart cost the prefill of the positions after it.
4. Where the pick is not consistent with the text, the guessed token stays and
   its margin counts (a text-consistent token against the sampler's best), so a
   dishonest text still scores high.
5. When a pass over the last window adopts nothing, the sequence is final;
   `claims.check_output` then checks it like claimed ids (decoding, finish
   reason). A window that adopts nothing settles its positions and the next
   round scores the next window.

Windows: everything a pass scores after a divergence it adopts is wasted (the
tokens before it changed), so a round scores only a window of the guess: the
first INITIAL_WINDOW positions, twice the last window after a round without a
divergence (a response that needs none costs a few rounds and no extra rows),
and after a restart about the mean distance between the divergences seen so
far. With divergences at random the rows scored stay near the output's length
plus one window per restart, instead of one tail per restart.

Honest output reproduces exactly: along the honest prefix the sampler's pick is
the token the prover drew, which is consistent with the text by construction,
so every divergence of the guess from the honest sequence is adopted at the
first position where they differ. The number of restarts is the number of
such divergences; a response needing more than `max_restarts` is
UNVERIFIABLE(tokenization_search_exhausted), never a guess. A round rescores
only the window after the last settled position (the prefix cache serves the
rest), so the search costs at most ``restarts + 1`` prefills of the output, and
usually little more than one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

import numpy as np
import numpy.typing as npt

#: Restarts allowed for a response of n output tokens: BASE + n // PER_TOKENS.
BASE_RESTARTS = 16
PER_TOKENS = 4
#: Output positions a response's first round scores, and the smallest window.
INITIAL_WINDOW = 64
MIN_WINDOW = 16


def max_restarts(n_tokens: int) -> int:
    """The restart bound of a response whose guess has ``n_tokens`` tokens."""
    return BASE_RESTARTS + n_tokens // PER_TOKENS


class Ending(Enum):
    """How the received text ends, as the finish reason says."""

    #: On an end token (EOS or a request's stop_token_ids), absent from the text.
    END_TOKEN = "end_token"
    #: On a stop string, cut from the text (the last token completes it).
    STOP_STRING = "stop_string"
    #: After max_tokens tokens (or the context limit): no end token.
    LENGTH = "length"


class TextModel(Protocol):
    """The committed tokenizer and detokenizer for one request (engine side)."""

    def segment(self, text: str) -> list[int]:
        """The tokenizer's segmentation of ``text`` (no special tokens)."""

    def byte_tokens(self, data: bytes) -> list[int] | None:
        """One token per byte of ``data`` (byte-level vocabularies), or None."""

    def text_after(self, ids: Sequence[int]) -> tuple[str, bytes]:
        """The text ``ids`` decode to as the detokenizer emits it, and the bytes it
        still holds back (an incomplete UTF-8 character at the end)."""

    def is_end_token(self, token: int) -> bool:
        """Whether ``token`` ends generation for this request (EOS, stop_token_ids)."""

    @property
    def end_token(self) -> int | None:
        """The end token a guess ends with (the tokenizer's EOS), None without one."""


class Scorer(Protocol):
    """Scores token sequences in one engine call (the engine's prefill); None for a
    pass the engine cannot take (longer than its context): that search ends."""

    def __call__(self, passes: Sequence[ScorePass]) -> Sequence[PassResult | None]: ...


@dataclass(frozen=True)
class ScorePass:
    """Score ``output`` after the prompt from output position ``score_from`` on."""

    output: tuple[int, ...]
    score_from: int


@dataclass(frozen=True)
class PassResult:
    #: Margins of output positions [score_from, len(output)).
    margins: npt.NDArray[np.float64]
    #: The sampler's picks at [score_from, len(output)] (one more: the lookahead
    #: row); -1 where unknown.
    best: npt.NDArray[np.int64]


@dataclass
class SearchState:
    """One response being searched."""

    text: str
    ending: Ending
    stop_string: str
    #: The length a LENGTH ending must reach (None: unknown, no lookahead limit).
    max_tokens: int | None
    model: TextModel
    output: list[int]
    margins: list[float] = field(default_factory=list)
    restarts: int = 0
    #: Output positions the next round scores after the settled ones, and the
    #: smallest window a restart sets.
    window: int = INITIAL_WINDOW
    min_window: int = MIN_WINDOW
    exhausted: bool = False
    done: bool = False

    @property
    def target(self) -> str:
        """The text the sampled tokens spell: the received text, plus the stop
        string that was cut from it."""
        return self.text + self.stop_string if self.ending is Ending.STOP_STRING else self.text

    @property
    def settled(self) -> int:
        """Output positions whose margins are final."""
        return len(self.margins)


def initial_state(
    text: str,
    ending: Ending,
    stop_string: str,
    max_tokens: int | None,
    model: TextModel,
    *,
    window: int = INITIAL_WINDOW,
    min_window: int = MIN_WINDOW,
) -> SearchState:
    state = SearchState(
        text, ending, stop_string, max_tokens, model, [], window=window, min_window=min_window
    )
    state.output = _complete(state, [])
    return state


def run_search(states: Sequence[SearchState], scorer: Scorer) -> None:
    """Search every state to its end (batched: one engine call per round)."""
    while True:
        live = [s for s in states if not s.done]
        if not live:
            return
        results = scorer(
            [ScorePass(tuple(s.output[: s.settled + s.window]), s.settled) for s in live]
        )
        for state, result in zip(live, results, strict=True):
            if result is None:
                state.exhausted = state.done = True
            else:
                step(state, result)


def step(state: SearchState, result: PassResult) -> None:
    """Take one scored pass over a window: adopt the first consistent divergence,
    or settle the window (and finish when it was the last)."""
    start = state.settled
    output = state.output
    n = len(output)
    end = start + len(result.margins)
    # The row after the window: the sampler's pick there (no margin: the next
    # window scores it), or after the last token whether anything follows.
    last = end + 1 if end < n or _wants_more(state) else end
    for i in range(start, last):
        pick = int(result.best[i - start])
        if i < n and pick == output[i]:
            if i < end:
                state.margins.append(float(result.margins[i - start]))
            continue
        if pick >= 0 and _consistent(state, output[:i], pick):
            if state.restarts >= max_restarts(n):
                state.exhausted = state.done = True
                return
            state.restarts += 1
            adopted = [*output[:i], pick]
            state.output = adopted + _complete(state, adopted)
            state.window = max(state.min_window, len(adopted) // state.restarts)
            return
        if i < end:
            state.margins.append(float(result.margins[i - start]))
    if end < n:
        state.window *= 2
    else:
        state.done = True


def _consistent(state: SearchState, before: list[int], token: int) -> bool:
    """Whether ``token`` after ``before`` can still spell the received text."""
    model = state.model
    if model.is_end_token(token):
        # Generation stops here: the text must be complete, and end like this.
        text, _ = model.text_after(before)
        return state.ending is Ending.END_TOKEN and text == state.text
    text, pending = model.text_after([*before, token])
    target = state.target
    if state.ending is Ending.STOP_STRING and len(text) >= len(target):
        # The token completing the stop string may run past it.
        return text.startswith(target)
    return target.startswith(text) and _pending_fits(pending, target[len(text) :])


def _wants_more(state: SearchState) -> bool:
    """Whether a token after the current output could still belong to it (the
    lookahead row is read then)."""
    output = state.output
    if state.ending is Ending.LENGTH:
        return state.max_tokens is None or len(output) < state.max_tokens
    if state.ending is Ending.END_TOKEN:
        return not output or not state.model.is_end_token(output[-1])
    text, _ = state.model.text_after(output)
    return len(text) < len(state.target)


def _pending_fits(pending: bytes, rest: str) -> bool:
    """Held-back bytes must begin the next character or stand for U+FFFD; at the end
    of the text they are what the detokenizer never emitted (it holds an incomplete
    character back until a later token completes it)."""
    if not pending or not rest:
        return True
    return rest[0] == "\ufffd" or rest[0].encode("utf-8").startswith(pending)


def _complete(state: SearchState, before: list[int]) -> list[int]:
    """A segmentation of what the text still needs after ``before``."""
    model = state.model
    if before and model.is_end_token(before[-1]):
        return []
    text, pending = model.text_after(before)
    target = state.target
    if state.ending is Ending.STOP_STRING and len(text) >= len(target):
        return []
    rest = target[len(text) :] if target.startswith(text) else ""
    tail: list[int] = []
    if pending and rest:
        char = rest[0].encode("utf-8")
        if rest[0] == "\ufffd":
            # Held-back invalid bytes: guess that they are the whole U+FFFD.
            rest = rest[1:]
        elif char.startswith(pending):
            bytes_left = model.byte_tokens(char[len(pending) :])
            if bytes_left is not None:
                tail, rest = bytes_left, rest[1:]
    tail += model.segment(rest) if rest else []
    if state.ending is Ending.END_TOKEN and model.end_token is not None:
        tail.append(model.end_token)
    return tail

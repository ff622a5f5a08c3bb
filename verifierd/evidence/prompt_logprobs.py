"""vLLM's ``prompt_logprobs`` response field: read, shape-checked, made comparable.

A request may set ``prompt_logprobs: k`` (a vLLM extension; the openai SDK
sends it in ``extra_body``), and ``echo`` sets it by default (chat: to
``top_logprobs``, completions: to ``logprobs``; vLLM's ``to_sampling_params``).
The response then states the prompt's distribution: chat at the top level of
the body (one list for every choice), completions in each choice. It is the
prover's claim about the prompt it ran, checked as the echoed prompt's logprobs
are (`verifierd.engine.logprob_check`), under the same tolerance.

vLLM's shape (vllm/v1/engine/logprobs.py ``_update_prompt_logprobs``,
vllm/logprobs.py ``append_logprobs_for_next_position``): one entry per prompt
token; the first ``null`` (no value for the first token); every later entry an
object from token id (a JSON string key) to ``{logprob, rank, decoded_token}``,
the prompt's own token first with its rank (the number of tokens whose value
is at least its own), then the ``k`` best tokens with ranks 1..k (``-1``: every
token). The prompt's token among the best k is written once, at its first
place, with its place as rank: k entries; otherwise k + 1, its rank above k.
Values are clamped at -9999 and taken before any sampling processing.

vLLM writes the field only in a response that is not streamed: its streaming
request validation refuses ``prompt_logprobs`` above 0 (and -1), and none of
its stream chunk models (``ChatCompletionStreamResponse``,
``CompletionStreamResponse`` and their choices) has the field, so a stream
asking for 0 states nothing. A stream that states one is therefore a problem,
as is a response that states it for a request that never asked for it
(`unasked`): both are claim mismatches.

`comparable` turns a claim that has vLLM's shape into the echo comparison's
terms (`verifierd.evidence.logprobs.LogprobsClaim`), naming each token by its
id, so values are matched by id, not by name; `rank_deviation` measures a
claimed rank against the verifier's values in the same units (nats or logits).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from verifierd.evidence.logprobs import (
    ClaimedPosition,
    LogprobsClaim,
    LogprobsClaimError,
    ShapeMismatch,
    TopEntry,
    claimed_number,
    response_documents,
)

_SNIPPET = 40
#: The problem of a stream that states prompt logprobs.
STREAMED = "prompt_logprobs in a stream (vLLM's stream chunks have no such field)"


@dataclass(frozen=True)
class StatedLogprob:
    """One entry of a prompt position's object, in the order the response gives it."""

    token_id: int
    logprob: float
    rank: int | None
    decoded_token: str | None


@dataclass(frozen=True)
class PromptLogprobsClaim:
    """A response's ``prompt_logprobs`` for one choice."""

    #: Per prompt position: its entries, or None where the position is ``null``.
    positions: tuple[tuple[StatedLogprob, ...] | None, ...]
    #: Why the field does not read as prompt logprobs ("" when it does).
    problem: str = ""

    @property
    def ids(self) -> tuple[int | None, ...]:
        """The token each position names as the prompt's own (its first entry)."""
        return tuple(None if p is None or not p else p[0].token_id for p in self.positions)


def claimed_prompt_logprobs(
    body: bytes,
    streamed: bool,
    chat: bool,
    indices: Iterable[int],
    most_listed: int | None = None,
) -> dict[int, PromptLogprobsClaim]:
    """The ``prompt_logprobs`` each choice index of ``indices`` is stated with (chat:
    the body's, for every choice; completions: each choice's own). Choices the field
    is absent or ``null`` for claim nothing; a stream's statements are a problem.
    A position listing more than ``most_listed`` tokens (the server's bound,
    `verifierd.serving_flags.ServingFlags.most_listed`) is a problem, found before
    its entries are read."""
    shared: list[object] = []
    by_choice: dict[int, list[object]] = {}
    for document in response_documents(body, streamed):
        if not isinstance(document, dict):
            continue
        if chat:
            if document.get("prompt_logprobs") is not None:
                shared.append(document["prompt_logprobs"])
            continue
        choices = document.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, dict) or choice.get("prompt_logprobs") is None:
                continue
            index = choice.get("index", 0)
            if isinstance(index, int) and not isinstance(index, bool):
                by_choice.setdefault(index, []).append(choice["prompt_logprobs"])
    out = {}
    for index in indices:
        parts = shared if chat else by_choice.get(index, [])
        if parts and streamed:
            out[index] = PromptLogprobsClaim((), STREAMED)
        elif parts:
            out[index] = _read(parts, most_listed)
    return out


def _read(parts: Sequence[object], most_listed: int | None) -> PromptLogprobsClaim:
    try:
        positions: list[tuple[StatedLogprob, ...] | None] = []
        for part in parts:
            if not isinstance(part, list):
                raise LogprobsClaimError("prompt_logprobs is not a list")
            positions.extend(_position(entry, len(positions), most_listed) for entry in part)
        return PromptLogprobsClaim(tuple(positions))
    except LogprobsClaimError as exc:
        return PromptLogprobsClaim((), f"prompt_logprobs: {exc}")


def _position(entry: object, at: int, most_listed: int | None) -> tuple[StatedLogprob, ...] | None:
    if entry is None:
        return None
    if not isinstance(entry, dict):
        raise LogprobsClaimError(f"entry {at} is not an object")
    if most_listed is not None and len(entry) > most_listed:
        raise LogprobsClaimError(
            f"entry {at} lists {len(entry)} tokens; the server lists at most {most_listed}"
        )
    stated = []
    for key, value in entry.items():
        if not isinstance(key, str) or not key.isdecimal() or not key.isascii():
            raise LogprobsClaimError(f"entry {at} has a key that is not a token id: {key!r:.20}")
        if not isinstance(value, dict):
            raise LogprobsClaimError(f"entry {at}[{key}] is not an object")
        rank, name = value.get("rank"), value.get("decoded_token")
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int)):
            raise LogprobsClaimError(f"entry {at}[{key}].rank is not an integer")
        if name is not None and not isinstance(name, str):
            raise LogprobsClaimError(f"entry {at}[{key}].decoded_token is not a string")
        stated.append(
            StatedLogprob(
                int(key), claimed_number(value.get("logprob"), f"entry {at}[{key}]"), rank, name
            )
        )
    return tuple(stated)


def unasked(requested: int | None, claim: PromptLogprobsClaim) -> ShapeMismatch | None:
    """A mismatch when the response states prompt logprobs that vLLM, given the request
    (``requested``: its effective ``prompt_logprobs``, None when not asked), would not."""
    if requested is None and (claim.positions or claim.problem):
        return ShapeMismatch("the response states prompt_logprobs the request did not ask for")
    return None


def shape_problem(
    claim: PromptLogprobsClaim, prompt: Sequence[int], requested: int
) -> tuple[bool, str] | None:
    """Why the claim does not have vLLM's shape for the rendered ``prompt`` and the
    request's ``prompt_logprobs`` ``requested``, or None. The flag is True when the
    claim names another prompt token than the rendered one (``prompt_mismatch``)."""
    if claim.problem:
        return False, f"the response's prompt_logprobs do not read: {claim.problem}"
    if len(claim.positions) != len(prompt):
        return False, (
            f"{len(claim.positions)} prompt_logprobs entries for the {len(prompt)} tokens "
            "of the captured request's prompt"
        )
    if claim.positions and claim.positions[0] is not None:
        return False, "the first prompt_logprobs entry states values (vLLM's is null)"
    for i, (entries, token) in enumerate(zip(claim.positions, prompt, strict=True)):
        if i == 0:
            continue
        if not entries:
            return False, f"prompt_logprobs entry {i} states nothing"
        if entries[0].token_id != token:
            listed = any(e.token_id == token for e in entries)
            return not listed, (
                f"prompt_logprobs entry {i} names token id {entries[0].token_id} first; the "
                f"captured request's prompt renders token id {token} there"
                + (" (listed, not first)" if listed else "")
            )
        problem = _ranks_problem(entries, requested)
        if problem is not None:
            return False, f"prompt_logprobs entry {i}: {problem}"
    return None


def _ranks_problem(entries: Sequence[StatedLogprob], requested: int) -> str | None:
    """vLLM's layout of one position: the prompt token with its rank, then the best
    tokens with ranks 1..k in order (the prompt token's own place skipped)."""
    if any(e.rank is None for e in entries):
        return "an entry states no rank"
    if len({e.token_id for e in entries}) != len(entries):
        return "a token id is listed twice"
    own = entries[0].rank
    assert own is not None
    k = len(entries) if requested == -1 else requested
    if len(entries) == k + 1:
        expected = list(range(1, k + 1))
        if own <= k:
            return f"the prompt token's rank {own} is among the best {k}, but it is listed apart"
    elif len(entries) == k:
        if not 1 <= own <= k:
            return f"the prompt token's rank {own} is not among the best {k} it is listed with"
        expected = [r for r in range(1, k + 1) if r != own]
    else:
        return f"{len(entries)} entries; prompt_logprobs {requested} gives {k} or {k + 1}"
    ranks = [e.rank for e in entries[1:]]
    if ranks != expected:
        return f"ranks {ranks[:8]} after the prompt token's; vLLM's are {expected[:8]}"
    if any(a.logprob < b.logprob for a, b in itertools.pairwise(entries[1:])):
        return "the best tokens' values are not in non-increasing order"
    return None


def misnamed(claim: PromptLogprobsClaim, names: Mapping[int, str | None]) -> str | None:
    """How an entry's ``decoded_token`` differs from vLLM's name for its id (``names``;
    None where vLLM names the token from its context, or the id has no name), or None."""
    for i, entries in enumerate(claim.positions):
        for e in entries or ():
            name = names.get(e.token_id)
            if e.decoded_token is not None and name is not None and e.decoded_token != name:
                return (
                    f"prompt_logprobs entry {i} names token id {e.token_id} "
                    f"{e.decoded_token!r:.{_SNIPPET}}; vLLM names it {name!r:.{_SNIPPET}}"
                )
    return None


def comparable(claim: PromptLogprobsClaim) -> LogprobsClaim:
    """Positions 1 onwards of a claim that has vLLM's shape, as the echoed prompt's
    are compared: each token named by its id, the prompt token first among the top
    entries (as a completions entry lists the sampled token first)."""
    return LogprobsClaim(
        tuple(
            ClaimedPosition(
                token=str(entries[0].token_id),
                logprob=entries[0].logprob,
                token_bytes=None,
                top=tuple(TopEntry(str(e.token_id), e.logprob) for e in entries),
            )
            for entries in claim.positions[1:]
            if entries
        )
    )


def rank_deviation(claimed_rank: int, own: float, others: Sequence[float]) -> float:
    """How far the verifier's values are from giving the prompt token ``claimed_rank``
    (one more than the number of other tokens at least as likely): ``own`` is its value,
    ``others`` the verifier's best other tokens' in non-increasing order (the tokens
    below them at most their last). 0 where the claimed rank holds."""
    deviation = 0.0
    above = claimed_rank - 1  # other tokens the claim puts at or above the prompt token
    if above < len(others):
        deviation = max(deviation, others[above] - own)  # the next one must be below
    if above >= 1 and others:
        deviation = max(deviation, own - others[min(above, len(others)) - 1])
    return deviation

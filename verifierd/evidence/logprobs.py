"""The prover's logprobs: read from the captured response, compared with the verifier's.

A response to a request with ``logprobs`` (chat: ``logprobs: true`` and
``top_logprobs: N``; completions: ``logprobs: N``) carries, per output token,
the prover's statement of its own distribution. It is a claim, checked in two
ways (pure code: values in, findings out):

- **Shape** (a FAIL on its own, whatever the tolerance): one entry per output
  token the client saw; each entry names that token (chat ``token`` and its
  UTF-8 ``bytes``, completions ``tokens``) as vLLM names it; the number of top
  entries is the request's (chat: exactly N; completions: at most N + 1, the
  sampled token first, as vLLM's dict of the sampled token followed by the top
  N holds them); after the sampled token's own entry the top entries come in
  non-increasing order.
- **Values**: each claimed value against the verifier's for the same token at
  the same position, computed from the logits the scoring pass already has, as
  the committed ``logprobs_mode`` asks (`verifierd.engine.logprobs_modes`: raw
  modes always, processed ones where the recorded rows determine them). A position's
  *deviation* is the largest of |claimed - verified| over the sampled token and
  every claimed top entry, and of how far a token the verifier ranks inside the
  claimed list's range sits above the lowest claimed value when the claim leaves
  it out. Near ties at the list's edge cost their (tiny) difference only. A
  token the verifier marks ``maybe_masked`` (a processed mode whose min_p or
  top-p threshold sits within the prover's rounding of it) matches its value or
  the floor, and the claim may leave it out. The response's statistic is its
  largest deviation; the commitment's calibrated ``logprobs_tolerance`` decides
  it (`LogprobsComparison.over`).

With ``echo`` a completions claim begins with the echoed prompt's entries, as
vLLM's server joins its prompt logprobs and the output's (`split_echoed`): the
prompt's first token is named (``tokenizer.decode`` of its id) with no value
and no top entries, each later prompt token has an entry like an output token's,
its top entries the request's ``prompt_logprobs`` (default ``logprobs``) best
tokens of that prompt position.

A completions claim's ``text_offset`` (what a harness may use to find where
the output begins) is derived from its names alone, as vLLM's server writes it
(``_create_completion_logprobs``): each entry's offset is the number of
characters of the names before it, echoed prompt included, summed over a
stream's chunks. An offset that is not that sum does not read as vLLM's
(when the claim states offsets at all).

vLLM clamps every value at -9999 (its stand-in for -inf); the verifier's values
are clamped the same way. A token whose own decoding ends in U+FFFD (an
unfinished UTF-8 sequence) is renamed by vLLM from its context: its name is not
checked, its value is (a claimed top entry of a name the verifier does not list
is compared with such a token's value, or taken as a token below the verifier's
list: a masked entry at the floor is one).
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Iterator, Mapping, Sequence, Sized
from dataclasses import dataclass

from verifierd.serving_flags import VLLM_DEFAULTS

#: vLLM's floor for a reported value.
FLOOR = -9999.0
#: The most best tokens a verifier pass records per position: vLLM's default
#: ``--max-logprobs``. A claim of a server started with a higher bound lists more; those
#: below the recorded ones are compared with the lowest recorded value.
MAX_TOP = VLLM_DEFAULTS.max_logprobs
_REPLACEMENT = "\ufffd"
_LINE_END = re.compile("\r\n|\r|\n")


@dataclass(frozen=True)
class TopEntry:
    token: str
    logprob: float


@dataclass(frozen=True)
class RankedToken:
    """One of the verifier's most likely tokens."""

    #: vLLM's name for it; None where vLLM names it from its context.
    token: str | None
    logprob: float
    #: The prover's numerics may have masked it (a kept set left open by a threshold
    #: within its rounding): the floor matches too, and the claim may leave it out.
    maybe_masked: bool = False


@dataclass(frozen=True)
class ClaimedPosition:
    """One output token's entry as the prover states it."""

    token: str
    #: None: the entry states no value (vLLM's for the echoed prompt's first token).
    logprob: float | None
    #: Chat only: the UTF-8 bytes the entry claims for ``token`` (None when absent).
    token_bytes: tuple[int, ...] | None
    top: tuple[TopEntry, ...]


@dataclass(frozen=True)
class LogprobsClaim:
    positions: tuple[ClaimedPosition, ...]
    #: Why the response's logprobs do not read as logprobs ("" when they do).
    problem: str = ""


@dataclass(frozen=True)
class VerifiedPosition:
    """The verifier's values at one output position."""

    #: vLLM's name for the scored token; None when vLLM names it from its context.
    token: str | None
    #: The scored token's value; None when the recomputed row does not hold it (the
    #: top entries are still compared).
    logprob: float | None
    #: The verifier's most likely tokens in non-increasing order (at least as many
    #: as the claim may list).
    top: tuple[RankedToken, ...]


@dataclass(frozen=True)
class ShapeMismatch:
    """The claim does not have the shape vLLM gives the client's tokens (a FAIL:
    ``Reason.LOGPROBS_MISMATCH``)."""

    detail: str


class LogprobsClaimError(ValueError):
    """The response's logprobs do not have the shape of logprobs."""


def claimed_logprobs(
    dialect: str, body: bytes, streamed: bool, chat: bool, most_listed: int | None = None
) -> dict[int, LogprobsClaim]:
    """Each choice's logprobs claim by choice index (choices without logprobs, and a
    body that is not JSON, claim nothing). A choice whose logprobs do not read as
    logprobs gets a claim with its ``problem``.

    ``chat`` selects the chat form (``logprobs.content``) over completions'
    (``tokens`` / ``token_logprobs`` / ``top_logprobs``); ``dialect`` names the
    API in problems. A position listing more than ``most_listed`` top entries (the
    server's bound, `verifierd.serving_flags.ServingFlags.most_listed`) is a problem,
    found before its entries are read. Linear in the body."""
    pieces: dict[int, list[object]] = {}
    for document in response_documents(body, streamed):
        choices = document.get("choices") if isinstance(document, dict) else None
        if not isinstance(choices, list):
            continue
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            logprobs = choice.get("logprobs")
            index = choice.get("index", 0)
            if logprobs is None or not isinstance(index, int) or isinstance(index, bool):
                continue
            pieces.setdefault(index, []).append(logprobs)
    out = {}
    for index, parts in pieces.items():
        try:
            positions = tuple(
                p
                for part in parts
                for p in (
                    _chat_part(part, most_listed) if chat else _completions_part(part, most_listed)
                )
            )
            if not chat:
                _check_text_offsets(parts)
            out[index] = LogprobsClaim(positions)
        except LogprobsClaimError as exc:
            out[index] = LogprobsClaim((), f"{dialect} choice {index}: {exc}")
    return out


def response_documents(body: bytes, streamed: bool) -> Iterator[object]:
    """The JSON documents the client read: the body, or each event's data."""
    if not streamed:
        try:
            yield json.loads(body)
        except ValueError:
            return  # a capture the collector could not read either: nothing claimed
        return
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        # The client's SDK raises on the line that does not decode: its stream ends there.
        text = body[: exc.start].decode("utf-8")
    data: list[str] = []
    for line in _LINE_END.split(text)[:-1]:
        if line.startswith("data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(" ") else value)
        elif not line and data:
            payload, data = "\n".join(data), []
            if payload.startswith("[DONE]"):
                return
            try:
                yield json.loads(payload)
            except ValueError:
                continue  # not a chunk the client could read: no claim in it


def claimed_number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise LogprobsClaimError(f"{what} is not a number: {value!r:.40}")
    number = float(value)
    if not math.isfinite(number):
        raise LogprobsClaimError(f"{what} is not finite: {number}")
    return number


def _text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise LogprobsClaimError(f"{what} is not a string: {value!r:.40}")
    return value


def _byte_list(value: object, what: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(
        isinstance(b, int) and not isinstance(b, bool) and 0 <= b < 256 for b in value
    ):
        raise LogprobsClaimError(f"{what} is not a list of bytes")
    return tuple(value)


def _listed(top: Sized, at: int, most_listed: int | None) -> None:
    if most_listed is not None and len(top) > most_listed:
        raise LogprobsClaimError(
            f"entry {at} lists {len(top)} top_logprobs; the server lists at most {most_listed}"
        )


def _chat_part(part: object, most_listed: int | None) -> Iterator[ClaimedPosition]:
    if not isinstance(part, dict):
        raise LogprobsClaimError("logprobs is not an object")
    content = part.get("content")
    if content is None:
        return
    if not isinstance(content, list):
        raise LogprobsClaimError("logprobs.content is not a list")
    for i, entry in enumerate(content):
        if not isinstance(entry, dict):
            raise LogprobsClaimError(f"logprobs.content[{i}] is not an object")
        top = entry.get("top_logprobs", [])
        if top is None:
            top = []
        if not isinstance(top, list) or not all(isinstance(t, dict) for t in top):
            raise LogprobsClaimError(f"logprobs.content[{i}].top_logprobs is not a list")
        _listed(top, i, most_listed)
        yield ClaimedPosition(
            token=_text(entry.get("token"), f"content[{i}].token"),
            logprob=claimed_number(entry.get("logprob"), f"content[{i}].logprob"),
            token_bytes=_byte_list(entry.get("bytes"), f"content[{i}].bytes"),
            top=tuple(
                TopEntry(
                    _text(t.get("token"), f"content[{i}].top_logprobs[{j}].token"),
                    claimed_number(t.get("logprob"), f"content[{i}].top_logprobs[{j}].logprob"),
                )
                for j, t in enumerate(top)
            ),
        )


def _completions_part(part: object, most_listed: int | None) -> Iterator[ClaimedPosition]:
    if not isinstance(part, dict):
        raise LogprobsClaimError("logprobs is not an object")
    tokens = part.get("tokens") or []
    values = part.get("token_logprobs") or []
    tops = part.get("top_logprobs") or []
    if not all(isinstance(x, list) for x in (tokens, values, tops)):
        raise LogprobsClaimError("tokens, token_logprobs and top_logprobs must be lists")
    if not len(tokens) == len(values) or (tops and len(tops) != len(tokens)):
        raise LogprobsClaimError(
            f"{len(tokens)} tokens, {len(values)} token_logprobs, {len(tops)} top_logprobs"
        )
    for i, token in enumerate(tokens):
        top = tops[i] if tops else {}
        if top is None:
            top = {}
        if not isinstance(top, dict):
            raise LogprobsClaimError(f"top_logprobs[{i}] is not an object")
        if values[i] is None and top:
            raise LogprobsClaimError(f"token_logprobs[{i}] is null beside top_logprobs")
        _listed(top, i, most_listed)
        yield ClaimedPosition(
            token=_text(token, f"tokens[{i}]"),
            logprob=None
            if values[i] is None
            else claimed_number(values[i], f"token_logprobs[{i}]"),
            token_bytes=None,
            top=tuple(
                TopEntry(k, claimed_number(v, f"top_logprobs[{i}][{k!r:.20}]"))
                for k, v in top.items()
            ),
        )


def _check_text_offsets(parts: Sequence[object]) -> None:
    """Raise unless each stated ``text_offset`` is the characters of the names before
    it (the parts as `_completions_part` read them: objects with lists of names)."""
    at = position = 0
    for part in parts:
        if not isinstance(part, dict):
            continue
        tokens = part.get("tokens") or []
        offsets = part.get("text_offset")
        if offsets is not None and (not isinstance(offsets, list) or len(offsets) != len(tokens)):
            raise LogprobsClaimError(f"text_offset is not a list of {len(tokens)} offsets")
        for i, token in enumerate(tokens):
            stated = at if offsets is None else offsets[i]
            if isinstance(stated, bool) or stated != at:
                raise LogprobsClaimError(
                    f"text_offset of entry {position + i} is {stated!r:.20}; the names "
                    f"before it have {at} characters"
                )
            at += len(token)
        position += len(tokens)


def verified_name(decoded: str) -> str | None:
    """The name a claim must give a token vLLM decodes to ``decoded`` (None: vLLM
    renames it from its context, see the module docstring)."""
    return None if decoded.endswith(_REPLACEMENT) else decoded


@dataclass(frozen=True)
class LogprobsComparison:
    """Per compared position: the deviation, and the token and both values where it is
    largest. The echoed prompt's positions (its tokens 1 onwards, `split_echoed`) come
    first when there are any, then the output's."""

    deviations: tuple[float, ...]
    tokens: tuple[str, ...]
    claimed: tuple[float, ...]
    verified: tuple[float, ...]
    #: How many of the positions are the echoed prompt's (its tokens 1, 2, ...).
    prompt_positions: int = 0
    #: How many of the positions, the last ones, are the response's ``prompt_logprobs``
    #: (prompt tokens 1, 2, ...; `verifierd.evidence.prompt_logprobs`).
    stated_prompt_positions: int = 0

    @property
    def largest(self) -> float:
        return max(self.deviations, default=0.0)

    def over(self, tolerance: float) -> str | None:
        """The evidence of the first position whose deviation exceeds ``tolerance``."""
        stated_from = len(self.deviations) - self.stated_prompt_positions
        for i, deviation in enumerate(self.deviations):
            if deviation > tolerance:
                if i >= stated_from:
                    where = f"prompt_logprobs entry {i - stated_from + 1}"
                elif i < self.prompt_positions:
                    where = f"echoed prompt token {i + 1}"
                else:
                    where = f"output position {i - self.prompt_positions}"
                return (
                    f"logprobs differ at {where} by {deviation:.6g} "
                    f"(tolerance {tolerance:.6g}): token {self.tokens[i]!r} claimed "
                    f"{self.claimed[i]:.6g}, recomputed {self.verified[i]:.6g}"
                )
        return None

    def after_prompt(self, prompt: LogprobsComparison) -> LogprobsComparison:
        """This output comparison preceded by the echoed ``prompt``'s."""
        return LogprobsComparison(
            prompt.deviations + self.deviations,
            prompt.tokens + self.tokens,
            prompt.claimed + self.claimed,
            prompt.verified + self.verified,
            prompt_positions=len(prompt.deviations),
        )

    def then_stated_prompt(self, stated: LogprobsComparison) -> LogprobsComparison:
        """This comparison followed by the ``prompt_logprobs`` field's, ``stated``."""
        return LogprobsComparison(
            self.deviations + stated.deviations,
            self.tokens + stated.tokens,
            self.claimed + stated.claimed,
            self.verified + stated.verified,
            prompt_positions=self.prompt_positions,
            stated_prompt_positions=len(stated.deviations),
        )


@dataclass(frozen=True)
class EchoedClaim:
    """A completions claim split as vLLM's server joined it with ``echo``."""

    #: The echoed prompt's first token: named, with no value and no top entries.
    first: ClaimedPosition
    #: The echoed prompt's later tokens (its tokens 1 onwards).
    prompt: LogprobsClaim
    output: LogprobsClaim


def split_echoed(claim: LogprobsClaim, prompt_len: int) -> EchoedClaim | ShapeMismatch:
    """The entries of a ``prompt_len``-token echoed prompt, then the output's."""
    if claim.problem:
        return ShapeMismatch(f"the response's logprobs do not read: {claim.problem}")
    positions = claim.positions
    if prompt_len < 1 or len(positions) < prompt_len:
        return ShapeMismatch(
            f"{len(positions)} logprobs entries, fewer than the {prompt_len} tokens "
            "of the echoed prompt"
        )
    first = positions[0]
    if first.logprob is not None or first.top:
        return ShapeMismatch("the echoed prompt's first entry states a value (vLLM's has none)")
    return EchoedClaim(
        first,
        LogprobsClaim(positions[1:prompt_len]),
        LogprobsClaim(positions[prompt_len:]),
    )


def echoed_spelling(echoed: EchoedClaim, names: Sequence[str | None]) -> str | None:
    """How the echoed prompt's entries name other tokens than ``names``, the rendered
    prompt's (None where vLLM names a token from its context), or None."""
    claimed = [echoed.first.token, *(c.token for c in echoed.prompt.positions)]
    for i, (token, name) in enumerate(zip(claimed, names, strict=True)):
        if name is not None and token != name:
            return (
                f"the logprobs of the echoed prompt name {token!r:.40} as its token {i}; "
                f"the captured request's prompt renders {name!r:.40} there"
            )
    return None


def compare(
    claim: LogprobsClaim,
    verified: Sequence[VerifiedPosition],
    *,
    chat: bool,
    requested_top: int,
) -> LogprobsComparison | ShapeMismatch:
    """The claim's shape against the output, then its values against the verifier's."""
    mismatch = check_shape(
        claim, [v.token for v in verified], chat=chat, requested_top=requested_top
    )
    if mismatch is not None:
        return mismatch
    rows = [_deviation(c, v) for c, v in zip(claim.positions, verified, strict=True)]
    return LogprobsComparison(
        deviations=tuple(r[0] for r in rows),
        tokens=tuple(r[1] for r in rows),
        claimed=tuple(r[2] for r in rows),
        verified=tuple(r[3] for r in rows),
    )


def check_shape(
    claim: LogprobsClaim, names: Sequence[str | None], *, chat: bool, requested_top: int
) -> ShapeMismatch | None:
    """The claim's shape against the output tokens' names (None: vLLM names that
    token from its context), or None when it holds."""
    if claim.problem:
        return ShapeMismatch(f"the response's logprobs do not read: {claim.problem}")
    if len(claim.positions) != len(names):
        return ShapeMismatch(
            f"{len(claim.positions)} logprobs entries for the {len(names)} output tokens"
        )
    for i, (c, name) in enumerate(zip(claim.positions, names, strict=True)):
        problem = _shape_problem(c, name, chat=chat, requested_top=requested_top)
        if problem is not None:
            return ShapeMismatch(f"output position {i}: {problem}")
    return None


def _shape_problem(
    c: ClaimedPosition, name: str | None, *, chat: bool, requested_top: int
) -> str | None:
    if name is not None and c.token != name:
        return f"the entry names {c.token!r:.40}, the client's token is {name!r:.40}"
    if c.logprob is None:
        return "the entry states no logprob"
    if c.token_bytes is not None and c.token_bytes != tuple(c.token.encode("utf-8", "replace")):
        return f"the entry's bytes are not the UTF-8 of {c.token!r:.40}"
    n = len(c.top)
    if chat and n != requested_top:
        return f"{n} top_logprobs, the request asked for {requested_top}"
    if not chat and (n > requested_top + 1 or (requested_top and n == 0)):
        return f"{n} top_logprobs, the request asked for {requested_top}"
    # Completions' top entries are a dict by token name: a second token of the same
    # name overwrites the sampled one's value in place.
    if n and (c.top[0].token != c.token or (chat and c.top[0].logprob != c.logprob)):
        return "the first top_logprobs entry is not the sampled token's"
    rest = [t.logprob for t in c.top[1:]]
    if any(a < b for a, b in itertools.pairwise(rest)):
        return "top_logprobs are not in non-increasing order"
    return None


def _deviation(c: ClaimedPosition, v: VerifiedPosition) -> tuple[float, str, float, float]:
    """(deviation, token, claimed, verified) of the entry that deviates most."""
    stated = c.logprob
    if stated is None:
        raise ValueError("an entry without a value is not compared (check_shape refuses it)")
    # Two tokens may share a name: a claimed value is compared with the nearest. A
    # token vLLM names from its context may carry any claimed name.
    mine: dict[str | None, list[float]] = {}
    for ranked in v.top:
        mine.setdefault(ranked.token, []).append(max(FLOOR, ranked.logprob))
        if ranked.maybe_masked:
            mine[ranked.token].append(FLOOR)
    unnamed = mine.get(None, [])
    worst = (
        (0.0, c.token, stated, math.nan)
        if v.logprob is None
        else (abs(stated - max(FLOOR, v.logprob)), c.token, stated, max(FLOOR, v.logprob))
    )
    listed = c.top[1:]
    if not listed:
        return worst
    lowest_mine = max(FLOOR, min((ranked.logprob for ranked in v.top), default=FLOOR))
    for t in listed:
        # A token the verifier does not rank this high: at most a near tie at the edge.
        candidate = (max(0.0, t.logprob - lowest_mine), t.token, t.logprob, lowest_mine)
        values = mine.get(t.token)
        if values is not None or unnamed:
            # Or one the verifier lists unnamed (when the name is not its own).
            theirs = min(values or unnamed, key=lambda x: abs(x - t.logprob))
            named_match = (abs(t.logprob - theirs), t.token, t.logprob, theirs)
            candidate = named_match if values else min(candidate, named_match)
        worst = max(worst, candidate, key=lambda r: r[0])
    lowest_claimed = min(t.logprob for t in listed)
    named = {t.token for t in listed} | {c.token}
    for ranked in _leading(v.top, c.token, len(listed)):
        name = ranked.token
        if name is not None and name not in named and not ranked.maybe_masked:
            candidate = (ranked.logprob - lowest_claimed, name, lowest_claimed, ranked.logprob)
            worst = max(worst, candidate, key=lambda r: r[0])
    return worst


def _leading(top: Sequence[RankedToken], sampled: str, count: int) -> list[RankedToken]:
    """The verifier's ``count`` most likely tokens other than the sampled one."""
    return [t for t in top if t.token != sampled][:count]


def top_count(request: Mapping[str, object], chat: bool) -> int:
    """The top entries the request asked for per position (vLLM's reading)."""
    value = request.get("top_logprobs") if chat else request.get("logprobs")
    if isinstance(value, bool) or not isinstance(value, int):
        return 0
    return max(0, value)


def echoed_top_count(echo: bool, logprobs: int | None, prompt_logprobs: int | None) -> int | None:
    """The top entries per echoed prompt token of a completions request with these
    (validated) fields, None when its response's logprobs hold no echoed prompt.

    vLLM computes ``prompt_logprobs`` (default ``logprobs``; -1 the whole row) best
    tokens of each prompt position and shows at most ``logprobs`` of them."""
    if not echo or logprobs is None:
        return None
    shown = max(0, logprobs)
    if prompt_logprobs is None or prompt_logprobs == -1:
        return shown
    return max(0, min(shown, prompt_logprobs))

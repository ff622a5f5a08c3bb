"""A choice's logprobs claim against the verifier's rows (engine side: the tokenizer is here).

The rows come from the passes that scored the output (`logprob_rows`): one pass
when the ids were claimed, several when the tokenization search found them. An
output position's values are taken from the last pass whose sequence agrees
with the final output up to and including that position, so each value is
conditioned on exactly the prefix the prover's sampler saw. Token names are
vLLM's own (``convert_ids_list_to_tokens``, what its server puts in ``token``).
The values are the committed ``--logprobs-mode``'s, derived from the recorded
rows (`verifierd.engine.logprobs_modes`); where the mode cannot be replayed for
the request, only the claim's shape is checked.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from verifierd.difr import SamplingSettings
from verifierd.engine.kept_sets import SLACKS
from verifierd.engine.logprob_rows import LogprobRows, LogprobsSpec
from verifierd.engine.logprobs_modes import ModeReplay, Reading, mode_replay
from verifierd.evidence.claims import Finding, first_difference
from verifierd.evidence.client_view import CHAT, ChoiceEvidence
from verifierd.evidence.logprobs import (
    FLOOR,
    MAX_TOP,
    ClaimedPosition,
    LogprobsComparison,
    RankedToken,
    ShapeMismatch,
    VerifiedPosition,
    check_shape,
    compare,
    top_count,
    verified_name,
)
from verifierd.logit_adjustments import LogitAdjustments
from verifierd.verdicts import Reason

#: A pass's output ids and the rows it recorded.
PassRows = tuple[tuple[int, ...], LogprobRows]


class ScoredChoice(Protocol):
    """What a scoring request says about its choice (verifierd.engine.backend.ScoreRequest)."""

    @property
    def evidence(self) -> ChoiceEvidence | None: ...
    @property
    def sampling(self) -> SamplingSettings: ...
    @property
    def adjustments(self) -> LogitAdjustments: ...
    @property
    def logprobs_mode(self) -> str: ...


def _requested_top(evidence: ChoiceEvidence) -> int:
    request = json.loads(evidence.request_json)
    return top_count(request if isinstance(request, dict) else {}, evidence.dialect == CHAT)


def _replay(choice: ScoredChoice) -> ModeReplay | None:
    evidence = choice.evidence
    if evidence is None or evidence.claimed_logprobs is None:
        return None
    requested = min(MAX_TOP, _requested_top(evidence))
    return mode_replay(choice.logprobs_mode, choice.sampling, choice.adjustments, requested)


def logprobs_spec(choice: ScoredChoice) -> LogprobsSpec | None:
    """What a scoring pass of this choice records: None when the response states no
    logprobs or the committed mode cannot be replayed for it."""
    replay = _replay(choice)
    return None if replay is None else replay.spec()


def check_logprobs(
    choice: ScoredChoice,
    output: Sequence[int],
    passes: Sequence[PassRows],
    tokenizer: Any,
) -> LogprobsComparison | Finding | None:
    """The comparison of the choice's claim with the verifier's values; only its shape
    where the rows do not give them (a mode not replayed for the request, an output
    position no pass covered): then None when it holds."""
    evidence = choice.evidence
    claim = None if evidence is None else evidence.claimed_logprobs
    if evidence is None or claim is None:
        return None
    from vllm.tokenizers.detokenizer_utils import convert_ids_list_to_tokens

    chat, requested = evidence.dialect == CHAT, _requested_top(evidence)
    replay = _replay(choice)
    readings = [] if replay is None else [replay.readings(rows) for _, rows in passes]
    found = (
        None
        if replay is None or any(r is None for r in readings)
        else _rows_by_position(output, passes)
    )
    if found is None:
        output_names = convert_ids_list_to_tokens(tokenizer, list(output))
        shape = check_shape(
            claim, [verified_name(n) for n in output_names], chat=chat, requested_top=requested
        )
        return None if shape is None else Finding(Reason.LOGPROBS_MISMATCH, shape.detail)

    ids: list[int] = []
    for i, (rows, r, _) in enumerate(found):
        ids.append(output[i])
        ids.extend(int(t) for t in rows.top_ids[r])
    names = iter(convert_ids_list_to_tokens(tokenizer, ids))
    named = []
    for rows, r, _ in found:
        sampled = verified_name(next(names))
        named.append((sampled, [verified_name(next(names)) for _ in rows.top_ids[r]]))
    mismatch = check_shape(
        claim, [sampled for sampled, _ in named], chat=chat, requested_top=requested
    )
    if mismatch is not None:
        return Finding(Reason.LOGPROBS_MISMATCH, mismatch.detail)
    pass_of = {id(rows): p for p, (_, rows) in enumerate(passes)}
    at = [readings[pass_of[id(rows)]] or [] for rows, _, _ in found]
    compared = []
    for level, slack in enumerate(SLACKS if any(len(a) > 1 for a in at) else (0.0,)):
        verified = [
            _verified(a[min(level, len(a) - 1)], position, names, c)
            for a, position, names, c in zip(at, found, named, claim.positions, strict=True)
        ]
        result = compare(claim, verified, chat=chat, requested_top=requested)
        if isinstance(result, ShapeMismatch):
            return Finding(Reason.LOGPROBS_MISMATCH, result.detail)
        compared.append((slack, result))
    return _least_slack(compared)


def _verified(
    reading: Reading,
    position: tuple[LogprobRows, int, float | None],
    names: tuple[str | None, Sequence[str | None]],
    claimed: ClaimedPosition,
) -> VerifiedPosition:
    """The verifier's position under ``reading`` (the rows, row and scored value of
    `_rows_by_position`; vLLM's names of the scored and top tokens), its normaliser
    (``processed_logprobs``) the one in the reading's range nearest the claim."""
    rows, r, value = position
    sampled, top_names = names
    top, maybe = reading.values(r, rows.top_values[r])
    scored = None if value is None else reading.values(r, np.array([value]))[0][0]
    lo, hi = reading.normalisers(r)
    norm = lo
    if lo != hi:
        offsets = [] if scored is None or not np.isfinite(scored) else [scored - claimed.logprob]
        mine = {n: v for n, v, m in zip(top_names, top, maybe, strict=True) if not m}
        offsets += [
            mine[t.token] - t.logprob
            for t in claimed.top
            if t.logprob > FLOOR and np.isfinite(mine.get(t.token, -np.inf))
        ]
        if offsets:
            norm = np.float32(np.clip((min(offsets) + max(offsets)) / 2, lo, hi))
    return VerifiedPosition(
        sampled,
        None if scored is None else float(scored - norm),
        tuple(
            RankedToken(n, float(v - norm), bool(m))
            for n, v, m in zip(top_names, top, maybe, strict=True)
        ),
    )


def _least_slack(compared: Sequence[tuple[float, LogprobsComparison]]) -> LogprobsComparison:
    """Per position, the reading of least max(slack, deviation) (module docstring of
    `verifierd.engine.logprobs_modes`)."""
    scores = [[max(slack, d) for d in comparison.deviations] for slack, comparison in compared]
    best = [
        min(range(len(compared)), key=[s[i] for s in scores].__getitem__)
        for i in range(len(scores[0]))
    ]
    return LogprobsComparison(
        deviations=tuple(scores[k][i] for i, k in enumerate(best)),
        tokens=tuple(compared[k][1].tokens[i] for i, k in enumerate(best)),
        claimed=tuple(compared[k][1].claimed[i] for i, k in enumerate(best)),
        verified=tuple(compared[k][1].verified[i] for i, k in enumerate(best)),
    )


def _rows_by_position(
    output: Sequence[int], passes: Sequence[PassRows]
) -> list[tuple[LogprobRows, int, float | None]] | None:
    """For each output position, the rows and row index that hold its values, and the
    value of the output's token there (None: not known, see `_sampled_value`)."""
    spans = []
    for pass_output, rows in passes:
        agree = first_difference(pass_output, output)
        spans.append((pass_output, rows, agree))
    found = []
    for i in range(len(output)):
        # The row's distribution needs the prefix before i; its scored value, token i too.
        rows_at = [
            (o, rows, agree)
            for o, rows, agree in reversed(spans)
            if rows.first <= i < rows.first + len(rows.sampled) and i <= agree
        ]
        if not rows_at:
            return None
        exact = next(((rows, agree) for _, rows, agree in rows_at if i < agree), None)
        rows, _ = exact if exact is not None else (rows_at[0][1], rows_at[0][2])
        r = i - rows.first
        found.append((rows, r, _sampled_value(rows, r, output[i], exact is not None)))
    return found


def _sampled_value(rows: LogprobRows, r: int, token: int, scored: bool) -> float | None:
    """The value of ``token`` in row ``r``. Where the search adopted the sampler's own
    pick the row was computed for the token it replaced; the pick's value is then
    known only when it is among the row's top entries."""
    if scored and not math.isnan(float(rows.sampled[r])):
        return float(rows.sampled[r])
    hits = [
        float(v) for t, v in zip(rows.top_ids[r], rows.top_values[r], strict=True) if t == token
    ]
    return hits[0] if hits else None

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

A completions claim with ``echo`` begins with the echoed prompt's entries
(`verifierd.evidence.logprobs.split_echoed`). Their names must be the rendered
prompt's as vLLM names them (its first token ``tokenizer.decode`` of the id,
the others as output tokens are named), else ``prompt_mismatch``; their values
are compared with the rows of a pass over the prompt alone (`echoed_prompt_spec`),
which vLLM computes for ``prompt_logprobs`` in every mode without the sampler's
processing (vllm/v1/worker/gpu_model_runner.py ``_get_prompt_logprobs_dict``:
``raw_logits`` and ``processed_logits`` give the logits in float32, the
logprobs modes their float32 ``log_softmax``), so whatever the request's
sampling and adjustments. The prompt's deviations join the output's in one
statistic, judged against the same calibrated tolerance: they come from the
same logits rows of the same prefill arithmetic as the output's raw values.

vLLM's ``prompt_logprobs`` response field (`verifierd.evidence.prompt_logprobs`)
is checked against the same prompt pass (`check_prompt_logprobs`): its shape
against the rendered prompt (else ``prompt_mismatch`` where it names another
prompt token, ``logprobs_mismatch`` otherwise), its values matched by token id
and its prompt token's rank measured against the verifier's values; its
deviations follow the rest in the one statistic, under the same tolerance.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
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
    LogprobsClaim,
    LogprobsComparison,
    RankedToken,
    ShapeMismatch,
    VerifiedPosition,
    check_shape,
    compare,
    echoed_spelling,
    split_echoed,
    top_count,
    verified_name,
)
from verifierd.evidence.prompt_logprobs import (
    PromptLogprobsClaim,
    comparable,
    misnamed,
    rank_deviation,
    shape_problem,
    unasked,
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


@dataclass(frozen=True)
class EchoedPrompt:
    """The echoed prompt heading a choice's logprobs claim, and the verifier's rows of it."""

    ids: tuple[int, ...]
    #: Top entries per prompt token the claim may show.
    top: int
    #: The prompt pass's rows (positions predicting tokens 1 onwards).
    rows: LogprobRows


def echoed_prompt_spec(
    choice: ScoredChoice, echoed: bool, prompt_logprobs: int | None
) -> LogprobsSpec | None:
    """What a pass over the prompt records for this choice: the mode's raw values (the
    prompt is not processed), at least the top entries the claims may list and the
    prompt's own token; None when the response states neither an ``echoed`` prompt's
    logprobs nor the ``prompt_logprobs`` the request asked for (its effective value)."""
    evidence = choice.evidence
    if evidence is None:
        return None
    tops = []
    if echoed and evidence.claimed_logprobs is not None:
        tops.append(_requested_top(evidence))
    if prompt_logprobs is not None and evidence.claimed_prompt_logprobs is not None:
        tops.append(MAX_TOP if prompt_logprobs == -1 else prompt_logprobs)
    if not tops:
        return None
    recorded = "raw_logits" if choice.logprobs_mode.endswith("_logits") else "raw_logprobs"
    return LogprobsSpec(min(MAX_TOP, max(tops)) + 1, recorded)


def check_prompt_logprobs(
    choice: ScoredChoice,
    requested: int | None,
    prompt: Sequence[int],
    rows: LogprobRows | None,
    tokenizer: Any,
) -> LogprobsComparison | Finding | None:
    """The response's ``prompt_logprobs`` (`verifierd.evidence.prompt_logprobs`) against
    the rendered ``prompt`` and the verifier's ``rows`` of a pass over it (None: a
    one-token prompt, no pass), for a request whose effective ``prompt_logprobs`` is
    ``requested``; None when the response states none."""
    from vllm.tokenizers.detokenizer_utils import convert_ids_list_to_tokens

    evidence = choice.evidence
    claim = None if evidence is None else evidence.claimed_prompt_logprobs
    if claim is None:
        return None
    extra = unasked(requested, claim)
    if extra is not None:
        return Finding(Reason.LOGPROBS_MISMATCH, extra.detail)
    assert requested is not None
    problem = shape_problem(claim, prompt, requested)
    if problem is not None:
        other_prompt, detail = problem
        return Finding(Reason.PROMPT_MISMATCH if other_prompt else Reason.LOGPROBS_MISMATCH, detail)
    later = len(prompt) - 1
    if later == 0:
        return None
    if rows is None or len(rows.sampled) != later:
        detail = f"no rows recomputed for the prompt's {later} later tokens"
        return Finding(Reason.TOKENS_UNAVAILABLE, detail)
    stated = sorted({e.token_id for entries in claim.positions for e in entries or ()})
    try:
        names = convert_ids_list_to_tokens(tokenizer, stated)
    except (IndexError, OverflowError, TypeError, ValueError):
        return Finding(Reason.LOGPROBS_MISMATCH, "prompt_logprobs list ids outside the vocabulary")
    misnamed_at = misnamed(
        claim,
        {i: None if n is None else verified_name(n) for i, n in zip(stated, names, strict=True)},
    )
    if misnamed_at is not None:
        return Finding(Reason.LOGPROBS_MISMATCH, misnamed_at)
    verified = [
        VerifiedPosition(
            str(prompt[r + 1]),
            float(rows.sampled[r]),
            tuple(
                RankedToken(str(int(t)), float(v))
                for t, v in zip(rows.top_ids[r], rows.top_values[r], strict=True)
            ),
        )
        for r in range(later)
    ]
    # -1 lists every token: as many top entries as the claim's longest position has.
    top = max((len(p or ()) for p in claim.positions), default=0) if requested == -1 else requested
    compared = compare(comparable(claim), verified, chat=False, requested_top=top)
    if isinstance(compared, ShapeMismatch):
        return Finding(Reason.LOGPROBS_MISMATCH, f"prompt_logprobs: {compared.detail}")
    return _with_ranks(compared, claim, prompt, rows)


def _with_ranks(
    compared: LogprobsComparison,
    claim: PromptLogprobsClaim,
    prompt: Sequence[int],
    rows: LogprobRows,
) -> LogprobsComparison:
    """``compared`` with each position's deviation raised to its claimed rank's
    (`verifierd.evidence.prompt_logprobs.rank_deviation`) where that is larger."""
    deviations, tokens = list(compared.deviations), list(compared.tokens)
    claimed, verified = list(compared.claimed), list(compared.verified)
    for r, entries in enumerate(claim.positions[1:]):
        if not entries or entries[0].rank is None:
            continue
        own_rank = entries[0].rank
        own = max(FLOOR, float(rows.sampled[r]))
        others = [
            max(FLOOR, float(v))
            for t, v in zip(rows.top_ids[r], rows.top_values[r], strict=True)
            if int(t) != prompt[r + 1]
        ]
        deviation = rank_deviation(own_rank, own, others)
        if deviation > deviations[r]:
            deviations[r] = deviation
            tokens[r] = f"rank {own_rank} of {prompt[r + 1]}"
            claimed[r], verified[r] = entries[0].logprob, own
    return LogprobsComparison(
        tuple(deviations),
        tuple(tokens),
        tuple(claimed),
        tuple(verified),
        stated_prompt_positions=len(deviations),
    )


def check_logprobs(
    choice: ScoredChoice,
    output: Sequence[int],
    passes: Sequence[PassRows],
    tokenizer: Any,
    echoed: EchoedPrompt | None = None,
) -> LogprobsComparison | Finding | None:
    """The comparison of the choice's claim with the verifier's values; only its shape
    where the rows do not give them (a mode not replayed for the request, an output
    position no pass covered): then None when it holds. With ``echoed`` the claim's
    echoed prompt is split off first and checked (module docstring)."""
    evidence = choice.evidence
    claim = None if evidence is None else evidence.claimed_logprobs
    if evidence is None or claim is None:
        return None
    prompt_compared = None
    if echoed is not None:
        split = _echoed(claim, echoed, tokenizer)
        if isinstance(split, Finding):
            return split
        prompt_compared, claim = split
    checked = _check_output(
        choice, evidence, claim, output=output, passes=passes, tokenizer=tokenizer
    )
    if prompt_compared is None or isinstance(checked, Finding):
        return checked
    if checked is None:
        # The output's values were not replayed: its deviations are unknown, not 0.
        return prompt_compared
    return checked.after_prompt(prompt_compared)


def _echoed(
    claim: LogprobsClaim, echoed: EchoedPrompt, tokenizer: Any
) -> tuple[LogprobsComparison, LogprobsClaim] | Finding:
    """The echoed prompt's comparison and the output's claim, or a FAIL."""
    from vllm.tokenizers.detokenizer_utils import convert_ids_list_to_tokens

    split = split_echoed(claim, len(echoed.ids))
    if isinstance(split, ShapeMismatch):
        return Finding(Reason.LOGPROBS_MISMATCH, split.detail)
    rows, later = echoed.rows, len(echoed.ids) - 1
    if len(rows.sampled) != later:
        detail = f"{len(rows.sampled)} rows recomputed for the prompt's {later} later tokens"
        return Finding(Reason.TOKENS_UNAVAILABLE, detail)
    ids = [*echoed.ids[1:], *(int(t) for r in range(later) for t in rows.top_ids[r])]
    names = [verified_name(n) for n in convert_ids_list_to_tokens(tokenizer, ids)]
    own = [tokenizer.decode(echoed.ids[0]), *names[:later]]
    misspelt = echoed_spelling(split, own)
    if misspelt is not None:
        return Finding(Reason.PROMPT_MISMATCH, misspelt)
    tops = iter(names[later:])
    verified = [
        VerifiedPosition(
            sampled,
            float(rows.sampled[r]),
            tuple(RankedToken(next(tops), float(v)) for v in rows.top_values[r]),
        )
        for r, sampled in enumerate(own[1:])
    ]
    compared = compare(split.prompt, verified, chat=False, requested_top=echoed.top)
    if isinstance(compared, ShapeMismatch):
        return Finding(Reason.LOGPROBS_MISMATCH, f"echoed prompt: {compared.detail}")
    return compared, split.output


def _check_output(
    choice: ScoredChoice,
    evidence: ChoiceEvidence,
    claim: LogprobsClaim,
    *,
    output: Sequence[int],
    passes: Sequence[PassRows],
    tokenizer: Any,
) -> LogprobsComparison | Finding | None:
    """`check_logprobs` of the output's claim."""
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
        stated = claimed.logprob
        offsets = (
            [] if scored is None or stated is None or not np.isfinite(scored) else [scored - stated]
        )
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

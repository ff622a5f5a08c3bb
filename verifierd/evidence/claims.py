"""Prover claims checked against the client's view (pure: values in, findings out).

Each check returns None when the claim holds, else a `Finding`: FAIL findings
carry the first differing position and both sides, so an operator can see
what the prover said and what the client got.

Finish reasons (vLLM's meaning, checked on the output ids and their decoding):

- ``stop`` with a stop string: the decoded output hits that stop string (the
  first one vLLM's detokenizer finds) at its last token, and the claimed
  ``stop_reason``, when a string, names it;
- ``stop`` without one: the last token is an end token (the tokenizer's EOS,
  the model's generation-config EOS ids or the request's ``stop_token_ids``),
  which is scored like any other token; a claimed integer ``stop_reason`` names it;
- ``length``: exactly the request's ``max_tokens`` / ``max_completion_tokens``
  output tokens (absent: the committed context limit), no end token, no stop string;
- any other finish reason (``abort``, ``tool_calls``, ...) is not replayed.

A stop string or end token *before* the last token means the engine would
have stopped there: the claimed output is longer than what was generated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from verifierd.evidence.vllm_views import DecodedOutput
from verifierd.verdicts import Reason

_SNIPPET = 24


@dataclass(frozen=True)
class Finding:
    """Why a choice is not PASS/FAIL on its score alone."""

    reason: Reason
    detail: str

    @property
    def fails(self) -> bool:
        """A contradicted claim (FAIL), as opposed to UNVERIFIABLE."""
        return self.reason in FAIL_REASONS


FAIL_REASONS = frozenset(
    {
        Reason.PROMPT_MISMATCH,
        Reason.TOKEN_TEXT_MISMATCH,
        Reason.FINISH_MISMATCH,
        Reason.USAGE_MISMATCH,
        Reason.GRAMMAR_VIOLATION,
        Reason.LOGPROBS_MISMATCH,
    }
)


def first_difference(a: Sequence[object], b: Sequence[object]) -> int:
    """The first index where ``a`` and ``b`` differ (the shorter length when one is
    a prefix of the other)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def check_prompt(claimed: Sequence[int] | None, rendered: Sequence[int]) -> Finding | None:
    """Claimed prompt ids must be the verifier's rendering of the captured request."""
    if claimed is None or tuple(claimed) == tuple(rendered):
        return None
    at = first_difference(claimed, rendered)
    return Finding(
        Reason.PROMPT_MISMATCH,
        f"{len(claimed)} prompt ids claimed, the captured request renders to "
        f"{len(rendered)}; first difference at {at}: claimed "
        f"{list(claimed[at : at + 8])}, rendered {list(rendered[at : at + 8])}",
    )


def check_text(received: str, decoded: str) -> Finding | None:
    """The output ids must decode to exactly the text the client received."""
    if received == decoded:
        return None
    at = first_difference(received, decoded)
    return Finding(
        Reason.TOKEN_TEXT_MISMATCH,
        f"the output ids decode to {len(decoded)} characters, the client received "
        f"{len(received)}; first difference at {at}: decoded "
        f"{decoded[at : at + _SNIPPET]!r}, received {received[at : at + _SNIPPET]!r}",
    )


@dataclass(frozen=True)
class FinishRules:
    """What the request allows the output to end on."""

    finish_reason: str
    claimed_stop: object
    end_tokens: frozenset[int]
    #: Output tokens a ``length`` finish must have.
    length: int
    ignore_eos: bool


def check_finish(
    rules: FinishRules, output_ids: Sequence[int], decoded: DecodedOutput
) -> Finding | None:
    """The finish reason (and stop reason) against the output and the request."""
    n = len(output_ids)
    if decoded.tokens_used < n:
        what = (
            f"stop string {decoded.stop_string!r}"
            if decoded.stop_string is not None
            else f"end token {output_ids[decoded.tokens_used - 1]}"
        )
        return _finish(f"the engine stops at token {decoded.tokens_used} of {n} on {what}")
    last = output_ids[-1] if output_ids else None
    ends_on_token = last is not None and last in rules.end_tokens and not rules.ignore_eos
    if rules.finish_reason == "length":
        if decoded.stop_string is not None or ends_on_token:
            return _finish("'length' but the output ends on a stop string or end token")
        if n != rules.length:
            return _finish(f"'length' after {n} tokens; the request allows {rules.length}")
        return None
    if rules.finish_reason != "stop":
        return Finding(
            Reason.TOKENS_UNAVAILABLE, f"finish_reason {rules.finish_reason!r} is not replayed"
        )
    claimed = rules.claimed_stop
    if decoded.stop_string is not None:
        if isinstance(claimed, str) and claimed != decoded.stop_string:
            return _finish(
                f"stop_reason {claimed!r}, but the output stops on {decoded.stop_string!r}"
            )
        if isinstance(claimed, int) and not isinstance(claimed, bool):
            return _finish(f"stop_reason {claimed}, but the output stops on a stop string")
        return None
    if isinstance(claimed, str):
        return _finish(f"stop_reason {claimed!r}, but that stop string ends nothing")
    if not ends_on_token:
        return _finish("'stop' without a stop string, and the output has no end token")
    if isinstance(claimed, int) and not isinstance(claimed, bool) and claimed != last:
        return _finish(f"stop_reason {claimed}, but the output ends on token {last}")
    return None


def _finish(detail: str) -> Finding:
    return Finding(Reason.FINISH_MISMATCH, detail)

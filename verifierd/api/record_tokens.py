"""The scored tokens of a record, and their text pieces for the operator's heat map.

The verdict's per-token margins are aligned with the response tokens of the scored
choice: the ids the tokenization search found (``Verdict.found_token_ids``), else
the (checked) token ids the prover returned, else, for verdicts that were never
scored, the response text re-tokenized with the commitment's tokenizer. Each id
gets the text it adds to the response, decoded incrementally over a few tokens of
context (byte-level BPE tokens may hold part of a UTF-8 character: such a token
shows "" and the token completing the character shows all of it), so the pieces
concatenate to the decoded response.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from veritap.v1 import record_pb2, verifier_pb2

#: Tokens of context decoded before each token (as vLLM's incremental detokenizer does).
_CONTEXT = 6
_REPLACEMENT = "\ufffd"


class TokenCodec(Protocol):
    """The part of a tokenizer the record view needs."""

    def encode_text(self, text: str) -> list[int]: ...

    def decode_ids(self, ids: Sequence[int]) -> str: ...


@dataclass(frozen=True)
class ScoredTokens:
    ids: tuple[int, ...]
    texts: tuple[str, ...]
    #: Why texts are missing or ids were re-derived ("" when all is as recorded).
    note: str


def scored_choice(
    record: record_pb2.InferenceRecord, verdict: verifier_pb2.Verdict | None
) -> record_pb2.Choice | None:
    index = verdict.choice_index if verdict is not None else 0
    for choice in record.api.choices:
        if choice.index == index:
            return choice
    return None


def token_pieces(codec: TokenCodec, ids: Sequence[int]) -> list[str]:
    """The text each id adds to the decoded sequence (see the module docstring)."""
    pieces: list[str] = []
    emitted = 0  # ids[:emitted] are fully accounted for in pieces
    for i in range(len(ids)):
        context = max(0, emitted - _CONTEXT)
        before = codec.decode_ids(ids[context:emitted])
        after = codec.decode_ids(ids[context : i + 1])
        if after.endswith(_REPLACEMENT) and i + 1 < len(ids):
            pieces.append("")
            continue
        pieces.append(after[len(before) :] if after.startswith(before) else after)
        emitted = i + 1
    return pieces


def scored_tokens(
    record: record_pb2.InferenceRecord,
    verdict: verifier_pb2.Verdict | None,
    codec: TokenCodec | None,
    codec_note: str,
) -> ScoredTokens:
    """Ids and texts of the scored choice's response tokens.

    ``codec`` is the commitment's tokenizer, or None with ``codec_note`` saying why.
    """
    choice = scored_choice(record, verdict)
    if choice is None:
        return ScoredTokens((), (), "the record has no response choice to show")
    if verdict is not None and verdict.found_token_ids:
        ids = tuple(verdict.found_token_ids)
        note = "token ids found from the response text by the tokenization search"
    elif choice.HasField("token_ids"):
        ids = tuple(choice.token_ids.ids)
        note = ""
    elif codec is None:
        return ScoredTokens((), (), f"no token ids in the record; {codec_note}")
    else:
        ids = tuple(codec.encode_text(choice.text))
        note = "token ids re-derived from the response text"
    if codec is None:
        return ScoredTokens(ids, (), codec_note)
    return ScoredTokens(ids, tuple(token_pieces(codec, ids)), note)

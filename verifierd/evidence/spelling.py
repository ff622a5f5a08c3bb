"""What a growing token prefix spells, kept in step with the search (linear time).

The search asks, at its settled frontier, whether one more token keeps the
decoded text a prefix of the received text. Decoding the whole prefix for each
question is quadratic in the response, and the prover chooses the response: a
long text that no sampler wrote asks the question at nearly every position.

UTF-8 decoding (with U+FFFD for invalid bytes) restarts cleanly after a complete
character or a completed invalid sequence, so the text of ``prefix + tail`` is
the text of ``prefix`` up to its last such boundary (a **mark**) followed by the
decoding of the bytes after it. `Spelling` feeds each settled token to an
incremental decoder, moves the mark whenever nothing is pending, and checks
once that the text up to the mark is the target's; a question then decodes only
the tokens after the mark. It answers exactly what `TextModel.text_after` of the
whole prefix would (the detokenizer's hold-back of a trailing U+FFFD run
included), which the property tests check against it.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from verifierd.evidence.vllm_views import MAX_HELD_REPLACEMENTS, REPLACEMENT


@dataclass(frozen=True)
class Spelled:
    """The text a prefix (plus a tail) emits, as far as the search needs it."""

    #: Length of the emitted text.
    length: int
    #: The bytes the detokenizer still holds back after it.
    pending: bytes
    #: Whether the emitted text and the target agree on their common length.
    agrees: bool


class Spelling:
    """The emitted text of ``output[:settled]`` for one target text."""

    def __init__(
        self,
        target: str,
        token_bytes: Callable[[int], bytes],
        text_after: Callable[[Sequence[int]], tuple[str, bytes]],
    ) -> None:
        self._target = target
        self._token_bytes = token_bytes
        self._text_after = text_after
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._ids: list[int] = []
        self._decoded = 0
        #: Token count and text length at the last clean boundary, and at the last
        #: one whose text does not end in U+FFFD.
        self._mark_tokens = 0
        self._mark_chars = 0
        self._solid_tokens = 0
        #: False once the text up to a mark is not the target's (then every
        #: question decodes the whole prefix, as `text_after` does).
        self._on_target = True
        #: Length of the U+FFFD run that ends the target's first i characters.
        self._replacement_run = [0] * (len(target) + 1)
        for i, char in enumerate(target):
            self._replacement_run[i + 1] = (
                self._replacement_run[i] + 1 if char == REPLACEMENT else 0
            )

    @property
    def settled(self) -> int:
        return len(self._ids)

    def settle(self, token: int) -> None:
        """Append one settled token."""
        self._ids.append(token)
        piece = self._decoder.decode(self._token_bytes(token))
        if piece and self._on_target:
            start = self._decoded
            self._on_target = self._target[start : start + len(piece)] == piece
        self._decoded += len(piece)
        if not self._decoder.getstate()[0]:
            self._mark_tokens, self._mark_chars = len(self._ids), self._decoded
            if self._on_target and not self._replacement_run[self._mark_chars]:
                self._solid_tokens = len(self._ids)

    def after(self, tail: Sequence[int]) -> Spelled:
        """What ``settled prefix + tail`` emits."""
        if not self._on_target:
            return self._spelled(*self._text_after([*self._ids, *tail]), 0)
        rest = [*self._ids[self._mark_tokens :], *tail]
        emitted, pending = self._text_after(rest)
        if emitted:
            return self._spelled(emitted, pending, self._mark_chars)
        # The tail emits nothing: the text ends inside the prefix, before the run of
        # U+FFFD that ends it (held back), unless the run is too long to hold.
        run = self._replacement_run[self._mark_chars]
        raw = b"".join(self._token_bytes(t) for t in rest)
        if run + len(raw.decode("utf-8", "replace")) > MAX_HELD_REPLACEMENTS:
            return Spelled(self._mark_chars - run, b"", True)
        # The held bytes start after the last character that is not U+FFFD: at or
        # after the last boundary before the run.
        solid = self._solid_tokens
        _, pending = self._text_after([*self._ids[solid:], *tail])
        return Spelled(self._mark_chars - run, pending, True)

    def _spelled(self, emitted: str, pending: bytes, offset: int) -> Spelled:
        common = self._target[offset : offset + len(emitted)]
        agrees = emitted[: len(common)] == common
        return Spelled(offset + len(emitted), pending, agrees)

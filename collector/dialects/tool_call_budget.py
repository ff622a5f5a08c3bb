"""The caps on one response's tool calls, so no prover can make a record's memory unbounded.

A response keeps at most `MAX_TOOL_CALLS` tool calls and `MAX_TOOL_CALL_BYTES`
of their strings (UTF-8) across its choices or output items. Past a cap, calls
are dropped and strings cut at a character boundary; each cut is counted and
reported as a truncation. Parts that the record cannot hold as the SDK shows
them (`malformed`) and fragments the SDK's stream helper raises on
(`misplaced`) are counted and reported as problems.
"""

from __future__ import annotations

MAX_TOOL_CALLS = 256
MAX_TOOL_CALL_BYTES = 1 << 20


def utf8_length(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


class ToolCallBudget:
    """What is left of one response's caps, and what was dropped at them."""

    __slots__ = (
        "bytes_cut",
        "bytes_left",
        "calls_dropped",
        "calls_left",
        "malformed",
        "misplaced",
    )

    def __init__(self) -> None:
        self.calls_left = MAX_TOOL_CALLS
        self.bytes_left = MAX_TOOL_CALL_BYTES
        self.calls_dropped = 0
        self.bytes_cut = 0
        self.malformed = 0
        self.misplaced = 0

    def take_call(self) -> bool:
        if self.calls_left:
            self.calls_left -= 1
            return True
        self.calls_dropped += 1
        return False

    def take_text(self, text: str) -> tuple[str, bool]:
        """The part of `text` that fits, and whether it was cut."""
        size = utf8_length(text)
        if size <= self.bytes_left:
            self.bytes_left -= size
            return text, False
        kept = text.encode("utf-8", "surrogatepass")[: self.bytes_left].decode("utf-8", "ignore")
        self.bytes_cut += size - self.bytes_left
        self.bytes_left = 0
        return kept, True

    def give_back(self, text: str) -> None:
        self.bytes_left += utf8_length(text)

    def report(self, problems: list[str]) -> tuple[str, ...]:
        """Add the counted problems to `problems`; the truncations at the caps."""
        if self.malformed:
            problems.append(
                f"{self.malformed} tool call part(s) are not what the SDK reads (not recorded)"
            )
        if self.misplaced:
            problems.append(
                f"{self.misplaced} tool call fragment(s) with an index past the calls "
                "(the SDK's stream helper raises there)"
            )
        truncations = []
        if self.calls_dropped:
            truncations.append(
                f"{self.calls_dropped} tool call(s) past the cap of {MAX_TOOL_CALLS} dropped"
            )
        if self.bytes_cut:
            truncations.append(
                f"{self.bytes_cut} bytes of tool calls past the cap of {MAX_TOOL_CALL_BYTES} cut"
            )
        return tuple(truncations)

"""The recorded morning plus traffic from a prover that attacks the operator's terminal.

The prover writes the model name, the prompt's echo, the response and (through them)
the verdict's detail. These exchanges put in each: console markup that would crash a
screen (``[/x]``) or add links and actions (``[link=…]``, ``[@click=…]``), terminal
escape sequences (clear screen, set the window title, an 8-bit CSI), the bidirectional
overrides that make a line read otherwise than it is, and a 10,000-character model name.
"""

from __future__ import annotations

from tests.recorded_traffic import EXCHANGES, FAIL, PENDING, UNVERIFIABLE, Exchange

#: Markup, escape sequences and bidi overrides, in that order.
HOSTILE_TEXT = (
    "[/x][link=https://evil.example]Click[/link][@click=app.quit]me[/] "
    "\x1b[2J\x1b]0;owned\x07\x9b31m red \x7f "
    "\u202eexe.txt\u202c \u2066iso\u2069 \u200e\u200f\u061c"
)
#: The model name such a prover claims to serve.
HOSTILE_MODEL = (HOSTILE_TEXT + " ").ljust(10_000, "M")

_FIRST = len(EXCHANGES) + 1
HOSTILE_EXCHANGES = (
    Exchange(
        index=_FIRST,
        question=f"Repeat after me: {HOSTILE_TEXT}",
        answer=f"Sure: {HOSTILE_TEXT}",
        status=FAIL,
        model=HOSTILE_MODEL,
        margins="dishonest",
    ),
    Exchange(
        index=_FIRST + 1,
        question=HOSTILE_TEXT,
        answer=HOSTILE_TEXT,
        status=UNVERIFIABLE,
        model=HOSTILE_MODEL,
        reason="unknown_commitment",
        detail=f"no commitment serves {HOSTILE_MODEL!r}",
    ),
    Exchange(
        index=_FIRST + 2,
        question=HOSTILE_TEXT,
        answer=HOSTILE_TEXT,
        status=PENDING,
        model=HOSTILE_MODEL,
    ),
)
#: What the hostile daemons hold: the morning, then the attack (the newest records).
WITH_HOSTILE = (*EXCHANGES, *HOSTILE_EXCHANGES)

#: Every screen, and the detail of each kind of hostile record, as keys from the Overview.
HOSTILE_VIEWS = {
    "overview": (),
    "pending": ("2",),
    "verdicts": ("3",),
    "unverifiable_detail": ("3", "enter"),
    "failures": ("4",),
    "failure_detail": ("4", "enter"),
    "models": ("5",),
    "settings": ("6",),
}
#: The views that show a hostile record (the others show counts and commitments).
SHOWING_IT = ("pending", "verdicts", "unverifiable_detail", "failures", "failure_detail")

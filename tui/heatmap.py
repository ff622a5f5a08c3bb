"""The DiFR heat map: each response token coloured by its margin.

A margin is how much better the reconstructed sampler's choice scored than the claimed
token: 0 for a token the verifier reproduces exactly, Δmax (the clip) for a token
outside the top-k/top-p mask. Colours go by the margin as a fraction of Δmax, with the
commitment's threshold as the first step, so an honest response reads as one calm
colour and a dishonest one lights up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text

from tui import formats


@dataclass(frozen=True)
class HeatStep:
    #: Upper bound of the step as a fraction of Δmax (the first step ends at the threshold).
    upto: float
    style: str
    label: str


#: Background colours from exact (no highlight) to outside the mask.
STEPS = (
    HeatStep(0.0, "on #1f3d2b", "exact"),
    HeatStep(0.1, "on #2f5d3a", "< 10%"),
    HeatStep(0.3, "black on #b8a33a", "< 30%"),
    HeatStep(0.6, "black on #d0782a", "< 60%"),
    HeatStep(1.0, "white on #b22222", "< Δmax"),
    HeatStep(float("inf"), "bold white on #7a0f3a", "≥ Δmax"),
)


def style_for(margin: float, delta_max: float) -> str:
    if margin <= 0 or delta_max <= 0:
        return STEPS[0].style
    fraction = margin / delta_max
    if fraction >= 1.0:
        return STEPS[-1].style
    for step in STEPS[1:-1]:
        if fraction < step.upto:
            return step.style
    return STEPS[-2].style


def heat_text(pieces: Sequence[str], margins: Sequence[float], delta_max: float) -> Text:
    """The response with each token's text styled by its margin (pieces beyond the
    margins are left plain), each piece shown literally (:func:`tui.formats.shown`)."""
    text = Text()
    for i, piece in enumerate(pieces):
        style = style_for(margins[i], delta_max) if i < len(margins) else ""
        text.append_text(formats.shown(piece, style))
    return text


def legend() -> Text:
    text = Text("margin: ")
    for step in STEPS:
        text.append(f" {step.label} ", style=step.style)
        text.append(" ")
    return text

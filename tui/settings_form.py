"""The Settings screen's form: three numbers typed by an operator, checked before they are
sent (verifierd checks them again)."""

from __future__ import annotations

import math

from veritap.v1 import verifier_pb2


class SettingsInputError(ValueError):
    """A field that is not a number or out of its range; the message names it."""


def _number(name: str, text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise SettingsInputError(f"{name}: {text.strip()!r} is not a number") from None
    if not math.isfinite(value):
        raise SettingsInputError(f"{name} must be finite")
    return value


def parse_settings(threshold: str, delta_max: str, sample_rate: str) -> verifier_pb2.DifrSettings:
    settings = verifier_pb2.DifrSettings(
        threshold=_number("threshold", threshold),
        delta_max=_number("Δmax", delta_max),
        sample_rate=_number("sample rate", sample_rate),
    )
    if settings.threshold < 0:
        raise SettingsInputError("threshold must be >= 0")
    if settings.delta_max <= 0:
        raise SettingsInputError("Δmax must be > 0")
    if not 0 <= settings.sample_rate <= 1:
        raise SettingsInputError("sample rate must be between 0 and 1")
    return settings


def change_lines(before: verifier_pb2.DifrSettings, after: verifier_pb2.DifrSettings) -> list[str]:
    """One line per field: ``threshold  0.05 → 0.2`` (unchanged fields say so)."""
    out = []
    for label, field in (
        ("threshold", "threshold"),
        ("Δmax", "delta_max"),
        ("sample rate", "sample_rate"),
    ):
        old, new = getattr(before, field), getattr(after, field)
        change = f"{old:g} → {new:g}" if old != new else f"{new:g} (unchanged)"
        out.append(f"{label:<12}{change}")
    return out

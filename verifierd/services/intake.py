"""The intake as one of the daemon's services: a link per `[[collectors]]` entry.

Off (None) when no collector is configured. `Intake.status()` is the view GetStats
reads (verifierd.api.sources.IntakeSource).
"""

from __future__ import annotations

from verifierd.daemon import DaemonContext
from verifierd.intake import Intake


def create(context: DaemonContext) -> Intake | None:
    if not context.config.collectors:
        return None
    return Intake(context.store, context.config)

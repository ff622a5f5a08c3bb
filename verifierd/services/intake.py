"""The intake as one of the daemon's services: a link per `[[collectors]]` entry.

Off (None) when no collector is configured. `Intake.status()` is the view GetStats
reads (verifierd.api.sources.IntakeSource). An alert the pipeline raises about what was
stored from a collector stops that collector's link too.
"""

from __future__ import annotations

from verifierd.daemon import DaemonContext
from verifierd.intake import Intake


def create(context: DaemonContext) -> Intake | None:
    if not context.config.collectors:
        return None
    intake = Intake(context.store, context.config)
    context.pipeline.add_alert_listener(intake.stop_alerted)
    return intake

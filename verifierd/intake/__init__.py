"""verifierd's intake: subscribe to collectors, verify their logs, store entries exactly once."""

from verifierd.intake.chain import IntakeError, ViolationError
from verifierd.intake.link import LinkStatus
from verifierd.intake.runner import Intake

__all__ = ["Intake", "IntakeError", "LinkStatus", "ViolationError"]

"""What the daemon lends the VerifierService for GetStats, GetEngines and ClearIntakeAlert.

The service reads the intake links and the engine pool through these narrow
views (any object with these attributes fits: verifierd.intake's ``Intake`` and
verifierd.engine's ``EnginePool`` do), so it runs without them too (``verifierd``
serving a store with intake or engines turned off). The one action is the
intake's ``clear``: resuming a collector link stopped by an alert.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from verifierd.store import ClearedAlert


class LinkView(Protocol):
    """One collector link's state (verifierd.intake.link.LinkStatus)."""

    @property
    def origin(self) -> str: ...
    @property
    def remote_head_seq(self) -> int: ...
    @property
    def state(self) -> str: ...
    @property
    def last_contact_ns(self) -> int: ...


class IntakeSource(Protocol):
    def status(self) -> Sequence[LinkView]: ...

    async def clear(self, origin: str, *, actor: str, why: str) -> ClearedAlert:
        """Resume intake from ``origin`` after its alert (verifierd.intake.Intake.clear)."""


class EngineView(Protocol):
    """One engine's state (verifierd.engine.pool.EngineStatus)."""

    @property
    def commitment_id(self) -> str: ...
    @property
    def state(self) -> int: ...
    @property
    def memory_bytes(self) -> int: ...
    @property
    def gpus(self) -> Sequence[int]: ...
    @property
    def loaded_at_ns(self) -> int: ...
    @property
    def detail(self) -> str: ...


class EngineSource(Protocol):
    def status(self) -> Sequence[EngineView]: ...


@dataclass(frozen=True)
class VcaFigure:
    """The verifier compute advantage over the recent window."""

    value: float
    #: How it was measured ("nvml-gpm", "cpu-seconds", ...).
    method: str


#: Returns the latest VCA figure, or None while it is unknown.
VcaSource = Callable[[], Awaitable[VcaFigure | None]]


@dataclass(frozen=True)
class ServiceSources:
    intake: IntakeSource | None = None
    engines: EngineSource | None = None
    vca: VcaSource | None = None

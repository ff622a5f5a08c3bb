"""The console's one WatchVerdicts stream, fanned out to the screens that show verdicts.

It reconnects by itself (0.5 s, doubling to 5 s) while verifierd is away; when the
stream is back, every subscriber is asked to re-list, so verdicts decided during the
outage are not missing from the screens.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from veritap.v1 import verifier_pb2

from tui.client import ConsoleClient, ConsoleClientError

VerdictListener = Callable[[verifier_pb2.Verdict], None]
ResyncListener = Callable[[], None]

_FIRST_DELAY_S = 0.5
_MAX_DELAY_S = 5.0


class LiveVerdicts:
    def __init__(self) -> None:
        self._listeners: dict[int, tuple[VerdictListener, ResyncListener]] = {}
        self._next = 0
        self._ready = asyncio.Event()
        self._subscribed_once = False

    def subscribe(
        self, on_verdict: VerdictListener, on_resync: ResyncListener
    ) -> Callable[[], None]:
        """Hear each new verdict, and ``on_resync`` after a reconnection; returns the
        function that unsubscribes."""
        number = self._next
        self._next += 1
        self._listeners[number] = (on_verdict, on_resync)
        return lambda: self._listeners.pop(number, None) and None

    async def wait_ready(self, timeout_s: float = 2.0) -> None:
        """Until the stream is subscribed (so a listing made next misses nothing), or
        ``timeout_s`` while verifierd is away."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ready.wait(), timeout_s)

    def _on_ready(self) -> None:
        self._ready.set()
        if self._subscribed_once:
            for _, resync in list(self._listeners.values()):
                resync()
        self._subscribed_once = True

    async def run(self, client: ConsoleClient) -> None:
        """Stream until cancelled (the app's exit)."""
        delay = _FIRST_DELAY_S
        while True:
            try:
                async for verdict in client.watch(self._on_ready):
                    delay = _FIRST_DELAY_S
                    for on_verdict, _ in list(self._listeners.values()):
                        on_verdict(verdict)
            except ConsoleClientError:
                pass
            self._ready.clear()
            await asyncio.sleep(delay)
            delay = min(delay * 2, _MAX_DELAY_S)

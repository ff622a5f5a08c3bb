"""One of the console's server streams (WatchVerdicts, WatchAlarms), fanned out to the
screens that show what it carries.

It reconnects by itself (0.5 s, doubling to 5 s) while verifierd is away; when the
stream is back, every subscriber is asked to re-list, so what happened during the
outage is not missing from the screens.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Generic, TypeVar

import grpc

from tui.client import CallRefusedError, ConsoleClientError

T = TypeVar("T")
ResyncListener = Callable[[], None]
#: Opens the stream: called with the function to run once it is subscribed.
StreamOpener = Callable[[Callable[[], None]], AsyncIterator[T]]

_FIRST_DELAY_S = 0.5
_MAX_DELAY_S = 5.0


class LiveStream(Generic[T]):
    def __init__(self, opener: StreamOpener[T]) -> None:
        self._opener = opener
        self._listeners: dict[int, tuple[Callable[[T], None], ResyncListener]] = {}
        self._next = 0
        self._ready = asyncio.Event()
        self._subscribed_once = False

    def subscribe(
        self, on_item: Callable[[T], None], on_resync: ResyncListener
    ) -> Callable[[], None]:
        """Hear each new item, and ``on_resync`` after a reconnection; returns the
        function that unsubscribes."""
        number = self._next
        self._next += 1
        self._listeners[number] = (on_item, on_resync)
        return lambda: self._listeners.pop(number, None) and None

    async def wait_ready(self, timeout_s: float = 2.0) -> None:
        """Until the stream is subscribed (so a listing made next misses nothing), or
        ``timeout_s`` while verifierd is away (or refuses the stream)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ready.wait(), timeout_s)

    def _on_ready(self) -> None:
        self._ready.set()
        if self._subscribed_once:
            for _, resync in list(self._listeners.values()):
                resync()
        self._subscribed_once = True

    async def run(self) -> None:
        """Stream until cancelled (the app's exit), or until verifierd answers that it does
        not serve this stream (UNIMPLEMENTED: asking again would not change that)."""
        delay = _FIRST_DELAY_S
        while True:
            try:
                async for item in self._opener(self._on_ready):
                    delay = _FIRST_DELAY_S
                    for on_item, _ in list(self._listeners.values()):
                        on_item(item)
            except CallRefusedError as exc:
                if exc.code == grpc.StatusCode.UNIMPLEMENTED.name:
                    self._ready.clear()
                    return
            except ConsoleClientError:
                pass
            self._ready.clear()
            await asyncio.sleep(delay)
            delay = min(delay * 2, _MAX_DELAY_S)

"""Fan-out of prover alarms, raised or cleared, to WatchAlarms streams.

The prover tables call :meth:`AlarmHub.publish` in the writing thread once the alarm's
transaction committed; each subscriber gets them in its own event loop through
``call_soon_threadsafe``, so the writer never waits for a client. Alarms are rare, so a
subscriber's buffer is unbounded. Closing the hub (the service stopping) ends every
stream.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Sequence

from veritap.v1 import verifier_pb2


class AlarmSubscription:
    """One WatchAlarms stream's queue; iterate it in the loop it was created in."""

    def __init__(self, hub: AlarmHub, loop: asyncio.AbstractEventLoop) -> None:
        self._hub = hub
        self._loop = loop
        #: None ends the stream.
        self._queue: asyncio.Queue[verifier_pb2.AlarmState | None] = asyncio.Queue()

    def deliver(self, states: Sequence[verifier_pb2.AlarmState | None]) -> None:
        """From any thread."""
        try:
            for state in states:
                self._loop.call_soon_threadsafe(self._queue.put_nowait, state)
        except RuntimeError:  # the loop is closed: the stream is gone
            self.close()

    async def alarms(self) -> AsyncIterator[verifier_pb2.AlarmState]:
        """Alarms as they are published, until the hub closes."""
        while (state := await self._queue.get()) is not None:
            yield state

    def close(self) -> None:
        self._hub.unsubscribe(self)


class AlarmHub:
    def __init__(self) -> None:
        self._subscribers: set[AlarmSubscription] = set()
        self._lock = threading.Lock()
        self._closed = False

    def publish(self, states: Sequence[verifier_pb2.AlarmState]) -> None:
        """The prover tables' alarm listener (called in the writing thread)."""
        with self._lock:
            if self._closed:
                return
            subscribers = list(self._subscribers)
        for subscriber in subscribers:
            subscriber.deliver(states)

    def subscribe(self) -> AlarmSubscription:
        subscription = AlarmSubscription(self, asyncio.get_running_loop())
        with self._lock:
            closed = self._closed
            if not closed:
                self._subscribers.add(subscription)
        if closed:
            subscription.deliver([None])
        return subscription

    def unsubscribe(self, subscription: AlarmSubscription) -> None:
        with self._lock:
            self._subscribers.discard(subscription)

    def close(self) -> None:
        """Stop delivering and end every stream (the tables keep the listener; it becomes a
        no-op)."""
        with self._lock:
            self._closed = True
            subscribers = list(self._subscribers)
            self._subscribers.clear()
        for subscriber in subscribers:
            subscriber.deliver([None])

"""Fan-out of newly stored verdicts to WatchVerdicts streams.

The store calls its verdict listeners in the writing thread after each commit;
:meth:`VerdictHub.publish` hands each batch to every subscriber's event loop with
``call_soon_threadsafe``, so the writer never waits for a client. Each subscriber
buffers at most ``limit`` verdicts: one that falls further behind is marked
overflowed and its stream ends with RESOURCE_EXHAUSTED (the client re-lists and
watches again) rather than silently missing verdicts.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import AsyncIterator, Sequence

from veritap.v1 import verifier_pb2

from verifierd.store import StoredVerdict

DEFAULT_LIMIT = 4096


class SubscriberOverflowError(Exception):
    """The subscriber did not keep up and missed verdicts."""


class Subscription:
    """One WatchVerdicts stream's buffer; iterate it in the loop it was created in."""

    def __init__(self, hub: VerdictHub, loop: asyncio.AbstractEventLoop, limit: int) -> None:
        self._hub = hub
        self._loop = loop
        self._limit = limit
        self._buffer: deque[verifier_pb2.Verdict] = deque()
        self._ready = asyncio.Event()
        self.overflowed = False

    def _offer(self, verdicts: Sequence[verifier_pb2.Verdict]) -> None:
        """In the subscriber's loop: buffer a batch, or mark the subscriber overflowed."""
        if self.overflowed:
            return
        if len(self._buffer) + len(verdicts) > self._limit:
            self.overflowed = True
            self._buffer.clear()
        else:
            self._buffer.extend(verdicts)
        self._ready.set()

    def deliver(self, verdicts: Sequence[verifier_pb2.Verdict]) -> None:
        """From any thread."""
        try:
            self._loop.call_soon_threadsafe(self._offer, verdicts)
        except RuntimeError:  # the loop is closed: the stream is gone
            self.close()

    async def verdicts(self) -> AsyncIterator[verifier_pb2.Verdict]:
        """New verdicts as they are stored; raises SubscriberOverflowError when behind."""
        while True:
            await self._ready.wait()
            self._ready.clear()
            if self.overflowed:
                raise SubscriberOverflowError(f"more than {self._limit} verdicts behind")
            while self._buffer:
                yield self._buffer.popleft()

    def close(self) -> None:
        self._hub.unsubscribe(self)


class VerdictHub:
    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self._limit = limit
        self._subscribers: set[Subscription] = set()
        self._lock = threading.Lock()
        self._closed = False

    def publish(self, batch: Sequence[StoredVerdict]) -> None:
        """The store's verdict listener (called in the writing thread)."""
        with self._lock:
            if self._closed or not self._subscribers:
                return
            subscribers = list(self._subscribers)
        verdicts = [stored.verdict for stored in batch]
        for subscriber in subscribers:
            subscriber.deliver(verdicts)

    def subscribe(self) -> Subscription:
        subscription = Subscription(self, asyncio.get_running_loop(), self._limit)
        with self._lock:
            self._subscribers.add(subscription)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        with self._lock:
            self._subscribers.discard(subscription)

    @property
    def subscribers(self) -> int:
        with self._lock:
            return len(self._subscribers)

    def close(self) -> None:
        """Stop delivering (the store keeps the listener; it becomes a no-op)."""
        with self._lock:
            self._closed = True
            self._subscribers.clear()

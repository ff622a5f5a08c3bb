"""Pace systemd watchdog pings from the daemon's own main loop.

The pings must come from the loop that does the work: a helper thread would
keep pinging while the loop is stuck, and systemd would never restart the
hung daemon. So this class sends nothing by itself. A synchronous loop calls
`Watchdog.tick()` on every turn (cheap: it pings only when half the interval
has passed); an asyncio daemon runs `Watchdog.run()` as a task on the same
event loop as its servers, passing a health check that fails when the work
has stalled.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from appliance.sd_notify import Notifier, watchdog_interval

_log = logging.getLogger(__name__)


def _always_healthy() -> bool:
    return True


class Watchdog:
    """Sends WATCHDOG=1 at half of systemd's watchdog interval."""

    def __init__(
        self,
        notifier: Notifier,
        interval: float | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.notifier = notifier
        self.interval = interval if notifier.enabled else None
        self._clock = clock
        self._last_ping: float | None = None

    @classmethod
    def from_env(cls, notifier: Notifier) -> Watchdog:
        """A watchdog with the interval systemd set for this process (WATCHDOG_USEC)."""
        return cls(notifier, watchdog_interval())

    @property
    def enabled(self) -> bool:
        return self.interval is not None

    @property
    def period(self) -> float | None:
        """Seconds between pings: half the interval, as sd_watchdog_enabled(3) advises."""
        return None if self.interval is None else self.interval / 2

    def tick(self) -> bool:
        """Ping when a period has passed since the last ping; True when it pinged."""
        period = self.period
        if period is None:
            return False
        now = self._clock()
        if self._last_ping is not None and now - self._last_ping < period:
            return False
        self._last_ping = now
        return self.notifier.watchdog()

    async def run(self, healthy: Callable[[], bool] = _always_healthy) -> None:
        """Ping every period while `healthy()` holds; returns at once when disabled.

        While `healthy()` is False no pings go out, so systemd restarts the
        daemon after the interval (``Restart=on-failure`` covers watchdog timeouts).
        """
        period = self.period
        if period is None:
            return
        withholding = False
        while True:
            if healthy():
                withholding = False
                self._last_ping = self._clock()
                self.notifier.watchdog()
            elif not withholding:
                withholding = True
                _log.warning(
                    "health check failed: withholding watchdog pings",
                    extra={"watchdog_interval_s": self.interval},
                )
            await asyncio.sleep(period)

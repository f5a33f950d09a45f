"""The one clock of rqueue.

Scripts take "now" as an argument. In production the argument is empty and
the scripts read the server's TIME: every client then agrees on lease
deadlines and due times whatever its own clock says, and nothing depends on
clocks of many machines being in step. Tests use :class:`ManualClock`, which
passes an explicit time so that leases expire and delays pass without any
wall-clock wait. Local waits (fetch timeouts, heartbeats) use
:meth:`Clock.monotonic` and :meth:`Clock.sleep`.
"""

from __future__ import annotations

import threading
import time


class Clock:
    """Server time for the scripts, local monotonic time for waits."""

    def script_now(self) -> str:
        """The "now" argument of a script call: "" means the server's TIME."""
        return ""

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin, for local timeouts."""
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        """Waits ``seconds`` (used only where there is nothing to wait on)."""
        if seconds > 0:
            time.sleep(seconds)

    def wall(self) -> float:
        """Seconds since the epoch, for display only."""
        return time.time()


SYSTEM_CLOCK = Clock()


class ManualClock(Clock):
    """A clock that moves only when told to; for tests and simulations.

    ``now_ms`` is passed to every script, so lease expiry, redelivery delays
    and delayed publishes follow it. Local waits still use real time, so a
    test keeps its fetch timeouts at 0.
    """

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now_ms = start_ms
        self._lock = threading.Lock()

    @property
    def now_ms(self) -> int:
        return self._now_ms

    def advance(self, seconds: float) -> int:
        """Moves time forward by ``seconds`` and returns the new time in ms."""
        with self._lock:
            self._now_ms += round(seconds * 1000)
            return self._now_ms

    def script_now(self) -> str:
        return str(self._now_ms)

    def wall(self) -> float:
        return self._now_ms / 1000.0

"""The scheduler: one thread that publishes the due ticks of every recurring
schedule of a client's prefix (rqueue/schedules.py). A Worker runs one by
default; ``rqueue scheduler`` runs one alone. Any number may run at once:
each tick is published once whichever of them sends it."""

from __future__ import annotations

import logging
import threading

from ..engine.keys import schedules_channel
from ..errors import RQueueError
from ..protocols import QueueContext
from ..schedules import PassResult, fire_due

log = logging.getLogger("rqueue.scheduler")

MAX_SLEEP = 5.0  # seconds: schedules are read again at least this often (a lost announcement costs no more)
IDLE_SLEEP = 0.05  # seconds: the least wait after a pass that found due ticks and could handle none
RETRY_SLEEP = (0.5, 5.0)  # seconds: the first and the longest wait after a pass that failed


class Scheduler:
    """Runs :func:`rqueue.schedules.fire_due` in a loop: after each pass it
    sleeps until the next tick is due (at most MAX_SLEEP), and wakes early
    when a schedule is added or changed, or when stopped."""

    def __init__(self, client: QueueContext, max_sleep: float = MAX_SLEEP) -> None:
        self.client = client
        self.max_sleep = max_sleep
        #: Messages published since the scheduler started.
        self.published = 0
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Scheduler:
        """Runs the loop in a background thread; returns the scheduler."""
        self._thread = threading.Thread(target=self.run, name="rqueue-scheduler", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        """Ends the loop; waits up to ``timeout`` seconds for a thread
        started with :meth:`start` (a call Redis leaves unanswered is not
        waited for: the thread is a daemon, and a tick it sends is published
        at most once whenever it lands)."""
        self._stopping.set()
        self.client.notifier.poke()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        """Whether the thread started with :meth:`start` still runs."""
        return self._thread is not None and self._thread.is_alive()

    def run_once(self) -> PassResult:
        """One pass: publishes every due tick; what it did."""
        result = fire_due(self.client)
        self.published += result.published
        return result

    def run(self) -> None:
        """Loops until :meth:`stop`. A pass that fails (Redis unreachable)
        is logged and tried again after a wait that doubles from 0.5 s up
        to 5 s."""
        channel = schedules_channel(self.client.prefix)
        notifier = self.client.notifier
        failures = 0
        while not self._stopping.is_set():
            since = notifier.generation(channel)
            try:
                result = self.run_once()
            except Exception as exc:  # a scheduler outlives any failure: it tries again
                failures += 1
                wait = retry_wait(failures)
                expected = isinstance(exc, (RQueueError, OSError))
                log.warning("scheduler pass failed (%s); trying again in %.1f s", exc, wait, exc_info=not expected)
            else:
                failures = 0
                wait = self.sleep_after(result)
            notifier.wait(channel, since, wait, until=self._stopping.is_set)

    def sleep_after(self, result: PassResult) -> float:
        """Seconds until the next pass: until the next due tick, at most
        max_sleep; none while a backlog is being worked through."""
        if result.next_due_ms is None:
            return self.max_sleep
        wait = (result.next_due_ms - result.now_ms) / 1000
        if wait <= 0:
            return 0.0 if result.handled else IDLE_SLEEP
        return min(wait, self.max_sleep)


def retry_wait(failures: int) -> float:
    """Seconds to wait after ``failures`` passes in a row failed: doubling
    from RETRY_SLEEP[0] up to RETRY_SLEEP[1]; the exponent is capped, so
    no overflow however long Redis stays away."""
    return min(RETRY_SLEEP[0] * 2.0 ** min(failures - 1, 30), RETRY_SLEEP[1])

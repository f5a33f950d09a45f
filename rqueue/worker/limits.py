"""The time limits of a threaded worker's handlers: one thread that, when a
handler runs past its limit, takes the delivery from the running ones
(so the heartbeat stops extending its lease and the handler's own result
is discarded), sets its cancellation, and hands the timeout to the
dispatcher, which nacks it. See docs/worker.md, "Time limits"."""

from __future__ import annotations

import ctypes
import heapq
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from ..errors import TimeLimitExceeded
from ..timelimits import Cancellation
from .ledger import Ledger

if TYPE_CHECKING:
    from ..clock import Clock
    from ..delivery import Delivery

log = logging.getLogger("rqueue.worker")

# The longest the thread sleeps between looks at the clock: a test's
# ManualClock moves without waking it.
LOOK_INTERVAL = 0.1


class Run:
    """One run of a handler under a time limit."""

    __slots__ = ("deliveries", "limit", "cancellation", "thread_id", "future", "in_handler", "lock")

    def __init__(self, deliveries: list[Delivery], limit: float, cancellation: Cancellation) -> None:
        #: The run's delivery, or a batch handler's deliveries (under one limit).
        self.deliveries = deliveries
        self.limit = limit
        self.cancellation = cancellation
        self.thread_id = threading.get_ident()
        #: The coroutine handler's future, which the limit cancels.
        self.future: Future[Any] | None = None
        #: Whether the thread is inside the handler (an interrupt is sent only then).
        self.in_handler = False
        self.lock = threading.Lock()

    def left_handler(self) -> None:
        with self.lock:
            self.in_handler = False


class TimeLimits:
    """Watches the runs under a time limit; ``on_timeout(deliveries, limit)``
    is called once for each that ran past it, after the ledger no longer
    counts it as running. With ``interrupt``, TimeLimitExceeded is also
    raised in the handler's thread (PyThreadState_SetAsyncExc)."""

    def __init__(
        self, ledger: Ledger, clock: Clock, on_timeout: Callable[[list[Delivery], float], None], interrupt: bool
    ) -> None:
        self._ledger = ledger
        self._clock = clock
        self._on_timeout = on_timeout
        self._interrupt = interrupt
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Run]] = []
        self._order = 0
        self._stopped = False
        self._thread: threading.Thread | None = None

    def watch(self, run: Run, started: float) -> None:
        """Starts watching ``run``, begun at ``started`` (monotonic seconds)."""
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="rqueue-time-limits", daemon=True)
                self._thread.start()
            self._order += 1
            heapq.heappush(self._heap, (started + run.limit, self._order, run))
            self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def _watch(self) -> None:
        while True:
            with self._cond:
                if self._stopped:
                    return
                if not self._heap:
                    self._cond.wait()
                    continue
                due = self._heap[0][0] - self._clock.monotonic()
                if due > 0:
                    self._cond.wait(min(due, LOOK_INTERVAL))
                    continue
                _, _, run = heapq.heappop(self._heap)
            try:
                self._expire(run)
            except Exception:  # never let the thread die: the next limits still matter
                log.exception("could not end the run of %s at its time limit", run.deliveries[0].tag)

    def _expire(self, run: Run) -> None:
        ds = run.deliveries
        if not self._ledger.stop_batch(ds):
            return  # the handler finished first
        what = ds[0].tag if len(ds) == 1 else f"a batch of {len(ds)} from {ds[0].tag}"
        log.warning("handler ran past its time limit of %g s on %s: nacked (timeout)", run.limit, what)
        run.cancellation.cancel()
        if run.future is not None:
            run.future.cancel()  # a coroutine handler: its task is cancelled
        elif self._interrupt:
            with run.lock:
                if run.in_handler:
                    interrupt(run.thread_id)
        self._on_timeout(ds, run.limit)


def interrupt(thread_id: int) -> None:
    """Raises TimeLimitExceeded in the thread ``thread_id`` at its next
    Python instruction (not inside a C call, e.g. a blocking read)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(TimeLimitExceeded))

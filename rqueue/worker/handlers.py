"""The handler threads of a worker: each takes a waiting delivery, runs the
handler on it (a coroutine function on one shared event loop) and hands
the outcome to the dispatcher."""

from __future__ import annotations

import asyncio
import inspect
import logging
import queue as queue_module
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import timelimits as cancel_mod
from ..constants import STALE_DISPATCH_FRACTION
from ..errors import DeliveryError, Reject, TimeLimitExceeded
from ..timelimits import Cancellation, time_limit_for
from ..tracing import processing
from .ledger import Ledger
from .limits import Run, TimeLimits
from .outcome import Detail, Outcome, ack_detail
from .reconnect import Reconnector
from .stats import Tally

if TYPE_CHECKING:
    from ..clock import Clock
    from ..consumer import Consumer
    from ..delivery import Delivery
    from ..engine.notify import Notifier
    from ..partitioned_consumer import PartitionedConsumer

log = logging.getLogger("rqueue.worker")

Handler = Callable[["Delivery"], Any]

# Checks with Redis of one delivery before its handler runs, each answered
# later than the stale age; then it is left to run out and be offered again.
STALE_CHECKS = 3


class LeaseCheck:
    """Whether a delivery that waited in the worker must be checked with
    Redis before its handler runs, for both workers (this one and
    rqueue.aio.Worker). Redis last vouched for the lease when the fetch was
    sent; past ``min(ack_wait, heartbeat_timeout) * STALE_DISPATCH_FRACTION``
    since then (a long wait, or a paused worker) it is asked again, and a
    check that vouches from when it was sent but answers late is checked
    again, up to STALE_CHECKS times."""

    def __init__(self, tag: str, sent: float, now: float, ack_wait: float, heartbeat_timeout: float) -> None:
        self.tag = tag
        self._sent = self._vouched = sent
        #: When the handler may start (monotonic seconds), once no check is wanted.
        self.now = now
        self._safe = min(ack_wait, heartbeat_timeout) * STALE_DISPATCH_FRACTION
        self._checks = 0

    def wanted(self) -> bool:
        return self.now - self._vouched >= self._safe

    def exhausted(self) -> bool:
        """Counts a check; True (and logged) when STALE_CHECKS answered too late."""
        self._checks += 1
        if self._checks <= STALE_CHECKS:
            return False
        log.warning("not running %s: Redis answered %d checks of its lease too late", self.tag, STALE_CHECKS)
        return True

    def lost(self) -> None:
        log.info("not running %s: no longer held %.1f s after its fetch was sent", self.tag, self.now - self._sent)

    def vouched(self, now: float) -> None:
        """Redis vouched for the lease when the check was sent (at the last
        ``now``); ``now`` is after its answer."""
        self._vouched, self.now = self.now, now


class Handlers:
    """``concurrency`` threads that run ``handler`` on the deliveries
    :meth:`submit` gives them."""

    def __init__(
        self,
        handler: Handler,
        concurrency: int,
        *,
        consumer: Consumer | PartitionedConsumer,
        ledger: Ledger,
        tally: Tally,
        retry: Reconnector,
        clock: Clock,
        notifier: Notifier,
        stopping: threading.Event,
        ack_wait: Callable[[], float],
        heartbeat_timeout: float,
        time_limit: float | None = None,
        interrupt: bool = False,
    ) -> None:
        self.handler = handler
        self.concurrency = concurrency
        self._consumer = consumer
        self._ledger = ledger
        self._tally = tally
        self._retry = retry
        self._clock = clock
        self._notifier = notifier
        self._stopping = stopping
        self._ack_wait = ack_wait
        self._heartbeat_timeout = heartbeat_timeout
        self._tasks: queue_module.SimpleQueue[Delivery | None] = queue_module.SimpleQueue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._time_limit = time_limit
        self._limits = TimeLimits(ledger, clock, self._timed_out, interrupt)

    def start(self) -> None:
        """Starts the threads (and the event loop of a coroutine handler)."""
        if inspect.iscoroutinefunction(self.handler):
            self._loop = asyncio.new_event_loop()
            loop_thread = threading.Thread(target=self._loop.run_forever, name="rqueue-async", daemon=True)
            loop_thread.start()
        for i in range(self.concurrency):
            threading.Thread(target=self._work, name=f"rqueue-handler-{i}", daemon=True).start()

    def submit(self, d: Delivery) -> None:
        """Queues a delivery that waits in the ledger for a thread."""
        self._tasks.put(d)

    def stop(self) -> None:
        """Ends each thread once it has finished its current delivery."""
        for _ in range(self.concurrency):
            self._tasks.put(None)
        self._limits.stop()
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)

    def _work(self) -> None:
        ledger = self._ledger
        notifier = self._notifier
        while True:
            d = self._tasks.get()
            if d is None:
                return
            try:
                done = self._handle(d)
            except TimeLimitExceeded:
                return  # interrupted just after its handler ended: timed out, replaced (_timed_out)
            except BaseException as exc:  # never lose the slot or the result
                log.error("could not run the handler on %s: %s: %s", d.tag, type(exc).__name__, exc)
                ledger.stop(d.tag)  # no longer kept alive: its lease runs out and it is offered again
                done = Outcome.SKIPPED, ""
            if done is None:
                # It ran past its time limit, was nacked, and this thread was
                # replaced meanwhile: its result is discarded, and it ends.
                return
            ledger.result(d, done[0], done[1])
            notifier.poke()

    def _timed_out(self, d: Delivery, limit: float) -> None:
        """A handler ran past its time limit (the TimeLimits thread, after
        taking it from the running ones): its nack goes to the dispatcher,
        and a new thread takes the place of the one still running it."""
        self._tally.count(timed_out=1)
        self._ledger.result(d, Outcome.TIMEOUT, str(TimeLimitExceeded(limit)))
        self._notifier.poke()
        threading.Thread(target=self._work, name="rqueue-handler", daemon=True).start()

    def _handle(self, d: Delivery) -> tuple[Outcome, Detail] | None:
        taken = self._ledger.take(d.tag, self._stopping)
        if taken is Outcome.RETURNED:
            # Not started before the stop: the graceful leave hands it back
            # at once rather than running it in the grace period.
            return Outcome.RETURNED, ""
        if isinstance(taken, Outcome):
            # Its lease was lost while it waited (the heartbeat withdrew it).
            self._tally.count(stale_skipped=1)
            return Outcome.SKIPPED, ""
        if d.epoch != self._consumer.epoch_for(d):
            # Made before Redis lost the queue's state: never run.
            self._tally.count(stale_skipped=1)
            return Outcome.SKIPPED, ""
        # One clock reading per message: with a quick handler this
        # bookkeeping is most of a handler thread's work.
        check = LeaseCheck(d.tag, taken, self._clock.monotonic(), self._ack_wait(), self._heartbeat_timeout)
        while check.wanted():
            if check.exhausted():
                self._tally.count(stale_skipped=1)
                return Outcome.SKIPPED, ""
            if not self._still_held(d):
                check.lost()
                self._tally.count(stale_skipped=1)
                return Outcome.SKIPPED, ""
            check.vouched(self._clock.monotonic())  # the check's time is not the handler's (max_run_time)
        started = check.now
        limit = time_limit_for(d.headers, self._time_limit)
        cancellation = Cancellation(limit)
        run = None
        self._ledger.start(d, started)
        if limit is not None:
            run = Run(d, limit, cancellation)
            self._limits.watch(run, started)
        self._tally.handled()
        done: tuple[Outcome, Detail]
        try:
            with processing(self._consumer.queue.name, self._consumer.group, d):
                value = self._call(d, cancellation, run)
            done = Outcome.ACK, ack_detail(value, self._consumer.last_settings)
        except Reject as exc:
            done = Outcome.REJECT, exc.reason
        except Exception as exc:
            if not cancellation.cancelled:
                log.warning(
                    "handler failed on %s (delivery %d): %s: %s", d.tag, d.delivery_count, type(exc).__name__, exc
                )
            done = Outcome.NACK, f"{type(exc).__name__}: {exc}"
        except BaseException:
            if cancellation.cancelled:  # the time limit's cancel, or its interrupt
                return None
            raise
        finally:
            if run is not None:
                run.left_handler()
            # False when the time limit took it first: already nacked.
            mine = self._ledger.stop(d.tag)
            metrics = self._tally.metrics
            if metrics is not None:
                metrics.handler_seconds.observe(self._clock.monotonic() - started)
        return done if mine else None

    def _call(self, d: Delivery, cancellation: Cancellation, run: Run | None) -> Any:
        """The handler's return value."""
        if self._loop is not None:
            future = asyncio.run_coroutine_threadsafe(self._run_coroutine(d, cancellation), self._loop)
            if run is not None:
                run.future = future
                if cancellation.cancelled:  # the limit passed before the future was known
                    future.cancel()
            return future.result()
        token = cancel_mod.enter(cancellation)
        try:
            if run is not None:
                with run.lock:
                    run.in_handler = True
            return self.handler(d)
        finally:
            cancel_mod.leave(token)

    async def _run_coroutine(self, d: Delivery, cancellation: Cancellation) -> Any:
        cancel_mod.enter(cancellation)  # in the task's own context
        return await self.handler(d)

    def _still_held(self, d: Delivery) -> bool:
        """False when a delivery that waited for a handler thread has moved
        on meanwhile (the group may have acked it, and a handler never runs
        a message its group acked: docs/guarantees.md, guarantee 3); extends
        its lease otherwise."""
        try:
            self._retry(self._consumer.in_progress, d)
            return True
        except DeliveryError:
            return False

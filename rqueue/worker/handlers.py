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

from ..constants import STALE_DISPATCH_FRACTION
from ..errors import DeliveryError, Reject
from ..tracing import processing
from .ledger import Ledger
from .outcome import Outcome
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
                outcome, text = self._handle(d)
            except BaseException as exc:  # never lose the slot or the result
                log.error("could not run the handler on %s: %s: %s", d.tag, type(exc).__name__, exc)
                ledger.stop(d.tag)  # no longer kept alive: its lease runs out and it is offered again
                outcome, text = Outcome.SKIPPED, ""
            ledger.result(d, outcome, text)
            notifier.poke()

    def _handle(self, d: Delivery) -> tuple[Outcome, str]:
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
        self._ledger.start(d, started)
        self._tally.handled()
        try:
            with processing(self._consumer.queue.name, self._consumer.group, d):
                self._call(d)
            return Outcome.ACK, ""
        except Reject as exc:
            return Outcome.REJECT, exc.reason
        except Exception as exc:
            log.warning("handler failed on %s (delivery %d): %s: %s", d.tag, d.delivery_count, type(exc).__name__, exc)
            return Outcome.NACK, f"{type(exc).__name__}: {exc}"
        finally:
            self._ledger.stop(d.tag)
            metrics = self._tally.metrics
            if metrics is not None:
                metrics.handler_seconds.observe(self._clock.monotonic() - started)

    def _call(self, d: Delivery) -> None:
        if self._loop is not None:
            asyncio.run_coroutine_threadsafe(self.handler(d), self._loop).result()
        else:
            self.handler(d)

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

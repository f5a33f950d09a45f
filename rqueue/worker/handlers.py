"""The handler threads of a worker: each takes a waiting delivery, runs the
handler on it (a coroutine function on one shared event loop) and hands
the outcome to the dispatcher."""

from __future__ import annotations

import asyncio
import inspect
import logging
import queue as queue_module
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .. import timelimits as cancel_mod
from ..constants import STALE_DISPATCH_FRACTION
from ..errors import DeliveryError, Reject, TimeLimitExceeded
from ..timelimits import Cancellation, time_limit_for
from ..tracing import processing, tracer
from .batch import BatchHandler, failed_batch, outcomes_of
from .lease_check import LeaseCheck, batch_check, held_of, split_held
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

Handler = Callable[["Delivery"], Any] | BatchHandler
Done = list[tuple["Delivery", Outcome, Detail]]


def skipped(deliveries: Sequence[Delivery], run: Sequence[Delivery]) -> Done:
    """The deliveries of a batch that are not run, as their outcomes."""
    if len(run) == len(deliveries):
        return []
    running = {id(d) for d in run}
    return [(d, Outcome.SKIPPED, "") for d in deliveries if id(d) not in running]


def batch_limit(deliveries: list[Delivery], default: float | None) -> float | None:
    """The time limit of a batch: the shortest of its messages' limits."""
    limits = [limit for d in deliveries if (limit := time_limit_for(d.headers, default)) is not None]
    return min(limits) if limits else None


class Handlers:
    """``concurrency`` threads that run ``handler`` on the deliveries
    :meth:`submit_all` gives them: one at a time, or a
    :class:`~rqueue.worker.batch.BatchHandler` on lists of up to its size."""

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
        # A delivery, or a batch handler's batch.
        self._tasks: queue_module.SimpleQueue[Delivery | list[Delivery] | None] = queue_module.SimpleQueue()
        self._batch = handler.size if isinstance(handler, BatchHandler) else 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._time_limit = time_limit
        self._limits = TimeLimits(ledger, clock, self._timed_out, interrupt)

    def start(self) -> None:
        """Starts the threads (and the event loop of a coroutine handler)."""
        handler = self.handler
        if handler.coroutine if isinstance(handler, BatchHandler) else inspect.iscoroutinefunction(handler):
            self._loop = asyncio.new_event_loop()
            loop_thread = threading.Thread(target=self._loop.run_forever, name="rqueue-async", daemon=True)
            loop_thread.start()
        for i in range(self.concurrency):
            threading.Thread(target=self._work, name=f"rqueue-handler-{i}", daemon=True).start()

    def submit_all(self, deliveries: list[Delivery]) -> None:
        """Queues deliveries that wait in the ledger for a thread: one by
        one, or a batch handler's in lists of up to its size."""
        put = self._tasks.put
        size = self._batch
        if size:
            for i in range(0, len(deliveries), size):
                put(deliveries[i : i + size])
        else:
            for d in deliveries:
                put(d)

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
            if isinstance(d, list):
                if self._work_batch(d):
                    continue
                return
            try:
                done = self._handle(d)
            except TimeLimitExceeded:
                return  # interrupted just after its handler ended: timed out, replaced (_timed_out)
            except BaseException as exc:  # never lose the slot or the result
                log.error("could not run the handler on %s: %s: %s", d.tag, type(exc).__name__, exc)
                ledger.stop(d)  # no longer kept alive: its lease runs out and it is offered again
                done = Outcome.SKIPPED, ""
            if done is None:
                # It ran past its time limit, was nacked, and this thread was
                # replaced meanwhile: its result is discarded, and it ends.
                return
            if ledger.result(d, done[0], done[1]):
                notifier.poke()  # else the dispatcher was woken already

    def _timed_out(self, deliveries: list[Delivery], limit: float) -> None:
        """A handler ran past its time limit (the TimeLimits thread, after
        taking its deliveries from the running ones): their nacks go to the
        dispatcher, and a new thread takes the place of the one still
        running it."""
        self._tally.count(timed_out=len(deliveries))
        text = str(TimeLimitExceeded(limit))
        self._ledger.results([(d, Outcome.TIMEOUT, text) for d in deliveries])
        self._notifier.poke()
        threading.Thread(target=self._work, name="rqueue-handler", daemon=True).start()

    def _handle(self, d: Delivery) -> tuple[Outcome, Detail] | None:
        ledger = self._ledger
        consumer = self._consumer
        # One clock reading per message, before the take: a delivery that
        # waited less than the stale age starts at it, taken and started
        # under one lock (with a quick handler this bookkeeping is most of a
        # handler thread's work).
        started = self._clock.monotonic()
        ack_wait = self._ack_wait()
        stale_age = min(ack_wait, self._heartbeat_timeout) * STALE_DISPATCH_FRACTION
        taken = ledger.begin(d, self._stopping, started, stale_age)
        if taken is Outcome.RETURNED:
            # Not started before the stop: the graceful leave hands it back
            # at once rather than running it in the grace period.
            return Outcome.RETURNED, ""
        if isinstance(taken, Outcome):
            # Its lease was lost while it waited (the heartbeat withdrew it).
            self._tally.count(stale_skipped=1)
            return Outcome.SKIPPED, ""
        if d.epoch != consumer.epoch_for(d):
            # Made before Redis lost the queue's state: never run.
            if taken is None:
                ledger.stop(d)
            log.info("not running %s: fetched before Redis lost the queue's state", d.tag)
            self._tally.count(stale_skipped=1)
            return Outcome.SKIPPED, ""
        if taken is not None:
            # It waited past the stale age: Redis is asked first.
            check = LeaseCheck(d.tag, taken, started, ack_wait, self._heartbeat_timeout)
            if not self._lease_holds(d, check):
                self._tally.count(stale_skipped=1)
                return Outcome.SKIPPED, ""
            started = check.now
            ledger.start(d, started)
        headers = d.headers
        limit = time_limit_for(headers, self._time_limit) if headers else self._time_limit
        cancellation = cancel_mod.for_limit(limit)
        if self._clock.monotonic() - started > stale_age and not self._still_held(d):
            # Paused since the take (SIGSTOP, a long GC pause, a stall): Redis
            # may have handed the message on meanwhile, and its group acked it
            # (guarantee 13). What is left is the instant from here to the call.
            ledger.stop(d)
            self._tally.count(stale_skipped=1)
            return Outcome.SKIPPED, ""
        run = None
        if limit is not None:
            run = Run([d], limit, cancellation)
            self._limits.watch(run, started)
        self._tally.handled()
        done: tuple[Outcome, Detail]
        try:
            if tracer() is None:  # no span: nothing to enter around the handler
                value = self._call(d, cancellation, run)
            else:
                with processing(consumer.queue.name, consumer.group, d):
                    value = self._call(d, cancellation, run)
            settings = consumer.last_settings
            done = Outcome.ACK, ack_detail(value, settings) if settings.results else ""
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
            mine = ledger.stop(d)
            metrics = self._tally.metrics
            if metrics is not None:
                metrics.handler_seconds.observe(self._clock.monotonic() - started)
        return done if mine else None

    def _lease_holds(self, d: Delivery, check: LeaseCheck) -> bool:
        """Whether Redis still holds the lease of ``d`` for this worker, asked
        only when the delivery waited long (``check``); ``check.now`` is then
        when the handler may start."""
        while check.wanted():
            if check.exhausted():
                return False
            if not self._still_held(d):
                check.lost()
                return False
            check.vouched(self._clock.monotonic())  # the check's time is not the handler's (max_run_time)
        return True

    # -- batch handlers ---------------------------------------------------------

    def _work_batch(self, deliveries: list[Delivery]) -> bool:
        """Runs the batch handler on ``deliveries`` and hands their outcomes
        to the dispatcher; False when the thread was replaced (the batch ran
        past its time limit) and ends."""
        try:
            done, replaced = self._handle_batch(deliveries)
        except TimeLimitExceeded:
            return False  # interrupted just after its handler ended: timed out, replaced
        except BaseException as exc:  # never lose the slot or the results
            log.error(
                "could not run the batch handler on %d deliveries from %s: %s: %s",
                len(deliveries),
                deliveries[0].tag,
                type(exc).__name__,
                exc,
            )
            self._ledger.stop_batch(deliveries)
            done, replaced = [(d, Outcome.SKIPPED, "") for d in deliveries], False
        self._report(done)
        return not replaced

    def _report(self, done: Done) -> None:
        if done and self._ledger.results(done):
            self._notifier.poke()

    def _handle_batch(self, deliveries: list[Delivery]) -> tuple[Done, bool]:
        """The outcomes of a batch (or, when its time limit took it first,
        none and True). Those it does not run are reported at once: the
        dispatcher forgets a delivery only from its result, also when this
        thread is replaced or interrupted afterwards."""
        ledger = self._ledger
        taken = ledger.take_batch(deliveries, self._stopping)
        if taken is None:
            return [(d, Outcome.RETURNED, "") for d in deliveries], False
        # As for one delivery: never run one whose lease was lost while it
        # waited, or made before Redis lost the queue's state, or (when it
        # waited long) one Redis no longer holds for this worker.
        now = self._clock.monotonic()
        ack_wait = self._ack_wait()
        check = batch_check(deliveries, taken, self._consumer.epoch_for, now, ack_wait, self._heartbeat_timeout)
        while due := check.due():
            checking = check.checking(due)
            asked = self._clock.monotonic()
            for d, held in zip(checking, self._held_of(checking), strict=True):
                if held:
                    check.vouched(d, asked)
                else:
                    check.lost(d)
            check.now = self._clock.monotonic()  # the checks' time is not the handler's (max_run_time)
        run = check.held
        done: Done = skipped(deliveries, run)
        if done:
            self._tally.count(stale_skipped=len(done))
            self._report(done)
        if not run:
            return [], False
        started = check.now
        limit = batch_limit(run, self._time_limit)
        cancellation = cancel_mod.for_limit(limit)
        timed = None
        ledger.start_batch(run, started)
        stale_age = min(ack_wait, self._heartbeat_timeout) * STALE_DISPATCH_FRACTION
        if self._clock.monotonic() - started > stale_age:
            # Paused since the take (SIGSTOP, a long GC pause, a stall): Redis
            # may have handed some of the batch on meanwhile, and its group
            # acked them (guarantee 13). One clock reading per batch; the
            # batch is asked in one round trip, and only what Redis still
            # holds runs. What is left is the instant from here to the call.
            kept = self._still_held_of(run)
            if len(kept) < len(run):
                run = kept
                if not run:
                    return [], False
                limit = batch_limit(run, self._time_limit)
                cancellation = cancel_mod.for_limit(limit)
        if limit is not None:
            timed = Run(run, limit, cancellation)
            self._limits.watch(timed, started)
        self._tally.count(handled=len(run))
        try:
            value = self._call(run, cancellation, timed)
            outcomes = outcomes_of(run, value, self._consumer.last_settings)
        except Exception as exc:
            outcomes = failed_batch(run, exc)
        except BaseException:
            if cancellation.cancelled:  # the time limit's cancel, or its interrupt
                return [], True
            raise
        finally:
            if timed is not None:
                timed.left_handler()
            # False when the time limit took the batch first: already nacked.
            mine = ledger.stop_batch(run)
            metrics = self._tally.metrics
            if metrics is not None:
                metrics.handler_seconds.observe(self._clock.monotonic() - started)
        return (outcomes, False) if mine else ([], True)

    def _call(self, d: Any, cancellation: Cancellation, run: Run | None) -> Any:
        """The handler's return value (``d`` is a list of deliveries for a
        batch handler)."""
        if self._loop is not None:
            future = asyncio.run_coroutine_threadsafe(self._run_coroutine(d, cancellation), self._loop)
            if run is not None:
                run.future = future
                if cancellation.cancelled:  # the limit passed before the future was known
                    future.cancel()
            return future.result()
        if run is None:  # no time limit: the thread's cancellation already never fires
            return self.handler(d)
        token = cancel_mod.enter(cancellation)
        try:
            with run.lock:
                run.in_handler = True
            return self.handler(d)
        finally:
            cancel_mod.leave(token)

    async def _run_coroutine(self, d: Any, cancellation: Cancellation) -> Any:
        cancel_mod.enter(cancellation)  # in the task's own context
        return await self.handler(d)

    def _still_held_of(self, run: list[Delivery]) -> list[Delivery]:
        """Of a started batch whose handler is not yet called, the deliveries
        Redis still holds for this worker (their leases extended), asked in
        one round trip; the others are stopped, counted and reported as not
        run."""
        held = self._held_of(run)
        if all(held):
            return run
        kept, gone = split_held(run, held)
        self._ledger.stop_batch(gone)
        self._tally.count(stale_skipped=len(gone))
        self._report([(d, Outcome.SKIPPED, "") for d in gone])
        return kept

    def _held_of(self, deliveries: list[Delivery]) -> list[bool]:
        """Per delivery of a batch that waited long, whether Redis still holds
        it for this worker (its lease then extended), in one call."""
        if not deliveries:
            return []
        return held_of(self._retry(self._consumer.in_progress_available, deliveries))

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

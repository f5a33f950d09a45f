"""The asyncio worker: the threaded worker's design (docs/worker.md) as
tasks on the caller's event loop. One dispatcher task fetches and settles,
``concurrency`` handler tasks run the handler, one task beats; they share
a :class:`~rqueue.worker.ledger.Ledger`, count in the same
:class:`~rqueue.worker.stats.WorkerStats` and follow the same rules (the
tests run the worker tests against both workers).

Long because it holds the four parts of the threaded worker (control,
dispatcher, handlers, heartbeat) in one module: each is the async twin of
a small class there, and they share one object's state here.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import logging
import signal
import threading
from collections.abc import Callable
from typing import Any, cast

from .. import timelimits as cancel_mod
from ..constants import (
    DEFAULT_CONCURRENCY,
    DEFAULT_GRACE_PERIOD,
    DEFAULT_HEARTBEAT_INTERVAL,
    DEFAULT_HEARTBEAT_TIMEOUT,
    DEFAULT_MAX_RUN_TIME,
    DEFAULT_RECONNECT_TIMEOUT,
    IDLE_POLL_INTERVAL,
    STALE_DISPATCH_FRACTION,
)
from ..delivery import Delivery as SyncDelivery
from ..errors import DeliveryError, NotMember, OutOfMemory, Reject, RQueueError, TimeLimitExceeded
from ..names import check_name
from ..settings import Settings
from ..timelimits import Cancellation, time_limit_for
from ..tracing import dead_lettered, processing, tracer
from ..worker.batch import BatchHandler, default_prefetch, failed_batch, outcomes_of
from ..worker.dispatcher import redis_wait
from ..worker.handlers import batch_limit, skipped
from ..worker.lease_check import LeaseCheck, batch_check, held_of, split_held
from ..worker.ledger import Ledger
from ..worker.metrics import WorkerMetrics
from ..worker.options import check_options
from ..worker.outcome import Completion, Detail, Outcome, ack_detail, acks_done, nacks_done, reject_done, settles
from ..worker.reconnect import STOP_PATIENCE, TRANSIENT
from ..worker.stats import Tally, WorkerStats
from ..worker.window import PrefetchWindow
from .consumer import Consumer as PlainConsumer
from .consumer import Delivery
from .partitions import PartitionedConsumer, PartitionedQueue
from .queue import Queue
from .reconnect import AsyncReconnector
from .threads import DaemonThreads

log = logging.getLogger("rqueue.worker")

Handler = Callable[[Delivery], Any] | BatchHandler
Done = list[tuple[Any, Outcome, Detail]]  # aio Deliveries, in the shared Ledger
Consumer = PlainConsumer | PartitionedConsumer


def _epochs(consumer: Consumer) -> Callable[[SyncDelivery], int]:
    """The state epoch each delivery in the shared Ledger is judged by: its
    own partition's for a partitioned consumer (the Ledger holds only this
    consumer's aio Deliveries)."""
    return cast("Callable[[SyncDelivery], int]", consumer.epoch_for)


class Worker:
    """Runs ``handler(delivery)`` for each message of ``group`` on ``queue``
    (an :class:`rqueue.aio.Queue`), as ``concurrency`` tasks on the event
    loop that awaits :meth:`run`.

    The semantics are :class:`rqueue.Worker`'s: a normal return acks, an
    exception nacks under the redelivery policy, :class:`rqueue.Reject`
    dead-letters; up to ``prefetch`` deliveries are held (left unset, ``2 *
    concurrency`` at first and more while quick handlers wait for fetches,
    as :class:`rqueue.Worker`'s), those waiting for a task kept alive by the
    heartbeat; one that waited long is checked with Redis before it runs.
    ``handler`` is a coroutine function, or a plain function, which then
    runs in a thread (asyncio.to_thread) so that it does not block the loop.

    :meth:`run` works until :meth:`stop`, SIGTERM / SIGINT (when it runs in
    the main thread) or the cancellation of its task: fetching stops,
    deliveries not started are handed back, running handlers get
    ``grace_period`` seconds, the rest is returned at once and the worker
    leaves the group. A second signal (or ``stop(now=True)``) stops at once.

    ``time_limit`` (seconds; a message's ``x-rq-time-limit`` header
    overrides it): past it the handler's task is cancelled, its
    :func:`rqueue.cancellation` set, the message nacked with the reason
    ``timeout``, and whatever the handler does later is discarded.

    ``handler`` may be a :class:`rqueue.BatchHandler`, as for
    :class:`rqueue.Worker`: a list of deliveries per call, their outcomes
    returned (docs/worker.md, "Batch handlers").
    """

    def __init__(
        self,
        queue: Queue | PartitionedQueue,
        group: str,
        handler: Handler,
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        name: str | None = None,
        prefetch: int | None = None,
        heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL,
        heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT,
        max_run_time: float = DEFAULT_MAX_RUN_TIME,
        grace_period: float = DEFAULT_GRACE_PERIOD,
        reconnect_timeout: float = DEFAULT_RECONNECT_TIMEOUT,
        metrics: WorkerMetrics | None = None,
        time_limit: float | None = None,
    ) -> None:
        check_options(
            handler,
            concurrency,
            prefetch,
            heartbeat_interval,
            heartbeat_timeout,
            max_run_time,
            grace_period,
            reconnect_timeout,
            time_limit,
        )
        self.queue = queue
        self.group = check_name("group", group)
        if name is not None:
            check_name("consumer", name)
        self.handler = handler
        self.concurrency = concurrency
        self.name = name
        self._window = PrefetchWindow.of(prefetch, default_prefetch(handler, concurrency))
        #: The most deliveries it holds at once (its consumer's prefetch).
        self.prefetch = self._window.cap
        self.heartbeat_interval = heartbeat_interval
        self.heartbeat_timeout = heartbeat_timeout
        self.max_run_time = max_run_time
        self.grace_period = grace_period
        self.reconnect_timeout = reconnect_timeout
        #: Seconds each run of the handler may take (None: no limit but max_run_time's).
        self.time_limit = time_limit
        self.stats = WorkerStats()
        #: The worker's member of the group, once :meth:`run` has joined it.
        self.consumer: Consumer | None = None
        self._clock = queue.client.clock
        self._notifier = queue.client.notifier
        #: Where the counters also go (rqueue.worker.metrics), as for the threaded worker.
        self.metrics = metrics
        self._tally = Tally(self.stats, metrics)
        self._stopping = threading.Event()
        self._hard_stop = threading.Event()
        self._retry = AsyncReconnector(
            reconnect_timeout, self._tally, hard_stop=self._hard_stop, randomness=queue.client.randomness
        )
        batch = handler if isinstance(handler, BatchHandler) else None
        self._coroutine = batch.coroutine if batch is not None else inspect.iscoroutinefunction(handler)
        self._batch = batch.size if batch is not None else 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ledger = Ledger()
        self._tasks: asyncio.Queue[Delivery | list[Delivery] | None] = asyncio.Queue()
        self._dispatching: asyncio.Task[None] | None = None
        self._beating: asyncio.Task[None] | None = None
        self._stop_wake: asyncio.Future[None] | None = None  # held: the loop keeps tasks weakly
        self._beat_stop = asyncio.Event()
        # Handler runs cut off at their time limit, kept until they end
        # (the loop holds tasks weakly), their outcome discarded.
        self._abandoned: set[asyncio.Task[Any]] = set()
        self._pool: DaemonThreads | None = None  # made at the first plain handler run

    # -- control ------------------------------------------------------------------

    async def run(self, install_signal_handlers: bool = True) -> WorkerStats:
        """Works until stopped; returns the counters. Cancelling the task
        that awaits it stops the worker as :meth:`stop` does (grace period
        included; a second cancel as ``stop(now=True)``), then raises
        CancelledError, also when the shutdown failed (logged)."""
        loop = self._loop = asyncio.get_running_loop()
        signals = install_signal_handlers and threading.current_thread() is threading.main_thread()
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)} if signals else {}
        for sig in previous:
            loop.add_signal_handler(sig, self._on_signal, sig)
        cancelled = False
        try:
            consumer = await self._retry.call(self._join)
            self.consumer = consumer
            handlers = [loop.create_task(self._work(), name=f"rqueue-handler-{i}") for i in range(self.concurrency)]
            self._beating = loop.create_task(self._beat(consumer), name="rqueue-heartbeat")
            log.info(
                "worker %s joined %s/%s with %d handler tasks",
                consumer.name,
                self.queue.name,
                self.group,
                self.concurrency,
            )
            try:
                dispatching = self._dispatching = loop.create_task(self._dispatch(consumer), name="rqueue-dispatcher")
                cancelled = await self._until_done(dispatching)
                self._ended(dispatching, cancelled, "the dispatcher")  # a cancelled one: stop(now=True) cut it off
            finally:
                shutting = loop.create_task(self._shutdown(consumer, handlers), name="rqueue-shutdown")
                cancelled = await self._until_done(shutting) or cancelled
                self._ended(shutting, cancelled, "the shutdown")
        finally:
            for sig, handler in previous.items():
                loop.remove_signal_handler(sig)
                signal.signal(sig, handler)  # asyncio.run's own SIGINT handler, say
        if cancelled:
            raise asyncio.CancelledError
        return self.stats

    async def _until_done(self, task: asyncio.Task[Any]) -> bool:
        """Waits for ``task`` to end whatever cancels reach run(): the first
        stops the worker as stop() does, so that the dispatcher's round
        under way, with the acks it carries, ends first; a later one as
        stop(now=True), as a second signal does. Never cancels ``task``
        itself. True when a cancel came."""
        cancels = 0
        while not task.done():
            try:
                await asyncio.wait([task])
            except asyncio.CancelledError:
                cancels += 1
                self.stop(now=cancels > 1)
        return cancels > 0

    def _ended(self, task: asyncio.Task[Any], cancelled: bool, what: str) -> None:
        """Raises the failure ``task`` ended with, unless run() was
        cancelled: it then raises CancelledError, as the caller's timeout or
        task group expects, and the failure is logged."""
        if task.cancelled() or (failure := task.exception()) is None:
            return
        if not cancelled:
            raise failure
        name = self.consumer.name if self.consumer is not None else self.name
        log.warning("worker %s: %s failed after run() was cancelled: %s", name, what, failure)

    async def _join(self) -> PlainConsumer | PartitionedConsumer:
        consumer = self.queue.consumer(self.group, self.name, prefetch=self.prefetch, liveness=self.heartbeat_timeout)
        return await consumer.join()

    def stop(self, now: bool = False) -> None:
        """Stops fetching; running handlers get the grace period. With
        ``now``: no grace period, no retries, and a Redis call under way is
        cut off. Safe to call from any thread."""
        if now:
            self._hard_stop.set()
        self._stopping.set()
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake, now)

    def _wake(self, now: bool) -> None:
        self._notifier.poke()
        consumer = self.consumer
        if consumer is not None and consumer.waits_on_wakes():
            # The dispatcher may be waiting in Redis for the queue's wake-up:
            # an entry ends the wait (a task: a stop never waits for Redis).
            self._stop_wake = asyncio.ensure_future(self._end_waits(consumer))
        if now:
            self._retry.cut_off_soon()
            # A Redis call under way may finish within STOP_PATIENCE (the
            # cut-off ends it after), so that the acks it carries apply, as
            # in the threaded worker; any other wait of the dispatcher ends now.
            dispatching = self._dispatching
            if dispatching is not None and not self._retry.attempting(dispatching):
                dispatching.cancel()

    @staticmethod
    async def _end_waits(consumer: PlainConsumer | PartitionedConsumer) -> None:
        try:
            await consumer.end_waits()
        except Exception as exc:  # a hint only: the wait ends by itself
            log.debug("could not wake the dispatcher (%s); it stops when its wait ends", exc)

    def _on_signal(self, sig: signal.Signals) -> None:
        if self._stopping.is_set():
            log.warning("second %s: stopping at once", sig.name)
            self.stop(now=True)
        else:
            log.info("%s: finishing running handlers, then leaving", sig.name)
            self.stop()

    def _ack_wait(self) -> float:
        assert self.consumer is not None
        return self.consumer.last_settings.ack_wait

    def _has_news(self) -> bool:
        return self._ledger.has_results() or self._stopping.is_set()

    # -- the dispatcher (rqueue.worker.dispatcher) ----------------------------------

    async def _dispatch(self, consumer: Consumer) -> None:
        ledger = self._ledger
        notifier = self._notifier
        parts = self.queue.parts if isinstance(self.queue, PartitionedQueue) else [self.queue]
        channels = [part.keys.wake_channel for part in parts]
        idle_wait: float | None = None  # set: the next fetch waits for the queue's wake-up first
        while not self._stopping.is_set():
            since = {} if idle_wait is not None else {ch: await notifier.generation(ch) for ch in channels}
            acks, others = ledger.drain()
            await self._settle_others(consumer, others)
            free = self._window.size - ledger.unsettled()
            if free <= 0 and not acks:
                await notifier.wait_any(since, IDLE_POLL_INTERVAL, until=self._has_news)
                continue
            # The lease of what this fetch brings begins after it is sent.
            sent = self._clock.monotonic()
            joins, epoch = consumer.join_marks(), consumer.state_epoch
            # As rqueue.worker.dispatcher: only a stop brings news while nothing runs.
            idle = not acks and not others and ledger.unsettled() == 0
            wait_first = idle_wait if idle else None
            idle_wait = None
            statuses, deliveries, due_in = await self._retry.call(
                consumer.ack_and_fetch, acks, max(free, 0), wait_first, idle
            )
            self._window.fetched(max(free, 0), len(deliveries), ledger.waiting(), ledger.running())
            lost = consumer.state_epoch != epoch
            if lost:
                dropped = ledger.forget_waiting(epoch_for=_epochs(consumer))
                log.warning(
                    "worker %s: Redis lost the queue's state; %d waiting deliveries dropped, not run",
                    consumer.name,
                    dropped,
                )
            elif (taken := consumer.rejoined_since(joins)) is not None:
                dropped = ledger.forget_waiting(taken=taken)
                log.warning(
                    "worker %s had been removed from its group and joined again; "
                    "%d waiting deliveries dropped, not run",
                    consumer.name,
                    dropped,
                )
            self._record_acks(statuses)
            ledger.fetched(deliveries)  # type: ignore[arg-type]  # an aio Delivery is a Delivery
            handed_back = 0
            if self._retry.resync or lost:
                # After a loss the consumer drops what a fetch sent before it
                # brought; those messages are held in Redis and go back now.
                handed_back = await self._hand_back_unknown(consumer)
            if deliveries:
                self._tally.count(fetched=len(deliveries), redelivered=sum(1 for d in deliveries if d.redelivered))
                ledger.wait(deliveries, sent)  # type: ignore[arg-type]
                put, size = self._tasks.put_nowait, self._batch
                if size:
                    for i in range(0, len(deliveries), size):
                        put(deliveries[i : i + size])
                else:
                    for d in deliveries:
                        put(d)
                continue
            if acks or others or handed_back:
                continue  # what went back is ready now (as rqueue.worker.dispatcher)
            wait = IDLE_POLL_INTERVAL if due_in is None else min(IDLE_POLL_INTERVAL, due_in)
            if consumer.waits_on_wakes() and ledger.unsettled() == 0 and not self._has_news():
                # the next round's fetch waits in Redis
                idle_wait = redis_wait(
                    wait, self._retry.timeout, consumer.last_settings.ack_wait, self.heartbeat_timeout
                )
                continue
            if not since:
                continue  # this round's fetch followed a wait in Redis: the channels are read first
            await notifier.wait_any(since, wait, until=self._has_news)

    async def _settle(self, consumer: Consumer) -> None:
        acks, others = self._ledger.drain()
        if acks:
            self._record_acks(await self._retry.call(consumer.ack_available, acks))
        await self._settle_others(consumer, others)

    async def _hand_back_unknown(self, consumer: Consumer) -> int:
        known = self._ledger.known()
        result = await self._retry.call(consumer.heartbeat, known, self.heartbeat_timeout, sync=True)
        self._retry.resync = False
        if result.handed_back:
            log.warning("handed back %d deliveries whose fetch reply was lost", result.handed_back)
        return result.handed_back

    async def _hand_back_waiting(self, consumer: Consumer) -> None:
        waiting = self._ledger.withdraw_waiting()
        if not waiting:
            return
        keep = self._ledger.known()
        try:
            result = await self._retry.call_once(consumer.heartbeat, keep, self.heartbeat_timeout, sync=True)
        except Exception as exc:
            log.warning(
                "could not hand back %d waiting deliveries (%s: %s); the leave returns them",
                len(waiting),
                type(exc).__name__,
                exc,
            )
            return
        log.info("handed back %d deliveries that had not started", result.handed_back)

    def _record_acks(self, statuses: list[RQueueError | None]) -> None:
        acks_done(statuses, self._retry.resync, self._tally)

    async def _settle_others(self, consumer: Consumer, others: list[tuple[Any, Outcome, Detail]]) -> None:
        """As rqueue.worker.dispatcher.Dispatcher._settle_others."""
        todo = settles(others)
        await self._ack_keeping(consumer, todo.keeping)
        for d, reason in todo.rejected:
            sent = 0

            async def reject(d: Any = d, reason: str = reason) -> None:
                nonlocal sent
                sent += 1
                await consumer.reject(d, reason=reason)

            refused: DeliveryError | None = None
            try:
                await self._retry.call(reject)
            except DeliveryError as exc:
                refused = exc
            if reject_done(d, reason, refused, sent > 1, self._tally):
                dead_lettered(self.queue.name, self.group, d, "rejected")
                await self._keep_failure(consumer, d, "rejected", reason)
        for (error, timed_out), deliveries in todo.failed.items():
            await self._nack_all(consumer, deliveries, error, timed_out)

    async def _nack_all(self, consumer: Consumer, deliveries: list[Any], error: str, timed_out: bool) -> None:
        """As rqueue.worker.dispatcher.Dispatcher._nack_all."""
        outcome = Outcome.TIMEOUT if timed_out else Outcome.NACK
        sent = 0

        async def nack_available() -> list[str | RQueueError]:
            nonlocal sent
            sent += 1
            statuses: list[str | RQueueError] = await consumer.nack_available(
                deliveries, error=error, timed_out=timed_out
            )
            return statuses

        statuses = await self._retry.call(nack_available)
        for d in nacks_done(outcome, deliveries, statuses, sent > 1, self._tally):
            log.warning(
                "dead-lettered %s: %d deliveries reached max_deliveries; last error: %s", d.tag, d.delivery_count, error
            )
            dead_lettered(self.queue.name, self.group, d, "max-deliveries")
            await self._keep_failure(consumer, d, "max-deliveries", error)

    async def _ack_keeping(self, consumer: Consumer, keeping: list[tuple[Any, Completion]]) -> None:
        """As rqueue.worker.dispatcher.Dispatcher._ack_keeping."""
        for event in (False, True):
            items = [(d, c.value) for d, c in keeping if c.event is event]
            if items:
                self._record_acks(await self._retry.call(consumer.ack_results, items, event))

    async def _keep_failure(self, consumer: Consumer, d: Any, reason: str, error: str) -> None:
        if not consumer.last_settings.results:
            return

        async def keep() -> OutOfMemory | None:
            # As rqueue.worker.dispatcher.Dispatcher._keep_failure: not kept on a full server.
            try:
                await consumer.keep_failure(d, reason, error)
            except OutOfMemory as exc:
                return exc
            return None

        try:
            refused: RQueueError | None = await self._retry.call(keep)
        except RQueueError as exc:
            refused = exc
        if refused is not None:
            log.warning("failure of %s not kept as its result: %s", d.tag, refused)

    # -- the handler tasks (rqueue.worker.handlers) ---------------------------------

    async def _work(self) -> None:
        ledger = self._ledger
        while True:
            if _cancelling():
                # Cancelled at the stop while its handler swallowed it: ends
                # here, once that handler returned.
                raise asyncio.CancelledError
            d = await self._tasks.get()
            if d is None:
                return
            if isinstance(d, list):
                await self._work_batch(d)
                continue
            try:
                outcome, text = await self._handle(d)
            except asyncio.CancelledError:
                ledger.stop(d)
                raise
            except BaseException as exc:  # never lose the slot or the result
                log.error("could not run the handler on %s: %s: %s", d.tag, type(exc).__name__, exc)
                ledger.stop(d)
                outcome, text = Outcome.SKIPPED, ""
            if ledger.result(d, outcome, text):  # else the dispatcher was woken already
                self._notifier.poke()

    async def _handle(self, d: Delivery) -> tuple[Outcome, Detail]:
        ledger = self._ledger
        # As rqueue.worker.handlers: one clock reading, before the take; a
        # delivery that waited less than the stale age starts at it, taken
        # and started in one step, with no check to await.
        started = self._clock.monotonic()
        ack_wait = self._ack_wait()
        stale_age = min(ack_wait, self.heartbeat_timeout) * STALE_DISPATCH_FRACTION
        taken = ledger.begin(d, self._stopping, started, stale_age)
        if taken is Outcome.RETURNED:
            return Outcome.RETURNED, ""
        if isinstance(taken, Outcome) or d.epoch != d.consumer.state_epoch:
            # Its lease was lost while it waited (logged by the ledger), or it
            # was made before Redis lost the queue's state: never run.
            if not isinstance(taken, Outcome):
                if taken is None:
                    ledger.stop(d)
                log.info("not running %s: fetched before Redis lost the queue's state", d.tag)
            self._tally.count(stale_skipped=1)
            return Outcome.SKIPPED, ""
        if taken is not None:
            check = LeaseCheck(d.tag, taken, started, ack_wait, self.heartbeat_timeout)
            if not await self._lease_holds(d, check):
                self._tally.count(stale_skipped=1)
                return Outcome.SKIPPED, ""
            started = check.now
            ledger.start(d, started)
        if self._clock.monotonic() - started > stale_age and not await self._still_held(d):
            # As rqueue.worker.handlers: paused since the take, Redis may have
            # handed the message on and its group acked it (guarantee 13).
            ledger.stop(d)
            self._tally.count(stale_skipped=1)
            return Outcome.SKIPPED, ""
        self._tally.handled()
        headers = d.headers
        limit = time_limit_for(headers, self.time_limit) if headers else self.time_limit
        try:
            if limit is None and tracer() is None:  # no span: nothing to enter around the handler
                value = await self._call(d, cancel_mod.for_limit(None))
            else:
                with processing(self.queue.name, self.group, d):
                    if limit is None:
                        value = await self._call(d, cancel_mod.for_limit(None))
                    else:
                        finished, value = await self._call_within(d, limit)
                        if not finished:
                            self._tally.count(timed_out=1)
                            return Outcome.TIMEOUT, str(TimeLimitExceeded(limit))
            settings = self._consumer_settings()
            return Outcome.ACK, ack_detail(value, settings) if settings.results else ""
        except Reject as exc:
            return Outcome.REJECT, exc.reason
        except Exception as exc:
            log.warning("handler failed on %s (delivery %d): %s: %s", d.tag, d.delivery_count, type(exc).__name__, exc)
            return Outcome.NACK, f"{type(exc).__name__}: {exc}"
        except asyncio.CancelledError as exc:
            if _cancelling():
                raise  # this task is cancelled: the worker stops
            # The handler's own (it awaited something cancelled elsewhere): a
            # failure like any other, so the slot and the delivery go on.
            log.warning("handler failed on %s (delivery %d): CancelledError: %s", d.tag, d.delivery_count, exc)
            return Outcome.NACK, f"CancelledError: {exc}"
        finally:
            self._ledger.stop(d)
            self._observe_run(started)

    async def _lease_holds(self, d: Delivery, check: LeaseCheck) -> bool:
        """Whether Redis still holds the lease of ``d``, asked only when it
        waited long (or the loop was blocked)."""
        while check.wanted():
            if check.exhausted():
                return False
            if not await self._still_held(d):
                check.lost()
                return False
            check.vouched(self._clock.monotonic())
        return True

    async def _work_batch(self, deliveries: list[Delivery]) -> None:
        """rqueue.worker.handlers.Handlers._work_batch on the loop."""
        ledger = self._ledger
        try:
            done = await self._handle_batch(deliveries)
        except asyncio.CancelledError:
            ledger.stop_batch(deliveries)
            raise
        except BaseException as exc:  # never lose the slot or the results
            log.error(
                "could not run the batch handler on %d deliveries from %s: %s: %s",
                len(deliveries),
                deliveries[0].tag,
                type(exc).__name__,
                exc,
            )
            ledger.stop_batch(deliveries)
            done = [(d, Outcome.SKIPPED, "") for d in deliveries]
        if ledger.results(done):
            self._notifier.poke()

    async def _handle_batch(self, deliveries: list[Delivery]) -> Done:
        """The outcome of every delivery of a batch, as the threaded
        worker's Handlers._handle_batch decides it."""
        ledger = self._ledger
        taken = ledger.take_batch(deliveries, self._stopping)
        if taken is None:
            return [(d, Outcome.RETURNED, "") for d in deliveries]
        ack_wait = self._ack_wait()
        check = batch_check(
            deliveries,
            taken,
            lambda d: d.consumer.state_epoch,
            self._clock.monotonic(),
            ack_wait,
            self.heartbeat_timeout,
        )
        while due := check.due():
            checking = check.checking(due)
            asked = self._clock.monotonic()
            for d, held in zip(checking, await self._held_of(checking), strict=True):
                if held:
                    check.vouched(d, asked)
                else:
                    check.lost(d)
            check.now = self._clock.monotonic()
        run: list[Any] = check.held
        done: Done = skipped(deliveries, run)
        if done:
            self._tally.count(stale_skipped=len(done))
        if not run:
            return done
        started = check.now
        ledger.start_batch(run, started)
        stale_age = min(ack_wait, self.heartbeat_timeout) * STALE_DISPATCH_FRACTION
        if self._clock.monotonic() - started > stale_age:
            # As rqueue.worker.handlers: paused since the take, Redis may have
            # handed some of the batch on and its group acked them (guarantee
            # 13); the batch is asked in one round trip, and only what Redis
            # still holds runs.
            holding = await self._held_of(run)
            if not all(holding):
                run, gone = split_held(run, holding)
                ledger.stop_batch(gone)
                self._tally.count(stale_skipped=len(gone))
                done += [(d, Outcome.SKIPPED, "") for d in gone]
                if not run:
                    return done
        self._tally.count(handled=len(run))
        limit = batch_limit(run, self.time_limit)
        try:
            if limit is None:
                value = await self._call(run, cancel_mod.for_limit(None))
            else:
                finished, value = await self._call_within(run, limit)
                if not finished:
                    self._tally.count(timed_out=len(run))
                    text = str(TimeLimitExceeded(limit))
                    return done + [(d, Outcome.TIMEOUT, text) for d in run]
            return done + outcomes_of(run, value, self._consumer_settings())
        except Exception as exc:
            return done + failed_batch(run, exc)
        except asyncio.CancelledError as exc:
            if _cancelling():
                raise
            return done + failed_batch(run, exc)  # the handler's own, as in _handle
        finally:
            ledger.stop_batch(run)
            self._observe_run(started)

    def _observe_run(self, started: float) -> None:
        """A handler run's time into the metrics, as the threaded worker's."""
        metrics = self._tally.metrics
        if metrics is not None:
            metrics.handler_seconds.observe(self._clock.monotonic() - started)

    def _consumer_settings(self) -> Settings:
        assert self.consumer is not None
        return self.consumer.last_settings

    async def _call(self, d: Any, cancellation: Cancellation) -> Any:
        """The handler's return value (``d`` is a list of deliveries for a
        batch handler)."""
        cancel_mod.enter(cancellation)  # this task's context, copied to the thread
        if self._coroutine:
            return await self.handler(d)
        run = functools.partial(contextvars.copy_context().run, self.handler, d)
        return await asyncio.get_running_loop().run_in_executor(self._threads(), run)

    def _threads(self) -> DaemonThreads:
        """The threads plain handlers run on: ``concurrency`` daemon threads
        of the worker's own, so that none waits for a thread (the loop's
        default pool has min(32, CPUs + 4), shared with everything on the
        loop) and a hung handler never keeps the process from exiting."""
        if self._pool is None:
            self._pool = DaemonThreads(self.concurrency, "rqueue-handler")
        return self._pool

    def _renew_threads(self) -> None:
        """A plain handler cut off at its time limit keeps its thread until
        it returns: later runs get a pool of their own, and the old one
        ends its threads as their runs end."""
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    async def _call_within(self, d: Any, limit: float) -> tuple[bool, Any]:
        """Runs the handler as a task of its own for up to ``limit`` seconds:
        (True, its return value), or (False, None) when it ran past it: the
        task is then cancelled and left to end on its own (a handler that
        ignores the cancellation cannot hold the worker up or ack later),
        its outcome discarded."""
        cancellation = Cancellation(limit)
        what = f"a batch of {len(d)} from {d[0].tag}" if isinstance(d, list) else d.tag
        run = asyncio.get_running_loop().create_task(self._call(d, cancellation), name=f"rqueue-handler {what}")
        try:
            done, _ = await asyncio.wait({run}, timeout=limit)
        except asyncio.CancelledError:
            run.cancel()
            raise
        if done:
            return True, run.result()  # its exception, if any, is the handler's outcome
        log.warning("handler ran past its time limit of %g s on %s: nacked (timeout)", limit, what)
        cancellation.cancel()
        run.cancel()
        if not self._coroutine:
            self._renew_threads()
        self._abandoned.add(run)
        run.add_done_callback(self._forget)
        return False, None

    def _forget(self, run: asyncio.Task[Any]) -> None:
        self._abandoned.discard(run)
        if not run.cancelled() and run.exception() is not None:
            log.info("handler cut off at its time limit ended with %r (discarded)", run.exception())

    async def _held_of(self, deliveries: list[Any]) -> list[bool]:
        """As rqueue.worker.handlers.Handlers._held_of."""
        if not deliveries:
            return []
        assert self.consumer is not None
        return held_of(await self._retry.call(self.consumer.in_progress_available, deliveries))

    async def _still_held(self, d: Delivery) -> bool:
        assert self.consumer is not None
        try:
            await self._retry.call(self.consumer.in_progress, d)
            return True
        except DeliveryError:
            return False

    # -- the heartbeat (rqueue.worker.heartbeat) --------------------------------------

    async def _beat(self, consumer: Consumer) -> None:
        ledger = self._ledger
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._beat_stop.wait(), min(self.heartbeat_interval, self._ack_wait() / 3))
            if self._beat_stop.is_set():
                return
            running, waiting = ledger.leases(self._clock.monotonic(), self.max_run_time)
            epoch = consumer.state_epoch
            try:
                statuses, removed, returned, dead, _ = await self._retry.call_once(
                    consumer.heartbeat, running + waiting, self.heartbeat_timeout
                )
            except NotMember as removal:
                dropped = ledger.forget_waiting(taken=consumer.removed_by(removal))
                log.warning(
                    "worker %s had been removed from its group; %d waiting deliveries dropped, not run; joining again",
                    consumer.name,
                    dropped,
                )
                try:
                    await self._retry.call_once(consumer.rejoin, removal)
                except Exception as exc:
                    log.warning("could not join again (%s: %s)", type(exc).__name__, exc)
                continue
            except TRANSIENT as exc:
                log.debug("heartbeat failed (%s); the dispatcher handles reconnecting", exc)
                continue
            except Exception:
                log.exception("heartbeat failed")
                continue
            finally:
                if consumer.state_epoch != epoch:
                    # Redis lost the queue's state (the consumer logged it):
                    # what waits from before the loss never runs; what the
                    # dispatcher fetched since (a newer epoch) does.
                    dropped = ledger.forget_waiting(epoch_for=_epochs(consumer))
                    log.warning("worker %s: %d waiting deliveries dropped, not run", consumer.name, dropped)
            # A delivery settled since the heartbeat listed it (its ack
            # raced this call) is refused as no longer held, not lost.
            lost = sum(
                1 for d, s in zip(running + waiting, statuses, strict=False) if s is not None and ledger.is_known(d)
            )
            gone = [(d, s) for d, s in zip(waiting, statuses[len(running) :], strict=False) if s is not None]
            if gone:
                ledger.lost(gone)
            self._tally.count(leases_lost=lost, members_removed=removed)
            if removed:
                log.warning(
                    "removed %d silent member(s) of %s/%s: %d deliveries offered again, %d dead-lettered",
                    removed,
                    self.queue.name,
                    consumer.group,
                    returned,
                    dead,
                )

    # -- stopping (rqueue.worker.control) ---------------------------------------------

    async def _shutdown(self, consumer: Consumer, handlers: list[asyncio.Task[None]]) -> None:
        """Hands back what has not started, gives running handlers the grace
        period, settles what finished, and leaves the group."""
        self._stopping.set()
        hard = self._hard_stop.is_set
        deadline = self._clock.monotonic() + (0.0 if hard() else self.grace_period)
        ledger = self._ledger
        try:
            try:
                if not hard():
                    await self._hand_back_waiting(consumer)
                while ledger.unsettled() and self._clock.monotonic() < deadline and not hard():
                    await self._settle(consumer)
                    if ledger.unsettled():
                        left = max(0.0, deadline - self._clock.monotonic())
                        await self._notifier.wait("", 0, min(0.05, left), until=ledger.has_results)
                await self._settle(consumer)
            finally:
                self._beat_stop.set()
                if self._beating is not None:
                    with contextlib.suppress(BaseException):
                        await self._beating
            returned = await self._retry.call(consumer.close)
            log.info(
                "worker %s left %s/%s; %d deliveries returned", consumer.name, self.queue.name, self.group, returned
            )
        finally:
            for task in handlers:
                task.cancel()
            # A handler that swallows its cancellation is left to end on its
            # own, as one cut off at its time limit is: the worker has left.
            _, pending = await asyncio.wait(handlers, timeout=STOP_PATIENCE) if handlers else (set(), set())
            for task in pending:
                log.warning("a handler task ignored its cancellation at the stop; left to end on its own")
                self._abandoned.add(task)
                task.add_done_callback(self._forget)
            self._renew_threads()


def _cancelling() -> int:
    """How many cancellations of the current task are pending."""
    task = asyncio.current_task()
    return task.cancelling() if task is not None else 0

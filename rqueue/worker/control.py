"""The classes that run workers: :class:`Worker` for a queue,
:class:`PartitionedWorker` for a partitioned one (one fetch loop over every
partition), and :func:`worker_for`, which picks between them. How a worker's threads
share their work is in docs/worker.md."""

from __future__ import annotations

import logging
import signal
import threading
from typing import TYPE_CHECKING, Any, overload

from .. import validate as check
from ..constants import (
    DEFAULT_CONCURRENCY,
    DEFAULT_GRACE_PERIOD,
    DEFAULT_HEARTBEAT_INTERVAL,
    DEFAULT_HEARTBEAT_TIMEOUT,
    DEFAULT_MAX_RUN_TIME,
    DEFAULT_RECONNECT_TIMEOUT,
)
from ..errors import InvalidInput
from ..names import check_name
from ..partitions import PartitionedQueue
from ..queue import Queue
from .batch import default_prefetch
from .dispatcher import Dispatcher
from .handlers import Handler, Handlers
from .heartbeat import Heartbeat
from .ledger import Ledger
from .options import check_options
from .processes import InProcess
from .reconnect import Reconnector, cut_off
from .scheduler import Scheduler
from .stats import Tally, WorkerStats
from .window import PrefetchWindow

if TYPE_CHECKING:
    from types import FrameType

    from ..consumer import Consumer
    from ..partitioned_consumer import PartitionedConsumer
    from ..protocols import AnyQueue
    from .metrics import WorkerMetrics

log = logging.getLogger("rqueue.worker")


class Worker:
    """Runs ``handler(delivery)`` for each message of ``group`` on ``queue``.

    A normal return acks; an exception nacks under the queue's redelivery
    policy (its text becomes the last error); :class:`rqueue.Reject`
    dead-letters at once. ``handler`` may be a coroutine function; it then
    runs on one event loop shared by the worker, with the same semantics.

    ``concurrency`` handler threads run; the worker holds up to
    ``prefetch`` deliveries, the ones without a free thread waiting with
    their leases kept alive. Left unset, it holds ``2 * concurrency`` at
    first, and more, up to 256, while its handlers finish faster than a
    round trip brings more (docs/worker.md, "Prefetch").

    ``handler`` may be a :class:`rqueue.BatchHandler` (or a function
    decorated with :func:`rqueue.batch_handler`): it then takes a list of up
    to its ``size`` deliveries and returns their outcomes, it holds
    ``2 * concurrency * size`` at first, and ``time_limit`` bounds
    each call (docs/worker.md, "Batch handlers").

    :meth:`run` blocks until :meth:`stop` (or SIGTERM / SIGINT when run in the
    main thread): fetching stops, deliveries not started are handed back
    (uncounted), running handlers get ``grace_period`` seconds to finish,
    the rest is returned to the group at once, and the worker leaves the
    group. A second signal stops at once.

    With ``scheduler`` (the default) the worker also publishes the due ticks
    of the prefix's recurring schedules (docs/schedules.md).

    ``time_limit`` (seconds; a message's ``x-rq-time-limit`` header
    overrides it) bounds each run of the handler: past it the message is
    nacked with the reason ``timeout``, the handler's
    :func:`rqueue.cancellation` is set (a coroutine handler is cancelled)
    and whatever it returns later is discarded; a new thread takes the
    place of the one still running it. With ``interrupt``,
    :class:`rqueue.TimeLimitExceeded` is also raised inside a plain
    handler's thread (docs/worker.md, "Time limits", says where that
    cannot reach).

    Durations are seconds. On a partitioned queue this makes a
    :class:`rqueue.PartitionedWorker` (one fetch loop over every
    partition), as :func:`rqueue.worker_for` does.
    """

    def __new__(cls, queue: Queue | PartitionedQueue, *args: Any, **kwargs: Any) -> Any:
        # Made, not initialised: Python then runs the subclass's __init__ once.
        if cls is Worker and isinstance(queue, PartitionedQueue):
            return super().__new__(PartitionedWorker)
        return super().__new__(cls)

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
        scheduler: bool = True,
        time_limit: float | None = None,
        interrupt: bool = False,
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
        #: Whether a run past its time limit is also interrupted in its thread.
        self.interrupt = check.flag("interrupt", interrupt)
        self.stats = WorkerStats()
        self.metrics = metrics
        #: Whether the worker also runs a scheduler of the prefix's recurring schedules.
        self.scheduler = check.flag("scheduler", scheduler)
        #: The worker's member of the group (of every partition), once :meth:`run` has joined it.
        self.consumer: Consumer | PartitionedConsumer | None = None
        self._clock = queue.client.clock
        self._tally = Tally(self.stats, metrics)
        self._stopping = threading.Event()
        self._hard_stop = threading.Event()
        client = queue.client
        self._retry = Reconnector(
            reconnect_timeout,
            self._tally,
            hard_stop=self._hard_stop,
            cut_off=lambda: cut_off(client),
            randomness=client.randomness,
        )
        self._stopped = threading.Event()
        self._background: threading.Thread | None = None

    def run(self, install_signal_handlers: bool = True) -> WorkerStats:
        """Works until stopped; returns the counters."""
        signals = install_signal_handlers and threading.current_thread() is threading.main_thread()
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)} if signals else {}
        for sig in previous:
            signal.signal(sig, self._on_signal)
        self._retry.watch()
        try:

            def join() -> Consumer | PartitionedConsumer:
                return self.queue.consumer(
                    self.group, self.name, prefetch=self.prefetch, liveness=self.heartbeat_timeout
                )

            if isinstance(self.handler, InProcess):
                # Its children load the handler before any lease runs: a
                # child's start never counts against a message's limit.
                self.handler.start(self.concurrency)
            consumer = self._retry(join)
            self.consumer = consumer
            notifier = self.queue.client.notifier
            ledger = Ledger()
            handlers = Handlers(
                self.handler,
                self.concurrency,
                consumer=consumer,
                ledger=ledger,
                tally=self._tally,
                retry=self._retry,
                clock=self._clock,
                notifier=notifier,
                stopping=self._stopping,
                ack_wait=self._ack_wait,
                heartbeat_timeout=self.heartbeat_timeout,
                time_limit=self.time_limit,
                interrupt=self.interrupt,
            )
            heartbeat = Heartbeat(
                consumer=consumer,
                queue_name=self.queue.name,
                ledger=ledger,
                tally=self._tally,
                retry=self._retry,
                clock=self._clock,
                ack_wait=self._ack_wait,
                interval=self.heartbeat_interval,
                timeout=self.heartbeat_timeout,
                max_run_time=self.max_run_time,
            )
            dispatcher = Dispatcher(
                consumer=consumer,
                ledger=ledger,
                handlers=handlers,
                tally=self._tally,
                retry=self._retry,
                clock=self._clock,
                notifier=notifier,
                channels=self._channels,
                stopping=self._stopping,
                window=self._window,
                heartbeat_timeout=self.heartbeat_timeout,
            )
            handlers.start()
            heartbeat.start()
            log.info(
                "worker %s joined %s/%s with %d handler threads",
                consumer.name,
                self.queue.name,
                self.group,
                self.concurrency,
            )
            schedules = Scheduler(self.queue.client).start() if self.scheduler else None
            try:
                dispatcher.run()
            finally:
                if schedules is not None:
                    schedules.stop(0.0 if self._hard_stop.is_set() else 0.5)
                self._shutdown(consumer, ledger, dispatcher, handlers, heartbeat)
        finally:
            self._retry.unwatch()
            # The handlers it replaced, as the asyncio worker does: a Ctrl-C
            # after the worker returned interrupts the program again.
            for sig, handler in previous.items():
                if handler is not None:  # None: set outside Python, not restorable
                    signal.signal(sig, handler)
            self._stopped.set()
        return self.stats

    def _channels(self) -> list[str]:
        """The wake-up channels the dispatcher sleeps on: the queue's, or
        every partition's."""
        queue = self.queue
        if isinstance(queue, PartitionedQueue):
            return [part.keys.wake_channel for part in queue.parts]
        return [queue.keys.wake_channel]

    def start(self) -> None:
        """Runs the worker in a background thread (no signal handlers)."""
        self._background = threading.Thread(
            target=self.run, kwargs={"install_signal_handlers": False}, name="rqueue-worker"
        )
        self._background.start()

    def stop(self, now: bool = False) -> None:
        """Stops fetching; running handlers get the grace period. With
        ``now``, there is no grace period, nothing is retried, and a Redis
        call that is not answered within half a second is cut off: the worker
        ends within about a second also while Redis is unreachable."""
        self._request_stop(now)
        self._end_a_wait_in_redis()

    def _end_a_wait_in_redis(self) -> None:
        """The dispatcher may be waiting in Redis for the queue's wake-up
        (up to IDLE_POLL_INTERVAL): an entry ends the wait. From a thread
        of its own, so that a stop never waits for Redis (nor, from a signal
        handler, for a lock the interrupted thread holds)."""
        consumer = self.consumer
        if consumer is not None and consumer.waits_on_wakes():
            try:
                threading.Thread(target=self._wake_dispatcher, name="rqueue-stop-wake", daemon=True).start()
            except Exception as exc:  # no thread to be had (the interpreter ending, say): a hint only
                log.debug("could not start the thread that wakes the dispatcher (%s); it stops when its wait ends", exc)

    def _request_stop(self, now: bool) -> None:
        """What a stop does without Redis (a signal handler makes no Redis
        call: it could wait on a lock the interrupted thread holds)."""
        if now:
            self._hard_stop.set()
        self._stopping.set()
        if self.consumer is not None:
            self.queue.client.notifier.poke()

    def _wake_dispatcher(self) -> None:
        assert self.consumer is not None
        try:
            self.consumer.end_waits()
        except Exception as exc:  # a hint only: the wait ends by itself
            log.debug("could not wake the dispatcher (%s); it stops when its wait ends", exc)

    def join(self, timeout: float | None = None) -> bool:
        """Waits for a worker started with :meth:`start` to end; True if it did."""
        return self._stopped.wait(timeout)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self._stopping.is_set():
            log.warning("second %s: stopping at once", signal.Signals(signum).name)
            self._request_stop(now=True)
        else:
            log.info("%s: finishing running handlers, then leaving", signal.Signals(signum).name)
            self._request_stop(now=False)
        self._end_a_wait_in_redis()

    def _ack_wait(self) -> float:
        """The lease a fetch gives, from the settings the consumer last
        read: no Redis call."""
        assert self.consumer is not None
        return self.consumer.last_settings.ack_wait

    def _shutdown(
        self,
        consumer: Consumer | PartitionedConsumer,
        ledger: Ledger,
        dispatcher: Dispatcher,
        handlers: Handlers,
        heartbeat: Heartbeat,
    ) -> None:
        """Hands back what has not started, gives running handlers the grace
        period, settles what finished, and leaves the group."""
        # Stopping from here on, whatever ended the dispatcher (a stop, or an
        # error it does not retry): what it hands back is then met by the
        # handler threads as returned, not as lost while waiting
        # (stale_skipped), as the asyncio worker does.
        self._stopping.set()
        grace = 0.0 if self._hard_stop.is_set() else self.grace_period
        clock = self._clock
        deadline = clock.monotonic() + grace
        notifier = self.queue.client.notifier
        try:
            try:
                if not self._hard_stop.is_set():  # else the leave follows at once, and returns them too
                    dispatcher.hand_back_waiting()
                while ledger.unsettled() and clock.monotonic() < deadline and not self._hard_stop.is_set():
                    dispatcher.settle()
                    if ledger.unsettled():
                        notifier.wait(
                            "", 0, min(0.05, max(0.0, deadline - clock.monotonic())), until=ledger.has_results
                        )
                dispatcher.settle()
            finally:
                # Stopped before leaving: a heartbeat after the leave would
                # find the worker gone and join again.
                heartbeat.stop()
            returned = self._retry(consumer.close)
            log.info(
                "worker %s left %s/%s; %d deliveries returned", consumer.name, self.queue.name, self.group, returned
            )
        finally:
            handlers.stop()
            if isinstance(self.handler, InProcess):
                self.handler.close()


class PartitionedWorker(Worker):
    """The worker of a partitioned queue: one member of the group in every
    partition under one consumer name, one dispatcher whose fetch loop goes
    over the partitions in turn (each round trip starts at the next
    partition, so none starves), and ``concurrency`` handler threads
    shared by all of them, however many partitions there are.
    ``rqueue.Worker(partitioned_queue, ...)`` makes one; it takes the same
    arguments and is run and stopped the same way. Its window (``prefetch``,
    or one left to it, as :class:`Worker`'s) bounds what the worker holds
    over all partitions; each partition's member may hold up to as many."""

    queue: PartitionedQueue

    @property
    def partitions(self) -> int:
        """How many partitions the worker serves."""
        return self.queue.partitions


@overload
def worker_for(queue: PartitionedQueue, group: str, handler: Handler, **options: Any) -> PartitionedWorker: ...
@overload
def worker_for(queue: Queue, group: str, handler: Handler, **options: Any) -> Worker: ...
@overload
def worker_for(queue: AnyQueue, group: str, handler: Handler, **options: Any) -> Worker | PartitionedWorker: ...
def worker_for(queue: AnyQueue, group: str, handler: Handler, **options: Any) -> Worker | PartitionedWorker:
    """A :class:`Worker` for a queue, a :class:`PartitionedWorker` for a
    partitioned queue; ``options`` are the keyword arguments of
    :class:`Worker`."""
    if isinstance(queue, PartitionedQueue):
        return PartitionedWorker(queue, group, handler, **options)
    if isinstance(queue, Queue):
        return Worker(queue, group, handler, **options)
    raise InvalidInput(f"a worker needs a Queue or a PartitionedQueue, not {queue!r}")

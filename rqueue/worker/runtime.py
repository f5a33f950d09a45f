"""The worker runtime: runs a handler for every message of a group.

One dispatcher thread keeps up to ``prefetch`` deliveries in hand (by
default twice the handler threads: those without a free thread wait
locally, so that one round trip serves more messages), settles finished
work in the same round trip as the next fetch, and sleeps on the queue's
wake-up channel when idle. N handler threads run the handler. A heartbeat
thread keeps the leases of waiting deliveries and of running handlers alive
(each up to ``max_run_time``), proves the worker is alive, and removes
members of the group whose heartbeat lapsed so that their messages are
offered again within ``heartbeat_timeout``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import queue as queue_module
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import redis
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential_jitter

from .. import constants as C
from ..connection.cluster import CLUSTER_NOT_RUN
from ..errors import AlreadyAcked, DeliveryError, InvalidInput, NotMember, Reject, RQueueError
from ..names import check_name
from ..settings import positive_seconds

if TYPE_CHECKING:
    from ..consumer import Consumer, Delivery
    from ..queue import Queue
    from .metrics import WorkerMetrics

log = logging.getLogger("rqueue.worker")

T = TypeVar("T")
Handler = Callable[["Delivery"], Any]

# Errors after which the same call may succeed once Redis is back.
# On a cluster also the errors of a failover (and of a slot map that cannot
# be read meanwhile): the worker's calls are safe to send again, since it
# hands back what a lost fetch claimed and an applied ack is recognised.
# A server over maxmemory refuses a call before it writes anything: the
# worker waits for memory to be freed rather than dying.
TRANSIENT = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.BusyLoadingError,
    ConnectionError,
    OSError,
    *CLUSTER_NOT_RUN,
    redis.exceptions.RedisClusterException,
    redis.exceptions.OutOfMemoryError,
)


@dataclass
class WorkerStats:
    """Counters of one worker since it started."""

    fetched: int = 0  # deliveries received
    handled: int = 0  # handler invocations
    acked: int = 0  # acks confirmed by Redis
    nacked: int = 0  # handler raised: offered again under the redelivery policy
    rejected: int = 0  # handler raised rqueue.Reject: dead-lettered at once
    dead_lettered: int = 0  # messages this worker dead-lettered: Reject, or a nack past max_deliveries
    redelivered: int = 0  # deliveries with a delivery count above 1
    stale_skipped: int = 0  # deliveries no longer held when their turn came: not run
    late_settles: int = 0  # acks/nacks whose delivery had moved on (reported, not raised)
    leases_lost: int = 0  # running or waiting deliveries whose lease could not be extended
    members_removed: int = 0  # silent members of the group this worker removed
    reconnects: int = 0  # Redis calls retried after a connection error

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class Worker:
    """Runs ``handler(delivery)`` for each message of ``group`` on ``queue``.

    A normal return acks; an exception nacks under the queue's redelivery
    policy (its text becomes the last error); :class:`rqueue.Reject`
    dead-letters at once. ``handler`` may be a coroutine function; it then
    runs on one event loop shared by the worker, with the same semantics.

    ``concurrency`` handler threads run; the worker holds up to
    ``prefetch`` deliveries (default ``2 * concurrency``), the ones without
    a free thread waiting with their leases kept alive.

    :meth:`run` blocks until :meth:`stop` (or SIGTERM / SIGINT when run in the
    main thread): fetching stops, deliveries not started are handed back
    (uncounted), running handlers get ``grace_period`` seconds to finish,
    the rest is returned to the group at once, and the worker leaves the
    group. A second signal stops at once.

    Durations are seconds. On a partitioned queue this makes a
    :class:`rqueue.PartitionedWorker` (one worker per partition).
    """

    def __new__(cls, queue: Any, *args: Any, **kwargs: Any) -> Any:
        from ..partitions import PartitionedQueue
        from .partitioned import PartitionedWorker

        if cls is Worker and isinstance(queue, PartitionedQueue):
            return PartitionedWorker(queue, *args, **kwargs)
        return super().__new__(cls)

    def __init__(
        self,
        queue: Queue,
        group: str,
        handler: Handler,
        *,
        concurrency: int = C.DEFAULT_CONCURRENCY,
        name: str | None = None,
        prefetch: int | None = None,
        heartbeat_interval: float = C.DEFAULT_HEARTBEAT_INTERVAL,
        heartbeat_timeout: float = C.DEFAULT_HEARTBEAT_TIMEOUT,
        max_run_time: float = C.DEFAULT_MAX_RUN_TIME,
        grace_period: float = C.DEFAULT_GRACE_PERIOD,
        reconnect_timeout: float = C.DEFAULT_RECONNECT_TIMEOUT,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        if not callable(handler):
            raise InvalidInput(f"handler {handler!r} is not callable")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise InvalidInput(f"concurrency must be a whole number >= 1, not {concurrency!r}")
        for what, value in (
            ("heartbeat_interval", heartbeat_interval),
            ("heartbeat_timeout", heartbeat_timeout),
            ("max_run_time", max_run_time),
            ("reconnect_timeout", reconnect_timeout),
        ):
            positive_seconds(what, value)
        if heartbeat_timeout <= heartbeat_interval:
            raise InvalidInput(
                f"heartbeat_timeout ({heartbeat_timeout}) must be longer than heartbeat_interval ({heartbeat_interval})"
            )
        if prefetch is not None and (isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1):
            raise InvalidInput(f"prefetch must be a whole number >= 1, not {prefetch!r}")
        if isinstance(grace_period, bool) or not isinstance(grace_period, (int, float)) or grace_period < 0:
            raise InvalidInput(f"grace_period must be a number of seconds >= 0, not {grace_period!r}")
        self.queue = queue
        self.group = check_name("group", group)
        if name is not None:
            check_name("consumer", name)
        self.handler = handler
        self.concurrency = concurrency
        self.name = name
        self.prefetch = prefetch if prefetch is not None else concurrency * C.WORKER_PREFETCH_PER_THREAD
        self.heartbeat_interval = heartbeat_interval
        self.heartbeat_timeout = heartbeat_timeout
        self.max_run_time = max_run_time
        self.grace_period = grace_period
        self.reconnect_timeout = reconnect_timeout
        self.stats = WorkerStats()
        self.metrics = metrics
        self.consumer: Consumer | None = None
        self._clock = queue.client.clock
        self._stats_lock = threading.Lock()
        self._stopping = threading.Event()
        self._hard_stop = threading.Event()
        self._stopped = threading.Event()
        self._heartbeat_stop = threading.Event()
        self._heartbeat_thread: threading.Thread | None = None
        self._tasks: queue_module.SimpleQueue[Delivery | None] = queue_module.SimpleQueue()
        self._results: deque[tuple[Delivery, str, str]] = deque()
        self._running: dict[str, tuple[Delivery, float]] = {}
        # Fetched, no handler thread yet, with when they were fetched (monotonic
        # seconds). Under _running_lock; a handler thread runs a delivery only
        # if it takes it from here, so a stop or a lost lease can withdraw it.
        self._waiting: dict[str, tuple[Delivery, float]] = {}
        self._running_lock = threading.Lock()
        self._known: dict[str, Delivery] = {}  # fetched and not yet settled locally
        self._resync = False  # a fetch may have been applied without its reply
        self._threads: list[threading.Thread] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._background: threading.Thread | None = None

    # -- control --------------------------------------------------------------

    def run(self, install_signal_handlers: bool = True) -> WorkerStats:
        """Works until stopped; returns the counters."""
        if install_signal_handlers and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self._on_signal)
        try:
            self.consumer = self._retry(
                lambda: self.queue.consumer(
                    self.group, self.name, prefetch=self.prefetch, liveness=self.heartbeat_timeout
                )
            )
            self._start_threads()
            log.info(
                "worker %s joined %s/%s with %d handler threads",
                self.consumer.name,
                self.queue.name,
                self.group,
                self.concurrency,
            )
            try:
                self._dispatch()
            finally:
                self._shutdown()
        finally:
            self._stopped.set()
        return self.stats

    def start(self) -> None:
        """Runs the worker in a background thread (no signal handlers)."""
        self._background = threading.Thread(
            target=self.run, kwargs={"install_signal_handlers": False}, name="rqueue-worker"
        )
        self._background.start()

    def stop(self, now: bool = False) -> None:
        """Stops fetching; running handlers get the grace period (none with ``now``)."""
        if now:
            self._hard_stop.set()
        self._stopping.set()
        if self.consumer is not None:
            self.queue.client.notifier.poke()

    def join(self, timeout: float | None = None) -> bool:
        """Waits for a worker started with :meth:`start` to end; True if it did."""
        return self._stopped.wait(timeout)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self._stopping.is_set():
            log.warning("second %s: stopping at once", signal.Signals(signum).name)
            self.stop(now=True)
        else:
            log.info("%s: finishing running handlers, then leaving", signal.Signals(signum).name)
            self.stop()

    def _count(self, **deltas: int) -> None:
        with self._stats_lock:
            for key, delta in deltas.items():
                setattr(self.stats, key, getattr(self.stats, key) + delta)
        if self.metrics is not None:
            self.metrics.count(deltas)

    # -- Redis calls ------------------------------------------------------------

    def _retry(self, call: Callable[[], T]) -> T:
        # The first attempt goes straight through: building a tenacity
        # Retrying per call cost more CPU than the Redis call itself.
        started = time.monotonic()
        try:
            return call()
        except TRANSIENT as exc:
            first: BaseException | None = exc

        def attempt() -> T:
            # tenacity sees the failed first attempt, so its waits, counts
            # and log lines are what they were without the fast path.
            nonlocal first
            if first is not None:
                failed, first = first, None
                raise failed
            return call()

        def before_sleep(state: Any) -> None:
            self._count(reconnects=1)
            self._resync = True
            log.warning("Redis call failed (%s); retrying", state.outcome.exception())

        retrying = Retrying(
            retry=retry_if_exception_type(TRANSIENT),
            wait=wait_exponential_jitter(multiplier=0.05, max=2.0, jitter=0.05),
            # the limit still counts from the first attempt
            stop=stop_after_delay(max(0.0, self.reconnect_timeout - (time.monotonic() - started))),
            before_sleep=before_sleep,
            reraise=True,
        )
        return retrying(attempt)

    # -- dispatcher -----------------------------------------------------------

    def _dispatch(self) -> None:
        assert self.consumer is not None
        consumer = self.consumer
        notifier = self.queue.client.notifier
        channel = self.queue.keys.wake_channel
        while not self._stopping.is_set():
            generation = notifier.generation(channel)
            acks, others = self._drain_results()
            self._settle_others(others)
            free = self.prefetch - len(self._known)
            if free <= 0 and not acks:
                notifier.wait(channel, generation, C.IDLE_POLL_INTERVAL, until=self._has_news)
                continue
            statuses, deliveries, due_in = self._retry(lambda: consumer.ack_and_fetch(acks, max(free, 0)))
            self._record_acks(statuses)
            for d in deliveries:
                self._known[d.tag] = d
            if self._resync:
                self._hand_back_unknown()
            if deliveries:
                self._count(fetched=len(deliveries), redelivered=sum(1 for d in deliveries if d.redelivered))
                now = self._clock.monotonic()
                with self._running_lock:
                    for d in deliveries:
                        self._waiting[d.tag] = (d, now)
                for d in deliveries:
                    self._tasks.put(d)
                continue
            if acks or others:
                continue
            wait = C.IDLE_POLL_INTERVAL if due_in is None else min(C.IDLE_POLL_INTERVAL, due_in)
            notifier.wait(channel, generation, wait, until=self._has_news)

    def _hand_back_unknown(self) -> None:
        """After a failed call was retried, a fetch may have leased messages
        whose reply never arrived: hand back whatever this worker holds in
        Redis but does not know about. Runs on the dispatcher thread, the
        only one that fetches, so the list of known deliveries is complete."""
        assert self.consumer is not None
        consumer = self.consumer
        known = list(self._known.values())
        result = self._retry(lambda: consumer.heartbeat(known, self.heartbeat_timeout, sync=True))
        self._resync = False
        if result.handed_back:
            log.warning("handed back %d deliveries whose fetch reply was lost", result.handed_back)

    def _hand_back_waiting(self) -> None:
        """On a stop, deliveries still waiting for a handler thread go back
        to the group at once (not after the grace period), without counting
        as an attempt: a sync heartbeat listing every other delivery."""
        assert self.consumer is not None
        with self._running_lock:
            # Handler threads that pick up their tasks later find them gone.
            waiting = [d for d, _ in self._waiting.values()]
            self._waiting.clear()
        if not waiting:
            return
        for d in waiting:
            self._known.pop(d.tag, None)
        keep = list(self._known.values())  # running, or finished and not yet settled
        try:
            # One attempt: when Redis is away the leave, retried, returns them
            # all the same, and retrying here would spend the grace period.
            result = self.consumer.heartbeat(keep, self.heartbeat_timeout, sync=True)
        except Exception as exc:
            log.warning(
                "could not hand back %d waiting deliveries (%s: %s); the leave returns them",
                len(waiting),
                type(exc).__name__,
                exc,
            )
            return
        log.info("handed back %d deliveries that had not started", result.handed_back)

    def _has_news(self) -> bool:
        return bool(self._results) or self._stopping.is_set()

    def _drain_results(self) -> tuple[list[Delivery], list[tuple[Delivery, str, str]]]:
        acks: list[Delivery] = []
        others: list[tuple[Delivery, str, str]] = []
        while self._results:
            d, outcome, text = self._results.popleft()
            self._known.pop(d.tag, None)
            if outcome == "ack":
                acks.append(d)
            elif outcome in ("nack", "reject"):
                others.append((d, outcome, text))
        return acks, others

    def _record_acks(self, statuses: list[RQueueError | None]) -> None:
        # After a retry, AlreadyAcked usually means the first attempt was
        # applied and only its reply was lost.
        ok = sum(1 for s in statuses if s is None or (self._resync and isinstance(s, AlreadyAcked)))
        for err in statuses:
            if err is not None and not isinstance(err, AlreadyAcked):
                log.info("ack not applied: %s", err)
        self._count(acked=ok, late_settles=len(statuses) - ok)

    def _settle_others(self, others: list[tuple[Delivery, str, str]]) -> None:
        assert self.consumer is not None
        consumer = self.consumer
        for d, outcome, text in others:
            try:
                if outcome == "nack":
                    status = self._retry(lambda: consumer.nack(d, error=text))
                    self._count(nacked=1, dead_lettered=1 if status == "dead" else 0)
                else:
                    self._retry(lambda: consumer.reject(d, reason=text))
                    self._count(rejected=1, dead_lettered=1)
            except DeliveryError as exc:
                # The delivery moved on (lease ran out, member removed): the
                # message is already offered again; nothing to undo.
                log.info("%s of %s not applied: %s", outcome, d.tag, exc)
                self._count(late_settles=1)

    # -- handler threads ----------------------------------------------------------

    def _start_threads(self) -> None:
        if inspect.iscoroutinefunction(self.handler):
            self._loop = asyncio.new_event_loop()
            loop_thread = threading.Thread(target=self._loop.run_forever, name="rqueue-async", daemon=True)
            loop_thread.start()
        for i in range(self.concurrency):
            t = threading.Thread(target=self._handle_loop, name=f"rqueue-handler-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        self._heartbeat_thread = threading.Thread(target=self._heartbeat_loop, name="rqueue-heartbeat", daemon=True)
        self._heartbeat_thread.start()

    def _call_handler(self, d: Delivery) -> None:
        if self._loop is not None:
            asyncio.run_coroutine_threadsafe(self.handler(d), self._loop).result()
        else:
            self.handler(d)

    def _handle_loop(self) -> None:
        notifier = self.queue.client.notifier
        while True:
            d = self._tasks.get()
            if d is None:
                return
            try:
                outcome, text = self._handle(d)
            except BaseException as exc:  # never lose the slot or the result
                log.error("could not run the handler on %s: %s: %s", d.tag, type(exc).__name__, exc)
                with self._running_lock:  # no longer kept alive: its lease runs out and it is offered again
                    self._running.pop(d.tag, None)
                outcome, text = "skipped", ""
            self._results.append((d, outcome, text))
            notifier.poke()

    def _still_held(self, d: Delivery) -> bool:
        """False when a delivery that waited for a handler thread has moved
        on meanwhile (SPEC guarantee 3: never run a message the group already
        acked); extends its lease otherwise."""
        assert self.consumer is not None
        try:
            self._retry(lambda: self.consumer.in_progress(d))  # type: ignore[union-attr]
            return True
        except DeliveryError:
            return False

    def _handle(self, d: Delivery) -> tuple[str, str]:
        with self._running_lock:
            stopping = self._stopping.is_set()
            waited = None if stopping else self._waiting.pop(d.tag, None)
        if waited is None:
            if stopping:
                # Not started before the stop: the graceful leave hands it
                # back at once rather than running it in the grace period.
                return "return", ""
            # Its lease was lost while it waited (the heartbeat withdrew it).
            self._count(stale_skipped=1)
            return "skipped", ""
        fetched_at = waited[1]
        # One clock reading and no generic counter call per message: with a
        # quick handler this bookkeeping is most of a handler thread's work.
        started = self._clock.monotonic()
        safe = min(self._ack_wait, self.heartbeat_timeout) * C.STALE_DISPATCH_FRACTION
        if started - fetched_at >= safe:  # it waited long: check with Redis, then read the clock again
            if not self._still_held(d):
                self._count(stale_skipped=1)
                return "skipped", ""
            started = self._clock.monotonic()  # the check's time is not the handler's (max_run_time)
        with self._running_lock:
            self._running[d.tag] = (d, started)
        with self._stats_lock:
            self.stats.handled += 1
        if self.metrics is not None:
            self.metrics.count({"handled": 1})
        try:
            self._call_handler(d)
            return "ack", ""
        except Reject as exc:
            return "reject", exc.reason
        except Exception as exc:
            log.warning("handler failed on %s (delivery %d): %s: %s", d.tag, d.delivery_count, type(exc).__name__, exc)
            return "nack", f"{type(exc).__name__}: {exc}"
        finally:
            with self._running_lock:
                self._running.pop(d.tag, None)
            if self.metrics is not None:
                self.metrics.handler_seconds.observe(self._clock.monotonic() - started)

    # -- heartbeat ----------------------------------------------------------------

    @property
    def _ack_wait(self) -> float:
        assert self.consumer is not None
        return self.consumer._settings.ack_wait  # refreshed by every fetch; no Redis call here

    def _heartbeat_loop(self) -> None:
        assert self.consumer is not None
        # A lease shorter than the heartbeat interval must still be extended in time.
        while not self._heartbeat_stop.wait(min(self.heartbeat_interval, self._ack_wait / 3)):
            now = self._clock.monotonic()
            with self._running_lock:
                # Each is kept alive for max_run_time, waiting ones from their
                # fetch: nothing stays held behind handlers that hang.
                running = [d for d, started in self._running.values() if now - started < self.max_run_time]
                waiting = [d for d, fetched in self._waiting.values() if now - fetched < self.max_run_time]
            try:
                statuses, removed, returned, dead, _ = self.consumer.heartbeat(
                    running + waiting, self.heartbeat_timeout
                )
            except NotMember:
                # This worker was silent too long and was removed: what it
                # held was offered again; running handlers' acks become late,
                # and waiting deliveries are not run (SPEC guarantee 3).
                log.warning("worker %s had been removed from its group; joining again", self.consumer.name)
                with self._running_lock:
                    self._waiting.clear()
                self.consumer.rejoin()
                continue
            except TRANSIENT as exc:
                log.debug("heartbeat failed (%s); the dispatcher handles reconnecting", exc)
                continue
            except Exception:  # never let the heartbeat thread die silently
                log.exception("heartbeat failed")
                continue
            lost = sum(1 for s in statuses if s is not None)
            gone = [d.tag for d, s in zip(waiting, statuses[len(running) :]) if s is not None]
            if gone:
                # SPEC guarantee 3: a message whose lease was lost (maybe
                # acked by now) is not run from this worker.
                with self._running_lock:
                    for tag in gone:
                        self._waiting.pop(tag, None)
            self._count(leases_lost=lost, members_removed=removed)
            if removed:
                log.warning(
                    "removed %d silent member(s) of %s/%s: %d deliveries offered again, %d dead-lettered",
                    removed,
                    self.queue.name,
                    self.group,
                    returned,
                    dead,
                )

    # -- shutdown -------------------------------------------------------------------

    def _shutdown(self) -> None:
        consumer = self.consumer
        assert consumer is not None
        grace = 0.0 if self._hard_stop.is_set() else self.grace_period
        deadline = self._clock.monotonic() + grace
        notifier = self.queue.client.notifier
        try:
            self._hand_back_waiting()
            while self._known and self._clock.monotonic() < deadline and not self._hard_stop.is_set():
                acks, others = self._drain_results()
                if acks:
                    self._record_acks(self._retry(lambda: consumer.ack_available(acks)))
                self._settle_others(others)
                if self._known:
                    notifier.wait(
                        "",
                        0,
                        min(0.05, max(0.0, deadline - self._clock.monotonic())),
                        until=lambda: bool(self._results),
                    )
            acks, others = self._drain_results()
            if acks:
                self._record_acks(self._retry(lambda: consumer.ack_available(acks)))
            self._settle_others(others)
            # Stopped before leaving: a heartbeat after the leave would find
            # the worker gone and join again.
            self._heartbeat_stop.set()
            if self._heartbeat_thread is not None:
                self._heartbeat_thread.join(10)
            returned = self._retry(consumer.close)
            log.info(
                "worker %s left %s/%s; %d deliveries returned", consumer.name, self.queue.name, self.group, returned
            )
        finally:
            for _ in self._threads:
                self._tasks.put(None)
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._loop.stop)

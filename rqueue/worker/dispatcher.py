"""The dispatcher of a worker: fetches deliveries for the handler threads
and settles their outcomes, both in one round trip where it can."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..constants import IDLE_POLL_INTERVAL, STALE_DISPATCH_FRACTION
from ..errors import DeliveryError, OutOfMemory, RQueueError
from ..tracing import dead_lettered
from .handlers import Handlers
from .ledger import Ledger
from .outcome import Completion, Detail, Outcome, acks_done, nacks_done, reject_done, settles
from .reconnect import Reconnector
from .stats import Tally
from .window import PrefetchWindow

if TYPE_CHECKING:
    from ..clock import Clock
    from ..consumer import Consumer
    from ..delivery import Delivery
    from ..engine.notify import Notifier
    from ..partitioned_consumer import PartitionedConsumer

log = logging.getLogger("rqueue.worker")


def redis_wait(wait: float, reconnect_timeout: float, ack_wait: float, heartbeat_timeout: float) -> float:
    """How long an idle worker's fetch waits in Redis for the queue's
    wake-up: ``wait`` at most, and half of two limits, as its deliveries'
    leases are judged from before the wait. After the reconnect timeout the
    watchdog would take the wait for a server that does not answer; past
    the stale age (STALE_DISPATCH_FRACTION) each delivery it brings would be
    checked with Redis again before it runs."""
    stale_age = STALE_DISPATCH_FRACTION * min(ack_wait, heartbeat_timeout)
    return min(wait, reconnect_timeout / 2, stale_age / 2)


class Dispatcher:
    """Keeps up to its window's size of deliveries in hand (window.py):
    those without a free handler thread wait locally, so that one round
    trip serves more messages. Settles finished work in the same round trip as the next
    fetch. When idle with nothing running, with the setting wait_in_redis,
    its next fetch waits in Redis for the queue's wake-up
    (Consumer.ack_and_fetch with a wait); else, and on a cluster or a
    partitioned queue, it sleeps on the queue's wake-up channels (one per
    partition, whose consumer fetches from the partitions in turn, each call
    starting at the next). Runs on the thread that runs the worker; it alone
    fetches and settles."""

    def __init__(
        self,
        *,
        consumer: Consumer | PartitionedConsumer,
        ledger: Ledger,
        handlers: Handlers,
        tally: Tally,
        retry: Reconnector,
        clock: Clock,
        notifier: Notifier,
        channels: Callable[[], list[str]],
        stopping: threading.Event,
        window: PrefetchWindow,
        heartbeat_timeout: float,
    ) -> None:
        self._consumer = consumer
        self._ledger = ledger
        self._handlers = handlers
        self._tally = tally
        self._retry = retry
        self._clock = clock
        self._notifier = notifier
        self._channels = channels
        self._stopping = stopping
        self._window = window
        self._heartbeat_timeout = heartbeat_timeout

    def run(self) -> None:
        """Fetches and settles until the worker is stopping."""
        consumer = self._consumer
        ledger = self._ledger
        notifier = self._notifier
        channels = self._channels
        idle_wait: float | None = None  # set: the next fetch waits for the queue's wake-up first
        while not self._stopping.is_set():
            # read per round: a grown partitioned queue adds channels
            generations = {} if idle_wait is not None else {ch: notifier.generation(ch) for ch in channels()}
            acks, others = ledger.drain()
            self._settle_others(others)
            free = self._window.size - ledger.unsettled()
            if free <= 0 and not acks:
                notifier.wait_any(generations, IDLE_POLL_INTERVAL, until=self._has_news)
                continue
            # The lease of what this fetch brings begins after it is sent: a
            # delivery is judged by this time, not by when the reply was
            # read (the worker may have been paused in between).
            sent = self._clock.monotonic()
            joins, epoch = consumer.join_marks(), consumer.state_epoch
            # Nothing runs, so nothing but a stop (which adds a wake-up
            # entry) can bring news while Redis holds the wait.
            idle = not acks and not others and ledger.unsettled() == 0
            wait_first = idle_wait if idle else None
            idle_wait = None
            statuses, deliveries, due_in = self._retry(consumer.ack_and_fetch, acks, max(free, 0), wait_first, idle)
            self._window.fetched(max(free, 0), len(deliveries), ledger.waiting(), ledger.running())
            lost = consumer.state_epoch != epoch
            if lost:
                self._state_lost()
            elif (taken := consumer.rejoined_since(joins)) is not None:
                self._removed(taken)
            self._record_acks(statuses)
            ledger.fetched(deliveries)
            handed_back = 0
            if self._retry.resync or lost:
                # After a loss the consumer drops what a fetch sent before it
                # brought (it may be from before the loss); those messages
                # are held in Redis all the same and go back now rather than
                # when their leases run out.
                handed_back = self._hand_back_unknown()
            if deliveries:
                self._tally.count(fetched=len(deliveries), redelivered=sum(1 for d in deliveries if d.redelivered))
                ledger.wait(deliveries, sent)
                self._handlers.submit_all(deliveries)
                continue
            if acks or others or handed_back:
                # (what went back is ready now: its publish may have been
                # announced before this round read the channels)
                continue
            wait = IDLE_POLL_INTERVAL if due_in is None else min(IDLE_POLL_INTERVAL, due_in)
            if consumer.waits_on_wakes() and ledger.unsettled() == 0 and not self._has_news():
                # The next round's fetch waits in Redis (see redis_wait).
                idle_wait = redis_wait(
                    wait, self._retry.timeout, consumer.last_settings.ack_wait, self._heartbeat_timeout
                )
                continue
            if not generations:
                # This round's fetch followed a wait in Redis, not a read of
                # the channels: they are read, and fetched after, first.
                continue
            notifier.wait_any(generations, wait, until=self._has_news)

    def settle(self) -> None:
        """Settles every finished delivery (acks without a fetch)."""
        acks, others = self._ledger.drain()
        if acks:
            self._record_acks(self._retry(self._consumer.ack_available, acks))
        self._settle_others(others)

    def hand_back_waiting(self) -> None:
        """On a stop, deliveries still waiting for a handler thread go back
        to the group at once (not after the grace period), without counting
        as an attempt: a sync heartbeat listing every other delivery."""
        waiting = self._ledger.withdraw_waiting()
        if not waiting:
            return
        keep = self._ledger.known()  # running, or finished and not yet settled
        try:
            # One attempt: when Redis is away the leave, retried, returns them
            # all the same, and retrying here would spend the grace period.
            result = self._retry.once(self._consumer.heartbeat, keep, self._heartbeat_timeout, sync=True)
        except Exception as exc:
            log.warning(
                "could not hand back %d waiting deliveries (%s: %s); the leave returns them",
                len(waiting),
                type(exc).__name__,
                exc,
            )
            return
        log.info("handed back %d deliveries that had not started", result.handed_back)

    def _hand_back_unknown(self) -> int:
        """After a failed call was retried, a fetch may have leased messages
        whose reply never arrived (or, after a loss of Redis state, whose
        reply the consumer dropped): hands back whatever this worker holds in
        Redis but does not know about, and returns how many. The known list
        is complete here, as this is the only thread that fetches."""
        known = self._ledger.known()
        result = self._retry(self._consumer.heartbeat, known, self._heartbeat_timeout, sync=True)
        self._retry.resync = False
        if result.handed_back:
            log.warning("handed back %d deliveries whose fetch reply was lost or dropped", result.handed_back)
        return result.handed_back

    def _removed(self, taken: Callable[[Delivery], bool]) -> None:
        """The fetch found this worker removed from its group (silent too
        long, e.g. paused) and joined it again: what it held was offered
        again, so the deliveries ``taken`` judges taken back wait no more and
        never run (the group may ack them meanwhile: docs/guarantees.md,
        guarantee 3), as the heartbeat does when it finds the worker removed."""
        dropped = self._ledger.forget_waiting(taken=taken)
        log.warning(
            "worker %s had been removed from its group and joined again; %d waiting deliveries dropped, not run",
            self._consumer.name,
            dropped,
        )

    def _state_lost(self) -> None:
        """The consumer saw Redis lose the queue's state (and logged it):
        the deliveries waiting for a thread are from before the loss, and
        are dropped, never run; running ones finish, but their outcomes are
        not sent (LostDelivery), so none settles a new message."""
        dropped = self._ledger.forget_waiting(epoch_for=self._consumer.epoch_for)
        # The consumer logged the loss at ERROR; this says what the worker did.
        log.warning(
            "worker %s: Redis lost the queue's state; %d waiting deliveries dropped, not run",
            self._consumer.name,
            dropped,
        )

    def _has_news(self) -> bool:
        return self._ledger.has_results() or self._stopping.is_set()

    def _record_acks(self, statuses: list[RQueueError | None]) -> None:
        acks_done(statuses, self._retry.resync, self._tally)

    def _settle_others(self, others: list[tuple[Delivery, Outcome, Detail]]) -> None:
        consumer = self._consumer
        todo = settles(others)
        self._ack_keeping(todo.keeping)
        for d, reason in todo.rejected:
            sent = 0

            def reject(d: Delivery = d, reason: str = reason) -> None:
                nonlocal sent
                sent += 1
                consumer.reject(d, reason=reason)

            refused: DeliveryError | None = None
            try:
                self._retry(reject)
            except DeliveryError as exc:
                refused = exc
            if reject_done(d, reason, refused, sent > 1, self._tally):
                dead_lettered(consumer.queue.name, consumer.group, d, "rejected")
                self._keep_failure(d, "rejected", reason)
        for (error, timed_out), deliveries in todo.failed.items():
            self._nack_all(deliveries, error, timed_out)

    def _nack_all(self, deliveries: list[Delivery], error: str, timed_out: bool) -> None:
        """Nacks deliveries that failed with the same error, in one call."""
        consumer = self._consumer
        outcome = Outcome.TIMEOUT if timed_out else Outcome.NACK
        sent = 0

        def nack_available() -> list[str | RQueueError]:
            nonlocal sent
            sent += 1
            return consumer.nack_available(deliveries, error=error, timed_out=timed_out)

        statuses = self._retry(nack_available)
        for d in nacks_done(outcome, deliveries, statuses, sent > 1, self._tally):
            # A drop (dead_letter None) is logged by the consumer too.
            log.warning(
                "dead-lettered %s: %d deliveries reached max_deliveries; last error: %s", d.tag, d.delivery_count, error
            )
            dead_lettered(consumer.queue.name, consumer.group, d, "max-deliveries")
            self._keep_failure(d, "max-deliveries", error)

    def _ack_keeping(self, keeping: list[tuple[Delivery, Completion]]) -> None:
        """Results are on: these acks keep their results (and, when on,
        record their completed events) in one call, not with the fetch; a
        refused ack keeps nothing."""
        for event in (False, True):  # the settings may have changed within a round
            items = [(d, c.value) for d, c in keeping if c.event is event]
            if items:
                self._record_acks(self._retry(self._consumer.ack_results, items, event))

    def _keep_failure(self, d: Delivery, reason: str, error: str) -> None:
        """With results on, a message that failed for good keeps its failure
        as its result (after the settle; a failure to keep it is logged)."""
        consumer = self._consumer
        if not consumer.last_settings.results:
            return

        def keep() -> OutOfMemory | None:
            # A full server refuses it (a plain write): not kept, rather than
            # the worker waiting out reconnect_timeout for memory per failure.
            try:
                consumer.keep_failure(d, reason, error)
            except OutOfMemory as exc:
                return exc
            return None

        try:
            refused: RQueueError | None = self._retry(keep)
        except RQueueError as exc:
            refused = exc
        if refused is not None:
            log.warning("failure of %s not kept as its result: %s", d.tag, refused)

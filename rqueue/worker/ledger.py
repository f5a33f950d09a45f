"""The deliveries a worker holds, from their fetch until their outcome is
settled in Redis: the state its dispatcher, handler threads and heartbeat
share."""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..errors import CorruptRecord, RQueueError
from .outcome import Detail, Outcome

if TYPE_CHECKING:
    from ..delivery import Delivery

log = logging.getLogger("rqueue.worker")


class Ledger:
    """What one worker holds, in four parts:

    - known: fetched and not yet settled. The dispatcher thread's alone (it
      fetches and settles), so it needs no lock; this list is complete
      whenever the dispatcher hands back what a lost fetch reply claimed.
    - waiting: fetched, no handler thread yet, with the time their fetch
      was sent (monotonic seconds: the lease can have begun no earlier, and
      a pause of the worker between the reply's arrival and its reading
      counts as waiting). A handler thread runs a delivery only if it takes
      it from here, so a stop or a lost lease can withdraw it.
    - running: in a handler, with their start time.
    - results: finished, with their outcome, for the dispatcher to settle.

    Waiting and running are under one lock; results is a deque that
    handler threads append to and the dispatcher takes whole, under a lock
    of its own (see :meth:`result`).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Keyed by the Delivery itself (hashed by identity): a handler
        # thread and the dispatcher name the same object, and no tag text
        # is made for a delivery nothing logs.
        self._known: dict[Delivery, Delivery] = {}
        self._waiting: dict[Delivery, float] = {}  # -> when its fetch was sent
        self._running: dict[Delivery, float] = {}  # -> when its handler started
        self._results: deque[tuple[Delivery, Outcome, Detail]] = deque()
        self._results_lock = threading.Lock()

    # -- the dispatcher ---------------------------------------------------------

    def unsettled(self) -> int:
        """How many deliveries are fetched and not yet settled."""
        return len(self._known)

    def waiting(self) -> int:
        """How many fetched deliveries wait for a handler (a glance: read
        without the lock, as the count a moment ago)."""
        return len(self._waiting)

    def running(self) -> int:
        """How many deliveries run in a handler (a glance, as :meth:`waiting`)."""
        return len(self._running)

    def is_known(self, d: Delivery) -> bool:
        """Whether ``d`` is fetched and its settling not yet begun (any
        thread may ask: one dict lookup)."""
        return d in self._known

    def known(self) -> list[Delivery]:
        """Every delivery fetched and not yet settled."""
        return list(self._known.values())

    def fetched(self, deliveries: list[Delivery]) -> None:
        """Records deliveries a fetch returned."""
        for d in deliveries:
            self._known[d] = d

    def wait(self, deliveries: list[Delivery], sent: float) -> None:
        """Makes fetched deliveries wait for a handler thread; ``sent`` is
        when the fetch that brought them was sent."""
        with self._lock:
            for d in deliveries:
                self._waiting[d] = sent

    def withdraw_waiting(self) -> list[Delivery]:
        """Takes every waiting delivery away from the handler threads (which
        then find them gone) and forgets them; returns them."""
        with self._lock:
            waiting = list(self._waiting)
            self._waiting.clear()
        for d in waiting:
            self._known.pop(d, None)
        return waiting

    def has_results(self) -> bool:
        return bool(self._results)

    def drain(self) -> tuple[list[Delivery], list[tuple[Delivery, Outcome, Detail]]]:
        """Takes every result: the deliveries to ack with the next fetch, and
        the rest (nacks, rejects and timeouts with their texts, acks that
        keep a result or record an event). Deliveries not run are only
        forgotten."""
        acks: list[Delivery] = []
        others: list[tuple[Delivery, Outcome, Detail]] = []
        with self._results_lock:
            results, self._results = self._results, deque()
        for d, outcome, text in results:
            self._known.pop(d, None)
            if outcome is Outcome.ACK:
                if text:
                    others.append((d, outcome, text))
                else:
                    acks.append(d)
            elif outcome is Outcome.NACK or outcome is Outcome.REJECT or outcome is Outcome.TIMEOUT:
                others.append((d, outcome, text))
        return acks, others

    # -- the handler threads ----------------------------------------------------

    def take(self, d: Delivery, stopping: threading.Event) -> float | Outcome:
        """Takes a waiting delivery to run it; returns when its fetch was sent.
        Returns RETURNED when the worker is stopping (the leave hands it
        back) and SKIPPED when it is no longer waiting (its lease was lost)."""
        with self._lock:
            # Read under the lock: withdraw_waiting runs only after the stop
            # is set, so a delivery missing while not stopping was lost.
            if stopping.is_set():
                return Outcome.RETURNED
            sent = self._waiting.pop(d, None)
        return Outcome.SKIPPED if sent is None else sent

    def begin(self, d: Delivery, stopping: threading.Event, now: float, stale_age: float) -> float | Outcome | None:
        """:meth:`take` and :meth:`start` in one step, for a delivery whose
        fetch was sent less than ``stale_age`` before ``now``: None when it
        runs since ``now``. Otherwise as :meth:`take`: RETURNED, SKIPPED,
        or (taken, not started) when its fetch was sent, for the caller to
        check its lease with Redis before it starts it."""
        with self._lock:
            if stopping.is_set():
                return Outcome.RETURNED
            sent = self._waiting.pop(d, None)
            if sent is None:
                return Outcome.SKIPPED
            if now - sent >= stale_age:
                return sent
            self._running[d] = now
        return None

    def take_batch(self, deliveries: Sequence[Delivery], stopping: threading.Event) -> list[float | None] | None:
        """:meth:`take` for a batch under one lock: for each delivery when its
        fetch was sent, or None when it is no longer waiting; None for all
        when the worker is stopping."""
        with self._lock:
            if stopping.is_set():
                return None
            pop = self._waiting.pop
            return [pop(d, None) for d in deliveries]

    def start(self, d: Delivery, started: float) -> None:
        """Records that a handler runs ``d`` since ``started``."""
        with self._lock:
            self._running[d] = started

    def stop(self, d: Delivery) -> bool:
        """Records that no handler runs ``d`` any more; False
        when it was no longer running. The handler's end and its time limit
        both call it, and only the first to do so settles the delivery."""
        with self._lock:
            return self._running.pop(d, None) is not None

    def start_batch(self, deliveries: list[Delivery], started: float) -> None:
        """:meth:`start` for a batch under one lock."""
        with self._lock:
            running = self._running
            for d in deliveries:
                running[d] = started

    def stop_batch(self, deliveries: Sequence[Delivery]) -> bool:
        """:meth:`stop` for a batch under one lock: False when none of it
        was running any more (its time limit took it first: the batch
        leaves the running set whole, in one call or the other)."""
        with self._lock:
            pop = self._running.pop
            return sum(1 for d in deliveries if pop(d, None) is not None) > 0

    def result(self, d: Delivery, outcome: Outcome, text: Detail) -> bool:
        """Hands the outcome of ``d`` to the dispatcher; True when none was
        waiting before it (the caller then wakes the dispatcher: one wake-up
        per drain, not per result, since the dispatcher looks at the results
        before it sleeps). The look and the append are one step against
        :meth:`drain`: a drain between them would leave this result unseen
        by a dispatcher gone to sleep, and no one to wake it."""
        with self._results_lock:
            results = self._results
            first = not results
            results.append((d, outcome, text))
        return first

    def results(self, done: list[tuple[Delivery, Outcome, Detail]]) -> bool:
        """Hands the outcomes of a batch to the dispatcher; True as for
        :meth:`result`."""
        with self._results_lock:
            results = self._results
            first = not results
            results.extend(done)
        return first

    # -- the heartbeat ----------------------------------------------------------

    def leases(self, now: float, max_run_time: float) -> tuple[list[Delivery], list[Delivery]]:
        """The running and the waiting deliveries whose leases are kept alive:
        each for up to ``max_run_time`` (waiting ones from their fetch), so
        that nothing stays held behind handlers that hang."""
        with self._lock:
            running = [d for d, started in self._running.items() if now - started < max_run_time]
            waiting = [d for d, fetched in self._waiting.items() if now - fetched < max_run_time]
        return running, waiting

    def lost(self, found: list[tuple[Delivery, RQueueError]]) -> None:
        """Withdraws waiting deliveries whose leases were lost (a heartbeat
        found them no longer held), each with the heartbeat's status for it,
        logged as the handlers' checks log theirs: every delivery a worker
        does not run says why. A damaged delivery state is said loudly:
        damage, not a lease that moved on."""
        with self._lock:
            withdrawn = [(d, err) for d, err in found if self._waiting.pop(d, None) is not None]
        for d, err in withdrawn:
            if isinstance(err, CorruptRecord):
                log.error("not running %s: %s (a heartbeat found it)", d.tag, err)
            else:
                log.info("not running %s: its lease was lost while it waited (a heartbeat found it)", d.tag)

    def forget_waiting(
        self, epoch_for: Callable[[Delivery], int] | None = None, taken: Callable[[Delivery], bool] | None = None
    ) -> int:
        """Withdraws the waiting deliveries that ``taken`` judges taken back
        (the worker was removed from a group: what it held there is offered
        again; a partitioned consumer's other partitions keep theirs), or
        with ``epoch_for`` those fetched before the state epoch it gives for
        each (Redis lost the queue's state: what was fetched after the loss
        stays, and so does what another partition's consumer fetched, whose
        epoch is its own), or without either every one; returns how many."""
        judge = taken if taken is not None or epoch_for is None else fetched_before(epoch_for)
        with self._lock:
            if judge is None:
                dropped = len(self._waiting)
                self._waiting.clear()
                return dropped
            old = [d for d in self._waiting if judge(d)]
            for d in old:
                del self._waiting[d]
        return len(old)


def fetched_before(epoch_for: Callable[[Delivery], int]) -> Callable[[Delivery], bool]:
    """Judges a delivery fetched before the state epoch ``epoch_for`` gives it."""
    return lambda d: d.epoch < epoch_for(d)

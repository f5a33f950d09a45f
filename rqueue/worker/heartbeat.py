"""The heartbeat thread of a worker: keeps the leases of waiting and
running deliveries alive (each up to ``max_run_time``), proves the worker
is alive, and removes members of the group whose heartbeat lapsed."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import NotMember
from .ledger import Ledger
from .reconnect import TRANSIENT, Reconnector
from .stats import Tally

if TYPE_CHECKING:
    from ..clock import Clock
    from ..consumer import Consumer
    from ..partitioned_consumer import PartitionedConsumer

log = logging.getLogger("rqueue.worker")


class Heartbeat:
    """One thread that sends the worker's heartbeat every ``interval``
    seconds (sooner when the lease, ``ack_wait``, is shorter)."""

    def __init__(
        self,
        *,
        consumer: Consumer | PartitionedConsumer,
        queue_name: str,
        ledger: Ledger,
        tally: Tally,
        retry: Reconnector,
        clock: Clock,
        ack_wait: Callable[[], float],
        interval: float,
        timeout: float,
        max_run_time: float,
    ) -> None:
        self._consumer = consumer
        self._queue_name = queue_name
        self._ledger = ledger
        self._tally = tally
        self._retry = retry
        self._clock = clock
        self._ack_wait = ack_wait
        self._interval = interval
        self._timeout = timeout
        self._max_run_time = max_run_time
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._beat, name="rqueue-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops the thread and waits (up to 10 s; the reconnector's watchdog
        cuts off a heartbeat Redis does not answer) for its last heartbeat."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _beat(self) -> None:
        consumer = self._consumer
        ledger = self._ledger
        # A lease shorter than the heartbeat interval must still be extended in time.
        while not self._stop.wait(min(self._interval, self._ack_wait() / 3)):
            running, waiting = ledger.leases(self._clock.monotonic(), self._max_run_time)
            epoch = consumer.state_epoch
            try:
                # Sent once (the next one comes an interval later), but cut off
                # by the watchdog if Redis leaves it unanswered.
                statuses, removed, returned, dead, _ = self._retry.once(
                    consumer.heartbeat, running + waiting, self._timeout
                )
            except NotMember as removal:
                # This worker was silent too long and was removed: what it
                # held was offered again; running handlers' acks become late,
                # and waiting deliveries are not run (docs/guarantees.md,
                # guarantee 3: the group may ack them meanwhile). Of a
                # partitioned queue, only the removing partitions' deliveries.
                dropped = ledger.forget_waiting(taken=consumer.removed_by(removal))
                log.warning(
                    "worker %s had been removed from its group; %d waiting deliveries dropped, not run; joining again",
                    consumer.name,
                    dropped,
                )
                try:
                    self._retry.once(consumer.rejoin, removal)
                except Exception as exc:  # the next heartbeat tries again
                    log.warning("could not join again (%s: %s)", type(exc).__name__, exc)
                continue
            except TRANSIENT as exc:
                log.debug("heartbeat failed (%s); the dispatcher handles reconnecting", exc)
                continue
            except Exception:  # never let the heartbeat thread die silently
                log.exception("heartbeat failed")
                continue
            finally:
                if consumer.state_epoch != epoch:
                    # Redis lost the queue's state (the consumer logged it):
                    # what waits from before the loss never runs; what the
                    # dispatcher fetched since (a newer epoch) does.
                    dropped = ledger.forget_waiting(epoch_for=consumer.epoch_for)
                    log.warning("worker %s: %d waiting deliveries dropped, not run", consumer.name, dropped)
            # A delivery settled since the heartbeat listed it (its ack
            # raced this call) is refused as no longer held, not lost.
            lost = sum(
                1 for d, s in zip(running + waiting, statuses, strict=False) if s is not None and ledger.is_known(d)
            )
            # The statuses list the running deliveries, then the waiting ones.
            gone = [(d, s) for d, s in zip(waiting, statuses[len(running) :], strict=False) if s is not None]
            if gone:
                # A message whose lease was lost (maybe acked by now) is not
                # run from this worker (docs/guarantees.md, guarantee 3).
                ledger.lost(gone)
            self._tally.count(leases_lost=lost, members_removed=removed)
            if removed:
                log.warning(
                    "removed %d silent member(s) of %s/%s: %d deliveries offered again, %d dead-lettered",
                    removed,
                    self._queue_name,
                    consumer.group,
                    returned,
                    dead,
                )

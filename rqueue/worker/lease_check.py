"""The checks with Redis of a delivery's lease before its handler runs,
for both workers (rqueue.worker.handlers and rqueue.aio.Worker): one
delivery (LeaseCheck) or a batch (BatchCheck)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Generic, TypeVar

from ..constants import STALE_DISPATCH_FRACTION
from ..errors import CorruptRecord, RQueueError

if TYPE_CHECKING:
    from ..delivery import Delivery

log = logging.getLogger("rqueue.worker")

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


D = TypeVar("D", bound="Delivery")


class BatchCheck(Generic[D]):
    """:class:`LeaseCheck` for the deliveries of a batch, for both workers.
    Redis vouches for a lease from when a check of it is sent (from the
    fetch's sending, unchecked); the batch starts only after the last
    answer, so a delivery whose vouching is past the stale age by then (the
    checks of the others took long) is checked again, each up to
    STALE_CHECKS times, until all that are held were vouched for within
    the stale age of the start."""

    def __init__(
        self, deliveries: list[D], sent: list[float], now: float, ack_wait: float, heartbeat_timeout: float
    ) -> None:
        #: The deliveries still held, in their order.
        self.held = deliveries
        #: When the batch may start (monotonic seconds), once nothing is due.
        self.now = now
        self._vouched: dict[D, float] = dict(zip(deliveries, sent, strict=True))
        self._safe = min(ack_wait, heartbeat_timeout) * STALE_DISPATCH_FRACTION
        self._checks: dict[D, int] = {}

    def due(self) -> list[D]:
        """The held deliveries to check (again) before the batch starts."""
        return [d for d in self.held if self.now - self._vouched[d] >= self._safe]

    def checking(self, due: list[D]) -> list[D]:
        """Of the deliveries ``due`` for a check, those to check now, in their
        order; the rest are dropped (their checks answered too late)."""
        kept: list[D] = []
        for d in due:
            if self.exhausted(d):
                self.drop(d)
            else:
                kept.append(d)
        return kept

    def exhausted(self, d: D) -> bool:
        """Counts a check of ``d``; True (and logged) when STALE_CHECKS answered too late."""
        checks = self._checks[d] = self._checks.get(d, 0) + 1
        if checks <= STALE_CHECKS:
            return False
        log.warning("not running %s: Redis answered %d checks of its lease too late", d.tag, STALE_CHECKS)
        return True

    def vouched(self, d: D, asked: float) -> None:
        """Redis holds the lease of ``d`` as of ``asked``, when its check was sent."""
        self._vouched[d] = asked

    def drop(self, d: D) -> None:
        """``d`` is not run (its checks answered too late)."""
        self.held = [h for h in self.held if h is not d]

    def lost(self, d: D) -> None:
        """``d`` is not run: Redis no longer holds it for this worker."""
        log.info(
            "not running %s: no longer held %.1f s after its lease was last vouched for",
            d.tag,
            self.now - self._vouched[d],
        )
        self.drop(d)


def batch_check(
    deliveries: list[D],
    taken: list[float | None],
    epoch_for: Callable[[D], int],
    now: float,
    ack_wait: float,
    heartbeat_timeout: float,
) -> BatchCheck[D]:
    """The check of a batch taken from the ledger (``taken``: when each
    delivery's fetch was sent, None when it is no longer waiting), holding
    those still waiting and made since Redis last lost the queue's state."""
    held: list[D] = []
    sent: list[float] = []
    for d, t in zip(deliveries, taken, strict=True):
        if t is None:
            continue  # withdrawn, and logged, by a heartbeat or the stop
        if d.epoch != epoch_for(d):
            log.info("not running %s: fetched before Redis lost the queue's state", d.tag)
            continue
        held.append(d)
        sent.append(t)
    return BatchCheck(held, sent, now, ack_wait, heartbeat_timeout)


def split_held(run: list[D], held: list[bool]) -> tuple[list[D], list[D]]:
    """A started batch checked with Redis again just before its handler's
    call (the worker paused since its take): the deliveries Redis still
    holds for this worker, and those it handed on (each logged: every
    delivery a worker does not run says why)."""
    kept: list[D] = []
    gone: list[D] = []
    for d, h in zip(run, held, strict=True):
        (kept if h else gone).append(d)
    for d in gone:
        log.info("not running %s: no longer held after a pause between its take and the batch handler's call", d.tag)
    return kept, gone


def held_of(statuses: Sequence[RQueueError | None]) -> list[bool]:
    """Per delivery of a batch's check (in_progress_available's statuses),
    whether Redis still holds it for this worker. A damaged delivery state
    is not run either, and is said loudly: damage, not a lease that moved on."""
    for err in statuses:
        if isinstance(err, CorruptRecord):
            log.error("not running a delivery of this batch: %s", err)
    return [s is None for s in statuses]

"""The consumer of a partitioned queue: one consumer per partition under
one name, fetched from in turn; settling goes to the delivery's partition."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from . import validate as check
from .constants import IDLE_POLL_INTERVAL, MAX_FETCH
from .consumer import Consumer
from .consumer_core import ConsumerCore, every_delivery, refs_of
from .delivery import Delivery, DeliveryRef, HeartbeatResult
from .errors import DeliveryError, InvalidInput, LostDelivery, NotMember, RQueueError, StateLost
from .ids import consumer_name
from .settings import Settings

if TYPE_CHECKING:
    from .protocols import QueueContext

log = logging.getLogger("rqueue")


def graver(kept: Exception | None, new: Exception, partition: int) -> Exception:
    """Of two failures of a partitioned heartbeat, the one to raise once
    every partition was beaten: one partition's node down, or its member
    removed, must not leave the other partitions' leases to run out. A
    removal (NotMember) comes first, as the worker then joins again, and
    names every partition that removed the member (``partition``: where
    ``new`` was raised), so that the worker drops only their deliveries."""
    if isinstance(new, NotMember):
        if isinstance(kept, NotMember):
            kept.partitions = (*kept.partitions, partition)
            return kept
        new.partitions = (partition,)
        return new
    return new if kept is None else kept


class Partition(Protocol):
    def consumer(
        self,
        group: str,
        name: str | None = None,
        prefetch: int | None = None,
        liveness: float | None = None,
        **settings: Any,
    ) -> Consumer: ...


class Partitioned(Protocol):
    """What a partitioned consumer needs of its queue (rqueue.PartitionedQueue)."""

    name: str
    client: QueueContext

    @property
    def parts(self) -> Sequence[Partition]: ...
    def refresh(self) -> bool: ...


class PartitionRouting:
    """Which partition's consumer a delivery or tag belongs to, and the
    order partitions are fetched from: shared by the sync and the asyncio
    partitioned consumers."""

    consumers: Sequence[Any]
    _next: int
    _lock: threading.Lock

    def _order(self) -> list[Any]:
        """The partitions' consumers, starting one further on each call."""
        with self._lock:
            start = self._next
            self._next = (start + 1) % len(self.consumers)
        return [*self.consumers[start:], *self.consumers[:start]]

    @staticmethod
    def _by_index(statuses: dict[int, Any]) -> list[Any]:
        return [statuses[i] for i in range(len(statuses))]

    @staticmethod
    def _named(partition: int, exc: DeliveryError) -> DeliveryError:
        """A partition's settle error, its tag naming the partition
        ("<partition>/<seq>.<count>.<token>")."""
        if isinstance(exc, LostDelivery):
            return LostDelivery(f"{partition}/{exc.tag}", exc.loss)
        return type(exc)(f"{partition}/{exc.tag}")

    def _summed(self, results: list[tuple[list[tuple[int, Any]], HeartbeatResult]]) -> HeartbeatResult:
        """One heartbeat result from the partitions' (each with the refs it
        was given, by their index): statuses in the caller's order, figures added up."""
        statuses: dict[int, RQueueError | None] = {}
        for mine, result in results:
            statuses.update(zip((i for i, _ in mine), result.statuses, strict=True))
        return HeartbeatResult(
            self._by_index(statuses),
            sum(r.removed for _, r in results),
            sum(r.returned for _, r in results),
            sum(r.dead_lettered for _, r in results),
            sum(r.handed_back for _, r in results),
        )

    def _locate(self, ref: DeliveryRef) -> tuple[int, DeliveryRef]:
        if isinstance(ref, Delivery):
            owner = ref.consumer
            p = owner.queue.partition if isinstance(owner, ConsumerCore) else None
            if owner not in self.consumers or p is None:
                raise InvalidInput(f"delivery {ref.tag} was not fetched by {self!r}")
            return p, ref
        if not isinstance(ref, str):
            raise InvalidInput(f"expected a Delivery or a delivery tag, not {type(ref).__name__}")
        head, sep, tag = ref.partition("/")
        if not sep or not head.isascii() or not head.isdigit() or int(head) >= len(self.consumers):
            raise InvalidInput(
                f"{ref!r} is not a delivery tag of a partitioned queue: <partition>/<seq>.<count>.<token> "
                f"with a partition from 0 to {len(self.consumers) - 1}"
            )
        return int(head), tag

    def _split(self, refs: Iterable[DeliveryRef]) -> dict[int, list[tuple[int, DeliveryRef]]]:
        """The deliveries by partition, each with its index in ``refs``."""
        out: dict[int, list[tuple[int, DeliveryRef]]] = {}
        for i, ref in enumerate(refs):
            p, d = self._locate(ref)
            out.setdefault(p, []).append((i, d))
        return out

    def _one(self, ref: DeliveryRef) -> tuple[Any, DeliveryRef]:
        p, d = self._locate(ref)
        return self.consumers[p], d

    def join_marks(self) -> tuple[int, ...]:
        """How many times each partition's member joined (see :meth:`rejoined_since`)."""
        return tuple(c.joins for c in self.consumers)

    def rejoined_since(self, marks: Sequence[int]) -> Callable[[Delivery], bool] | None:
        """Which deliveries a removal since ``marks`` took back: those of
        the partitions whose member joined again since (a fetch there
        found it removed); None when none did. The other partitions still
        hold theirs, and so do partitions the queue grew by since ``marks``
        (their members joined for the first time)."""
        again = [c for c, mark in zip(self.consumers, marks, strict=False) if c.joins != mark]
        return (lambda d: any(d.consumer is c for c in again)) if again else None

    def removed_by(self, removal: NotMember) -> Callable[[Delivery], bool]:
        """Which deliveries the removal a heartbeat raised took back: those
        of the partitions that removed this member (every one when it
        names none)."""
        if not removal.partitions:
            return every_delivery
        gone = [self.consumers[p] for p in removal.partitions]
        return lambda d: any(d.consumer is c for c in gone)

    def _rejoining(self, removal: NotMember | None) -> list[Any]:
        """The partitions' consumers to join again after ``removal``:
        those it names, or every one."""
        if removal is None or not removal.partitions:
            return list(self.consumers)
        return [self.consumers[p] for p in removal.partitions]


class PartitionedConsumer(PartitionRouting):
    """A member of a group in every partition of a partitioned queue, under
    one name. Obtain one with :meth:`PartitionedQueue.consumer`.

    Deliveries are the partitions' own :class:`rqueue.Delivery` objects (a
    delivery's ``consumer.queue.partition`` names its partition, and its
    ``tag`` is unique only within it); settle them with their own methods or
    with this consumer's, which take Delivery objects or tags of the form
    ``"<partition>/<seq>.<count>.<token>"``.
    """

    def __init__(
        self,
        queue: Partitioned,
        group: str,
        name: str | None,
        prefetch: int | None,
        liveness: float | None,
        settings: dict[str, Any],
    ) -> None:
        self.queue = queue
        self.client = queue.client
        self.group = group
        self.name = name if name is not None else consumer_name(self.client.randomness)
        self.consumers: list[Consumer] = []
        self._joining = (prefetch, liveness, settings)
        try:
            for part in queue.parts:
                self.consumers.append(part.consumer(group, self.name, prefetch, liveness, **settings))
        except BaseException:
            for c in self.consumers:
                c.close()
            raise
        self._next = 0
        self._lock = threading.Lock()

    def _take_up_growth(self) -> None:
        """Joins the partitions a growth added (rqueue.Client.grow_partitions),
        once the queue sees them (at most a second later)."""
        self.queue.refresh()
        parts = self.queue.parts
        if len(parts) <= len(self.consumers):
            return
        prefetch, liveness, settings = self._joining
        joined = [
            part.consumer(self.group, self.name, prefetch, liveness, **settings)
            for part in parts[len(self.consumers) :]
        ]
        with self._lock:
            self.consumers = self.consumers + joined

    def __repr__(self) -> str:
        return f"PartitionedConsumer(queue={self.queue.name!r}, group={self.group!r}, name={self.name!r})"

    def settings(self) -> Settings:
        """The settings this consumer works with (the same in every partition)."""
        return self.consumers[0].settings()

    def fetch(self, n: int = 1, timeout: float = 0.0) -> list[Delivery]:
        """Claims up to ``n`` deliveries from the partitions in turn (see
        :meth:`rqueue.Consumer.fetch`); waits up to ``timeout`` seconds for
        the first one when none is ready."""
        check.whole_number("n", n, 1, MAX_FETCH)
        check.seconds("timeout", timeout)
        self._take_up_growth()
        clock, notifier = self.client.clock, self.client.notifier
        deadline = clock.monotonic() + timeout
        while True:
            since = (
                {c.queue.keys.wake_channel: notifier.generation(c.queue.keys.wake_channel) for c in self.consumers}
                if timeout > 0
                else {}
            )
            out: list[Delivery] = []
            due: float | None = None  # the soonest a partition's waiting message falls due
            for c in self._order():
                try:
                    _, got, due_in = c.ack_and_fetch([], n - len(out))
                    out += got
                    if due_in is not None:
                        due = due_in if due is None else min(due, due_in)
                except Exception as exc:
                    if not out:
                        raise
                    # deliveries already claimed from other partitions must reach the caller
                    log.warning("fetch from %r failed (%s); returning what the other partitions gave", c.queue, exc)
                    break
                if len(out) >= n:
                    break
            remaining = deadline - clock.monotonic()
            if out or remaining <= 0:
                return out
            wait = min(remaining, IDLE_POLL_INTERVAL)
            notifier.wait_any(since, wait if due is None else min(wait, due))

    def ack_and_fetch(
        self, acks: Iterable[DeliveryRef], n: int, wait: float | None = None, may_wait: bool = False
    ) -> tuple[list[RQueueError | None], list[Delivery], float | None]:
        """As :meth:`rqueue.Consumer.ack_and_fetch`: each partition settles
        its acks; new deliveries come from the partitions in turn. ``wait``
        is checked and not waited for, and ``may_wait`` changes nothing
        (see :meth:`waits_on_wakes`)."""
        check.whole_number("n", n, 0)
        if wait is not None:
            check.seconds("wait", wait)
        self._take_up_growth()
        by_part = self._split(acks)
        statuses: dict[int, RQueueError | None] = {}
        out: list[Delivery] = []
        due: list[float] = []
        for c in self._order():
            p = c.queue.partition
            assert p is not None
            mine = by_part.pop(p, [])
            want = max(0, n - len(out))
            if not mine and not want:
                continue
            got_statuses, got, due_in = c.ack_and_fetch([d for _, d in mine], want)
            statuses.update(zip((i for i, _ in mine), got_statuses, strict=True))
            out += got
            if due_in is not None:
                due.append(due_in)
        return [statuses[i] for i in range(len(statuses))], out, (min(due) if due and not out else None)

    def ack(self, deliveries: DeliveryRef | Iterable[DeliveryRef], multiple: bool = False) -> None:
        """Acks deliveries (one round trip per partition involved); with
        ``multiple``, as :meth:`rqueue.Consumer.ack` within the delivery's
        partition. All or nothing within each partition, as in
        :meth:`rqueue.Consumer.ack`; partitions are separate slots, so every
        partition is settled and then the first error is raised, its tag
        naming the partition ("<partition>/<seq>.<count>.<token>")."""
        first: Exception | None = None
        for p, mine in self._split(refs_of(deliveries)).items():
            try:
                self.consumers[p].ack([d for _, d in mine], multiple=multiple)
            except DeliveryError as exc:
                first = first or self._named(p, exc)
        if first is not None:
            raise first

    def ack_available(self, deliveries: Iterable[DeliveryRef]) -> list[RQueueError | None]:
        """As :meth:`rqueue.Consumer.ack_available`, over the partitions."""
        statuses: dict[int, RQueueError | None] = {}
        for p, mine in self._split(refs_of(deliveries)).items():
            statuses.update(
                zip((i for i, _ in mine), self.consumers[p].ack_available([d for _, d in mine]), strict=True)
            )
        return [statuses[i] for i in range(len(statuses))]

    def nack(
        self, delivery: DeliveryRef, delay: float | None = None, error: str = "", *, timed_out: bool = False
    ) -> str:
        c, d = self._one(delivery)
        status: str = c.nack(d, delay=delay, error=error, timed_out=timed_out)
        return status

    def nack_available(
        self, deliveries: Iterable[DeliveryRef], delay: float | None = None, error: str = "", *, timed_out: bool = False
    ) -> list[str | RQueueError]:
        """As :meth:`rqueue.Consumer.nack_available`, a call per partition."""
        statuses: dict[int, str | RQueueError] = {}
        for p, mine in self._split(refs_of(deliveries)).items():
            refs = [d for _, d in mine]
            got = self.consumers[p].nack_available(refs, delay, error, timed_out=timed_out)
            statuses.update(zip((i for i, _ in mine), got, strict=True))
        return self._by_index(statuses)

    def ack_result(self, delivery: DeliveryRef, value: bytes | None, event: bool) -> None:
        """As :meth:`rqueue.Consumer.ack_result`, in the delivery's partition."""
        c, d = self._one(delivery)
        c.ack_result(d, value, event)

    def ack_results(self, items: Iterable[tuple[DeliveryRef, bytes]], event: bool) -> list[RQueueError | None]:
        """As :meth:`rqueue.Consumer.ack_results`, a call per partition."""
        items = list(items)
        statuses: dict[int, RQueueError | None] = {}
        for p, mine in self._split(ref for ref, _ in items).items():
            got = self.consumers[p].ack_results([(d, items[i][1]) for i, d in mine], event)
            statuses.update(zip((i for i, _ in mine), got, strict=True))
        return self._by_index(statuses)

    def waits_on_wakes(self) -> bool:
        """False: an idle worker of a partitioned queue waits on its
        partitions' channels (one wait over several streams would span
        slots on a cluster)."""
        return False

    def end_waits(self) -> None:
        """Nothing: no consumer of a partitioned queue waits in Redis."""

    def keep_failure(self, delivery: Delivery, reason: str, error: str) -> None:
        """As :meth:`rqueue.Consumer.keep_failure`, in the delivery's partition."""
        c, _ = self._one(delivery)
        c.keep_failure(delivery, reason, error)

    nak = nack

    def reject(self, delivery: DeliveryRef, requeue: bool = False, reason: str = "") -> None:
        c, d = self._one(delivery)
        c.reject(d, requeue=requeue, reason=reason)

    def term(self, delivery: DeliveryRef, reason: str = "") -> None:
        c, d = self._one(delivery)
        c.term(d, reason)

    def in_progress(self, deliveries: DeliveryRef | Iterable[DeliveryRef]) -> int:
        """Extends leases (see :meth:`rqueue.Consumer.in_progress`); returns
        the latest new deadline (server ms)."""
        return max(
            self.consumers[p].in_progress([d for _, d in mine]) for p, mine in self._split(refs_of(deliveries)).items()
        )

    def in_progress_available(self, deliveries: Iterable[DeliveryRef]) -> list[RQueueError | None]:
        """As :meth:`rqueue.Consumer.in_progress_available`, a call per partition."""
        statuses: dict[int, RQueueError | None] = {}
        for p, mine in self._split(refs_of(deliveries)).items():
            got = self.consumers[p].in_progress_available([d for _, d in mine])
            statuses.update(zip((i for i, _ in mine), got, strict=True))
        return self._by_index(statuses)

    def heartbeat(self, running: Iterable[DeliveryRef], timeout: float, sync: bool = False) -> HeartbeatResult:
        """A heartbeat in every partition (see :meth:`rqueue.Consumer.heartbeat`);
        the figures add up. A partition that fails is passed, and its
        failure raised once the others are beaten (:func:`graver`)."""
        by_part = self._split(running)
        results = []
        failure: Exception | None = None
        for c in self.consumers:
            mine = by_part.get(c.queue.partition or 0, [])
            try:
                results.append((mine, c.heartbeat([d for _, d in mine], timeout, sync)))
            except Exception as exc:
                failure = graver(failure, exc, c.queue.partition or 0)
        if failure is not None:
            raise failure
        return self._summed(results)

    @property
    def joins(self) -> int:
        """How many times the partitions' members joined, in all: a worker
        compares it around a call to learn that a partition's group had
        removed this member meanwhile."""
        return sum(c.joins for c in self.consumers)

    @property
    def last_settings(self) -> Settings:
        """The settings of the last call (the same in every partition),
        read without asking Redis."""
        return self.consumers[0].last_settings

    def epoch_for(self, delivery: Delivery) -> int:
        """The state epoch ``delivery`` is judged by: that of its own
        partition's consumer (a loss in one partition leaves the others'
        deliveries valid)."""
        owner = delivery.consumer
        return owner.state_epoch if isinstance(owner, Consumer) else self.state_epoch

    @property
    def state_epoch(self) -> int:
        """How many losses of Redis state the partitions' consumers have
        seen, in all (see :attr:`rqueue.Consumer.state_epoch`)."""
        return sum(c.state_epoch for c in self.consumers)

    @property
    def state_losses(self) -> list[StateLost | None]:
        """Per partition, the last loss of its state in Redis that this
        consumer saw, or None."""
        return [c.last_state_loss for c in self.consumers]

    def rejoin(self, removal: NotMember | None = None) -> None:
        """Joins again the groups of the partitions ``removal`` names (every one without)."""
        for c in self._rejoining(removal):
            c.rejoin()

    def close(self) -> int:
        """Leaves the group in every partition (each one, even when another
        fails; then the first error is raised); returns how many deliveries
        went back."""
        returned, first = 0, None
        for c in self.consumers:
            try:
                returned += c.close()
            except Exception as exc:
                first = first or exc
        if first is not None:
            raise first
        return returned

    def __enter__(self) -> PartitionedConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

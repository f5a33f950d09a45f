"""Partitioned queues on an asyncio client: rqueue.partitions' queue and
consumer, awaited. Routing, the checks of a publish, each partition's share
and how the partitions' results add up are rqueue.partitions' functions;
which partition a delivery belongs to, and the order partitions are
fetched from, rqueue.partitioned_consumer's. Only the I/O is here.

Long because a partitioned queue offers every method of a queue that makes
sense across partitions, each spelled out over its partitions and awaited,
and its consumer every method of a consumer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from .. import validate as check
from ..constants import IDLE_POLL_INTERVAL, MAX_FETCH
from ..consumer_core import refs_of
from ..delivery import HeartbeatResult
from ..engine import async_commands as acmd
from ..errors import DeliveryError, InvalidInput, NotMember, QueueInUse, RQueueError, StateLost
from ..ids import consumer_name
from ..names import check_name
from ..partition_routing import gather, prepare_parts, route
from ..partitioned_consumer import PartitionRouting, graver
from ..partitions import PartitionedQueue as SyncPartitionedQueue
from ..partitions import (
    check_after,
    check_partitions,
    id_search_order,
    left_of,
    merged_events,
    of_partition,
    oldest,
    partitioned_stats,
    result_partition,
)
from ..placement import Layout, queue_placements
from ..results import DeadLetter, GroupReset, Message, PlacementReport, PublishResult, QueueStats, ReplayResult, Trimmed
from ..retention import Position, check_partitioned_group, partitioned_position_args, partly_done, undone
from ..settings import Settings
from ..stored_results import Result, result_id, unknown_id
from .consumer import Consumer, Delivery, Ref
from .publishing import send
from .queue import Prepared, Queue

if TYPE_CHECKING:
    from .context import AsyncContext

log = logging.getLogger("rqueue")

T = TypeVar("T")


class PartitionedQueue:
    """A queue of ``partitions`` partitions on an asyncio client (see
    :class:`rqueue.PartitionedQueue`). Obtain one with
    :meth:`rqueue.aio.Client.queue`."""

    def __init__(self, client: AsyncContext, name: str, layout: Layout) -> None:
        self.client = client
        self.name = name
        self.partitions = check_partitions(layout.partitions)
        #: The stored layout this queue routes by (rqueue/placement.py), and each partition's hash-tag salt.
        self.layout = layout
        self.salts = layout.salts
        #: The partitions, as queues (``parts[i].partition == i``), under the hash tags they were placed at.
        self.parts = [Queue(client, name, i, salt) for i, salt in enumerate(layout.salts)]
        self._lock = threading.Lock()
        self._next = int(client.randomness.unit() * self.partitions)

    def __repr__(self) -> str:
        return f"rqueue.aio.PartitionedQueue({self.name!r}, partitions={self.partitions})"

    async def pause(self, group: str | None = None, mode: str = "hold") -> bool:
        """As :meth:`rqueue.PartitionedQueue.pause`, in every partition (one
        after the other); True when any partition changed."""
        return [await part.pause(group, mode) for part in self.parts].count(True) > 0

    async def resume(self, group: str | None = None) -> bool:
        """As :meth:`rqueue.PartitionedQueue.resume`, in every partition."""
        return [await part.resume(group) for part in self.parts].count(True) > 0

    async def placement(self, refresh: bool = False) -> PlacementReport:
        """As :meth:`rqueue.PartitionedQueue.placement`: where each partition
        lives, by the client's map of slots to nodes (``refresh`` reads the
        cluster's map first)."""
        if refresh:
            await self.client.refresh_topology()
        return queue_placements(self)

    async def settings(self) -> Settings:
        """The settings in force for this queue (the same for every partition)."""
        return await self.client.settings.resolve(self.name)

    def partition_for(self, key: str | None = None, id: str | None = None) -> int:
        """The partition a message with this routing ``key`` and ``id`` goes
        to (see :meth:`rqueue.PartitionedQueue.partition_for`)."""
        return SyncPartitionedQueue.partition_for(self, key, id)  # type: ignore[arg-type]  # the same fields

    # -- publishing ---------------------------------------------------------

    async def publish(
        self,
        payload: bytes,
        headers: Mapping[str, str] | None = None,
        id: str | None = None,
        delay: float | None = None,
        mandatory: bool = False,
        durable: bool = False,
        key: str | None = None,
        priority: int = 0,
        ttl: float | None = None,
    ) -> PublishResult:
        """As :meth:`rqueue.PartitionedQueue.publish`."""
        results = await self.publish_many(
            [payload],
            headers=[headers] if headers else None,
            ids=[id],
            delay=delay,
            mandatory=mandatory,
            durable=durable,
            keys=[key],
            priority=priority or None,
            ttl=ttl,
        )
        return results[0]

    async def publish_many(
        self,
        payloads: Sequence[bytes],
        headers: Mapping[str, str] | Sequence[Mapping[str, str] | None] | None = None,
        ids: Sequence[str | None] | None = None,
        delay: float | None = None,
        mandatory: bool = False,
        durable: bool = False,
        keys: Sequence[str | None] | None = None,
        priority: int | Sequence[int] | None = None,
        ttl: float | None = None,
    ) -> list[PublishResult]:
        """As :meth:`rqueue.PartitionedQueue.publish_many`; the partitions
        are written concurrently."""
        routed = route(payloads, headers, ids, keys, self.partition_for, priority=priority, ttl=ttl)
        settings = await self.settings()
        prepared = prepare_parts(
            self.parts, routed, payloads, delay, mandatory, durable, view=lambda part: Prepared(part, settings)
        )
        replies = await asyncio.gather(*(send(part, ready) for part, _, ready in prepared), return_exceptions=True)
        sent: list[tuple[Any, list[int], list[PublishResult] | Exception]] = []
        for (part, idx, _), got in zip(prepared, replies, strict=True):
            if isinstance(got, BaseException) and not isinstance(got, Exception):
                raise got
            sent.append((part, idx, got))
        return gather(routed.size, sent)

    # -- consuming ----------------------------------------------------------

    def consumer(
        self,
        group: str,
        name: str | None = None,
        prefetch: int | None = None,
        liveness: float | None = None,
        **settings: Any,
    ) -> PartitionedConsumer:
        """A member of ``group`` in every partition (see
        :meth:`rqueue.PartitionedQueue.consumer`); it joins on ``async with``
        or ``await c.join()``."""
        return PartitionedConsumer(self, group, name, prefetch, liveness, settings)

    # -- inspection and maintenance -----------------------------------------

    async def groups(self) -> list[str]:
        """Names of the groups of any partition, sorted."""
        return sorted({g for part in self.parts for g in await part.groups()})

    async def result(
        self,
        seq: int | str | PublishResult,
        timeout: float = 0.0,
        *,
        group: str | None = None,
        partition: int | None = None,
    ) -> Result:
        """As :meth:`rqueue.PartitionedQueue.result`."""
        if isinstance(seq, str) and partition is None:
            result_id(seq)
            for p in id_search_order(seq, self.partitions):
                if (await self.parts[p].status(seq)).seq:
                    partition = p
                    break
            else:
                raise unknown_id(self.name, seq)
        where = result_partition(self.name, self.partitions, seq, partition)
        found = await self.parts[where].result(seq, timeout, group=group)
        return dataclasses.replace(found, partition=where)

    # -- groups and retention (docs/retention.md) ---------------------------

    async def create_group(self, group: str, start: Position = "first") -> list[int]:
        """As :meth:`rqueue.PartitionedQueue.create_group`."""
        check_name("group", group)
        mode, value = partitioned_position_args(start)
        present = [group in await p.groups() for p in self.parts]
        check_partitioned_group(self.name, group, "create", present, [])

        async def create(p: Queue) -> int:
            return (await acmd.group_create(p.group_call(group), mode, value)).floor

        async def undo(p: Queue) -> None:
            await acmd.group_delete(p.group_call(group), False)

        return await self._each(group, "create", self.parts, create, undo)

    async def reset_group(self, group: str, to: Position, force: bool = False) -> list[GroupReset]:
        """As :meth:`rqueue.PartitionedQueue.reset_group`."""
        check_name("group", group)
        mode, value = partitioned_position_args(to)
        force = check.flag("force", force)
        present = [group in await p.groups() for p in self.parts]
        held = [] if force else await self._held(group, present)
        check_partitioned_group(self.name, group, "reset", present, held)

        async def reset(p: Queue) -> GroupReset:
            r = await acmd.group_reset(p.group_call(group), mode, value, force)
            return GroupReset(group, r.previous, r.floor, r.cancelled, p.partition)

        return await self._each(group, "reset", self.parts, reset)

    async def delete_group(self, group: str, force: bool = False) -> int:
        """As :meth:`rqueue.PartitionedQueue.delete_group`."""
        check_name("group", group)
        force = check.flag("force", force)
        present = [group in await p.groups() for p in self.parts]
        held = [] if force else await self._held(group, present)
        check_partitioned_group(self.name, group, "delete", present, held)
        has = [p for p, there in zip(self.parts, present, strict=True) if there]

        async def delete(p: Queue) -> int:
            return await acmd.group_delete(p.group_call(group), force)

        return sum(await self._each(group, "delete", has, delete))

    async def trim(self) -> list[Trimmed]:
        """As :meth:`rqueue.PartitionedQueue.trim`."""
        return [await part.trim() for part in self.parts]

    async def _held(self, group: str, present: list[bool]) -> list[int]:
        return [
            (await acmd.stats(p.group_call(group))).in_flight if there else 0
            for p, there in zip(self.parts, present, strict=True)
        ]

    async def _each(
        self,
        group: str,
        what: str,
        parts: list[Queue],
        apply: Callable[[Queue], Awaitable[T]],
        undo: Callable[[Queue], Awaitable[None]] | None = None,
    ) -> list[T]:
        """As :meth:`rqueue.PartitionedQueue._each`, awaited."""
        done: list[Queue] = []
        out = []
        for part in parts:
            try:
                out.append(await apply(part))
            except RQueueError as exc:
                back: list[int] = []
                for p in done:
                    if undo is None:
                        break
                    try:
                        await undo(p)
                        back.append(p.partition or 0)
                    except RQueueError as why:
                        log.warning("group %r: %s not undone in partition %s: %s", group, what, p.partition, why)
                left = [n for n in (p.partition or 0 for p in done) if n not in back]
                targets = [p.partition or 0 for p in parts]
                raise partly_done(undone(exc, what, group, back), what, group, left, targets) from None
            done.append(part)
        return out

    async def stats(self) -> QueueStats:
        """The figures of every partition, and their sums, and where each
        partition lives (``placement``), as :meth:`rqueue.PartitionedQueue.stats`."""
        return partitioned_stats(self, [await part.stats() for part in self.parts])

    async def peek(self, n: int = 10, after: int = 0) -> list[Message]:
        """As :meth:`rqueue.PartitionedQueue.peek`."""
        check_after(after)
        return oldest(n, [m for part in self.parts for m in await part.peek(n)])

    async def peek_group(self, group: str, n: int = 10) -> list[Message]:
        """As :meth:`rqueue.PartitionedQueue.peek_group`."""
        out: list[Message] = []
        for part in self.parts:
            if len(out) >= n:
                break
            out += await part.peek_group(group, n - len(out))
        return out

    async def purge(self, group: str | None = None) -> dict[str, int]:
        """As :meth:`rqueue.PartitionedQueue.purge`."""
        if group is not None and group not in await self.groups():
            raise InvalidInput(f"queue {self.name!r} has no group {group!r}")
        out: dict[str, int] = {}
        for part in self.parts:
            if group is not None and group not in await part.groups():
                continue
            for g, purged in (await part.purge(group)).items():
                out[g] = out.get(g, 0) + purged
        return out

    async def delete(self, force: bool = False) -> int:
        """As :meth:`rqueue.PartitionedQueue.delete`."""
        r = self.client.redis
        if not check.flag("force", force):
            held = sum([await acmd.in_flight(r, part.keys) for part in self.parts])
            if held:
                raise QueueInUse(self.name, held)
        deleted = sum([await part.delete(force=True) for part in self.parts])
        deleted += await acmd.delete_partitioning(r, self.client.prefix, self.name, Queue(self.client, self.name).keys)
        self.client.forget(self.parts[0].root)
        return deleted

    async def dead_letters(
        self,
        group: str | None = None,
        reason: str | None = None,
        seq_from: int | None = None,
        seq_to: int | None = None,
        limit: int | None = None,
    ) -> list[DeadLetter]:
        """As :meth:`rqueue.PartitionedQueue.dead_letters`."""
        out: list[DeadLetter] = []
        for part in self.parts:
            if (left := left_of(limit, len(out))) == 0:
                break
            out += of_partition(part.partition, await part.dead_letters(group, reason, seq_from, seq_to, left))
        return out

    async def replay_dead_letters(
        self,
        group: str | None = None,
        reason: str | None = None,
        seq_from: int | None = None,
        seq_to: int | None = None,
        limit: int | None = None,
        dry_run: bool = False,
    ) -> ReplayResult:
        """As :meth:`rqueue.PartitionedQueue.replay_dead_letters`."""
        total: ReplayResult | None = None
        for part in self.parts:
            if (left := left_of(limit, total.selected if total else 0)) == 0:
                break
            result = await part.replay_dead_letters(group, reason, seq_from, seq_to, left, dry_run)
            total = result if total is None else total.plus(result)
        assert total is not None
        return total

    replay = replay_dead_letters

    async def purge_dead_letters(
        self,
        group: str | None = None,
        reason: str | None = None,
        seq_from: int | None = None,
        seq_to: int | None = None,
        limit: int | None = None,
        *,
        dead_lettered_to: int | None = None,
    ) -> int:
        """As :meth:`rqueue.PartitionedQueue.purge_dead_letters`."""
        deleted = 0
        for part in self.parts:
            if (left := left_of(limit, deleted)) == 0:
                break
            deleted += await part.purge_dead_letters(
                group, reason, seq_from, seq_to, left, dead_lettered_to=dead_lettered_to
            )
        return deleted

    async def dead_letter_queue(self) -> PartitionedQueue:
        """The dead-letter queue, partitioned like this queue."""
        return PartitionedQueue(self.client, self.client.dead_letter_name(self.name), self.layout)

    @property
    def state_losses(self) -> list[StateLost | None]:
        """Per partition, the last loss of its state in Redis that this
        client's publishes saw, or None."""
        return [part.last_state_loss for part in self.parts]

    async def events_after(self, last_id: str, count: int = 100) -> list[dict[str, str]]:
        """As :meth:`rqueue.PartitionedQueue.events_after`."""
        return merged_events([(part.partition, await part.events_after(last_id, count)) for part in self.parts], count)

    async def events(self, count: int = 100) -> list[dict[str, str]]:
        """As :meth:`rqueue.PartitionedQueue.events`."""
        per_partition = [(part.partition, await part.events(count)) for part in self.parts]
        return merged_events(per_partition, count, newest=True)


class PartitionedConsumer(PartitionRouting):
    """A member of a group in every partition of a partitioned queue, on an
    asyncio client (see :class:`rqueue.PartitionedConsumer`)."""

    def __init__(
        self,
        queue: PartitionedQueue,
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
        self.consumers: list[Consumer] = [
            part.consumer(group, self.name, prefetch, liveness, **settings) for part in queue.parts
        ]
        self._next = 0
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"rqueue.aio.PartitionedConsumer(queue={self.queue.name!r}, group={self.group!r}, name={self.name!r})"

    @property
    def joins(self) -> int:
        return sum(c.joins for c in self.consumers)

    @property
    def last_settings(self) -> Settings:
        return self.consumers[0].last_settings

    async def settings(self) -> Settings:
        return await self.consumers[0].settings()

    async def join(self) -> PartitionedConsumer:
        """Joins the group in every partition (leaving those it joined when one fails)."""
        joined: list[Consumer] = []
        try:
            for c in self.consumers:
                await c.join()
                joined.append(c)
        except BaseException:
            for c in joined:
                await c.close()
            raise
        return self

    async def __aenter__(self) -> PartitionedConsumer:
        return await self.join()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def fetch(self, n: int = 1, timeout: float = 0.0) -> list[Delivery]:
        """As :meth:`rqueue.PartitionedConsumer.fetch`."""
        check.whole_number("n", n, 1, MAX_FETCH)
        check.seconds("timeout", timeout)
        clock, notifier = self.client.clock, self.client.notifier
        deadline = clock.monotonic() + timeout
        while True:
            since = (
                {
                    c.queue.keys.wake_channel: await notifier.generation(c.queue.keys.wake_channel)
                    for c in self.consumers
                }
                if timeout > 0
                else {}
            )
            out: list[Delivery] = []
            due: float | None = None  # the soonest a partition's waiting message falls due
            for c in self._order():
                try:
                    _, got, due_in = await c.ack_and_fetch([], n - len(out))
                    out += got
                    if due_in is not None:
                        due = due_in if due is None else min(due, due_in)
                except Exception as exc:
                    if not out:
                        raise
                    log.warning("fetch from %r failed (%s); returning what the other partitions gave", c.queue, exc)
                    break
                if len(out) >= n:
                    break
            remaining = deadline - clock.monotonic()
            if out or remaining <= 0:
                return out
            wait = min(remaining, IDLE_POLL_INTERVAL)
            await notifier.wait_any(since, wait if due is None else min(wait, due))

    async def ack_and_fetch(
        self, acks: Iterable[Ref], n: int, wait: float | None = None, may_wait: bool = False
    ) -> tuple[list[RQueueError | None], list[Delivery], float | None]:
        """As :meth:`rqueue.PartitionedConsumer.ack_and_fetch` (``wait`` is
        checked and not waited for, ``may_wait`` changes nothing)."""
        check.whole_number("n", n, 0)
        if wait is not None:
            check.seconds("wait", wait)
        by_part = self._split(acks)
        statuses: dict[int, RQueueError | None] = {}
        out: list[Delivery] = []
        due: list[float] = []
        for c in self._order():
            p = c.queue.partition
            mine = by_part.pop(p, [])
            want = max(0, n - len(out))
            if not mine and not want:
                continue
            got_statuses, got, due_in = await c.ack_and_fetch([d for _, d in mine], want)
            statuses.update(zip((i for i, _ in mine), got_statuses, strict=True))
            out += got
            if due_in is not None:
                due.append(due_in)
        return self._by_index(statuses), out, (min(due) if due and not out else None)

    async def ack(self, deliveries: Ref | Iterable[Ref], multiple: bool = False) -> None:
        """As :meth:`rqueue.PartitionedConsumer.ack`."""
        first: Exception | None = None
        for p, mine in self._split(refs_of(deliveries)).items():
            try:
                await self.consumers[p].ack([d for _, d in mine], multiple=multiple)
            except DeliveryError as exc:
                first = first or self._named(p, exc)
        if first is not None:
            raise first

    async def ack_available(self, deliveries: Iterable[Ref]) -> list[RQueueError | None]:
        statuses: dict[int, RQueueError | None] = {}
        for p, mine in self._split(refs_of(deliveries)).items():
            got = await self.consumers[p].ack_available([d for _, d in mine])
            statuses.update(zip((i for i, _ in mine), got, strict=True))
        return self._by_index(statuses)

    async def nack(self, delivery: Ref, delay: float | None = None, error: str = "", *, timed_out: bool = False) -> str:
        c, d = self._one(delivery)
        status: str = await c.nack(d, delay=delay, error=error, timed_out=timed_out)
        return status

    async def nack_available(
        self, deliveries: Iterable[Ref], delay: float | None = None, error: str = "", *, timed_out: bool = False
    ) -> list[str | RQueueError]:
        """As :meth:`rqueue.Consumer.nack_available`, a call per partition."""
        statuses: dict[int, str | RQueueError] = {}
        for p, mine in self._split(refs_of(deliveries)).items():
            refs = [d for _, d in mine]
            got = await self.consumers[p].nack_available(refs, delay, error, timed_out=timed_out)
            statuses.update(zip((i for i, _ in mine), got, strict=True))
        return self._by_index(statuses)

    async def ack_result(self, delivery: Ref, value: bytes | None, event: bool) -> None:
        """As :meth:`rqueue.Consumer.ack_result`, in the delivery's partition."""
        c, d = self._one(delivery)
        await c.ack_result(d, value, event)

    async def ack_results(self, items: Iterable[tuple[Ref, bytes]], event: bool) -> list[RQueueError | None]:
        """As :meth:`rqueue.Consumer.ack_results`, a call per partition."""
        items = list(items)
        statuses: dict[int, RQueueError | None] = {}
        for p, mine in self._split(ref for ref, _ in items).items():
            got = await self.consumers[p].ack_results([(d, items[i][1]) for i, d in mine], event)
            statuses.update(zip((i for i, _ in mine), got, strict=True))
        return self._by_index(statuses)

    def waits_on_wakes(self) -> bool:
        """See :meth:`rqueue.PartitionedConsumer.waits_on_wakes`."""
        return False

    async def end_waits(self) -> None:
        """Nothing: no consumer of a partitioned queue waits in Redis."""

    async def keep_failure(self, delivery: Delivery, reason: str, error: str) -> None:
        """As :meth:`rqueue.Consumer.keep_failure`, in the delivery's partition."""
        c, _ = self._one(delivery)
        await c.keep_failure(delivery, reason, error)

    nak = nack

    async def reject(self, delivery: Ref, requeue: bool = False, reason: str = "") -> None:
        c, d = self._one(delivery)
        await c.reject(d, requeue=requeue, reason=reason)

    async def term(self, delivery: Ref, reason: str = "") -> None:
        c, d = self._one(delivery)
        await c.term(d, reason)

    async def in_progress(self, deliveries: Ref | Iterable[Ref]) -> int:
        return max(
            [
                await self.consumers[p].in_progress([d for _, d in mine])
                for p, mine in self._split(refs_of(deliveries)).items()
            ]
        )

    async def in_progress_available(self, deliveries: Iterable[Ref]) -> list[RQueueError | None]:
        """As :meth:`rqueue.Consumer.in_progress_available`, a call per partition."""
        statuses: dict[int, RQueueError | None] = {}
        for p, mine in self._split(refs_of(deliveries)).items():
            got = await self.consumers[p].in_progress_available([d for _, d in mine])
            statuses.update(zip((i for i, _ in mine), got, strict=True))
        return self._by_index(statuses)

    async def heartbeat(self, running: Iterable[Ref], timeout: float, sync: bool = False) -> HeartbeatResult:
        """A heartbeat in every partition; the figures add up. A partition
        that fails is passed, and its failure raised once the others are
        beaten (:func:`rqueue.partitioned_consumer.graver`)."""
        by_part = self._split(running)
        results = []
        failure: Exception | None = None
        for c in self.consumers:
            mine = by_part.get(c.queue.partition or 0, [])
            try:
                results.append((mine, await c.heartbeat([d for _, d in mine], timeout, sync)))
            except Exception as exc:
                failure = graver(failure, exc, c.queue.partition or 0)
        if failure is not None:
            raise failure
        return self._summed(results)

    @property
    def state_epoch(self) -> int:
        return sum(c.state_epoch for c in self.consumers)

    def epoch_for(self, delivery: Delivery) -> int:
        """The state epoch ``delivery`` is judged by: that of its own
        partition's consumer (see :meth:`rqueue.PartitionedConsumer.epoch_for`)."""
        owner = delivery.consumer
        return owner.state_epoch if isinstance(owner, Consumer) else self.state_epoch

    @property
    def state_losses(self) -> list[StateLost | None]:
        return [c.last_state_loss for c in self.consumers]

    async def rejoin(self, removal: NotMember | None = None) -> None:
        """Joins again the groups of the partitions ``removal`` names (every one without)."""
        for c in self._rejoining(removal):
            await c.rejoin()

    async def close(self) -> int:
        """Leaves the group in every partition (each one, even when another
        fails; then the first error is raised); returns how many deliveries
        went back."""
        returned, first = 0, None
        for c in self.consumers:
            try:
                returned += await c.close()
            except Exception as exc:
                first = first or exc
        if first is not None:
            raise first
        return returned

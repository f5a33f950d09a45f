"""Partitioned queues: one queue spread over N partitions, so that a Redis
Cluster spreads its load over its shards.

Each partition is a queue of its own (its own seqs, ack floors, leases and
dead-letter queue) under its own hash tag ``{<name>/<partition>}``, so every
script still touches one slot and every guarantee of docs/guarantees.md
holds per partition. What spans partitions:

- Routing: a message goes to the partition of its ``key`` (the same key
  always goes to the same partition; it is no ordering key there, see
  docs/flow-control.md), else of its ``id`` (so that a duplicate meets the
  first copy), else round-robin.
- Groups: a consumer joins its group in every partition and fetches from
  them in turn, starting at a different partition each call, so no partition
  starves. Acks, nacks and the rest go to the partition of the delivery.
- max_inflight and prefetch hold per partition: a group of a queue with N
  partitions may have up to N x max_inflight deliveries in flight, and one
  consumer up to N x prefetch. Divide them by N for a total cap.
- Stats add up over the partitions (each partition's figures are listed too).

The number of partitions is set when the queue is first created
(``client.queue(name, partitions=N)``) and stored in Redis, so every process
finds the same layout; ``client.queue(name)`` returns the partitioned queue
from then on. It only grows (``client.grow_partitions``); where partitions
live is rqueue/placement.py.

Long because a partitioned queue offers every method of a queue that makes
sense across partitions, each spelled out over its partitions.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import threading
import zlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from . import validate as check
from .constants import MAX_PARTITIONS
from .engine import commands, store
from .errors import InvalidInput, QueueInUse, RQueueError, StateLost, Unroutable
from .names import check_name
from .partition_routing import gather, prepare_parts, route
from .partitioned_consumer import PartitionedConsumer
from .placement import Layout, queue_placements, seen_before_growth
from .publishing import PreparedPublish, send, watch_replies
from .queue import Queue
from .results import (
    ConsumerStats,
    DeadLetter,
    GroupReset,
    GroupStats,
    Message,
    PlacementReport,
    Progress,
    PublishResult,
    QueueStats,
    ReplayResult,
    Trimmed,
)
from .retention import (
    Position,
    after_publish,
    check_partitioned_group,
    partitioned_position_args,
    partly_done,
    undone,
)
from .settings import Settings
from .stored_results import Result, result_id, result_seq, unknown_id

if TYPE_CHECKING:
    from .protocols import QueueContext

log = logging.getLogger("rqueue")


def partition_of(key: str, partitions: int) -> int:
    """The partition of routing key ``key``: CRC-32 of its UTF-8 bytes, the
    same in every process and Python version (unlike ``hash()``)."""
    return zlib.crc32(key.encode("utf-8")) % partitions


def check_partitions(partitions: object) -> int:
    return check.whole_number("partitions", partitions, 1, MAX_PARTITIONS)


class PartitionedQueue:
    """A queue of ``partitions`` partitions. Obtain one with
    :meth:`rqueue.Client.queue` (``partitions=N`` creates it).

    It offers the methods of :class:`rqueue.Queue` that make sense across
    partitions; :attr:`parts` holds the partitions themselves (plain
    :class:`rqueue.Queue` objects) for anything else.
    """

    def __init__(
        self,
        client: QueueContext,
        name: str,
        partitions: int,
        salts: Sequence[int] | None = None,
        layout: Layout | None = None,
    ) -> None:
        self.client = client
        self.name = name
        self.partitions = check_partitions(partitions)
        #: Per partition, the salt of its hash tag (rqueue/placement.py; 0 = ``{<name>/<i>}``).
        self.salts = tuple(salts) if salts is not None else (0,) * partitions
        #: The stored layout this queue routes by (count, salts, last growth).
        self.layout = layout if layout is not None else Layout(self.partitions, self.salts)
        #: The partitions, as queues (``parts[i].partition == i``).
        self.parts = [Queue(client, name, i, salt) for i, salt in enumerate(self.salts)]
        self._lock = threading.Lock()
        # Producers start their round-robin at different partitions.
        self._next = int(client.randomness.unit() * partitions)

    def __repr__(self) -> str:
        return f"PartitionedQueue({self.name!r}, partitions={self.partitions})"

    def refresh(self) -> bool:
        """Takes up partitions added by a growth (read through the client's
        cache, so at most once a second); True when it grew."""
        layout = self.client.layout(self.parts[0].root)
        if layout.partitions <= self.partitions:
            return False
        with self._lock:
            if layout.partitions > self.partitions:
                self.parts = self.parts + [
                    Queue(self.client, self.name, i, layout.salts[i]) for i in range(self.partitions, layout.partitions)
                ]
                self.salts = layout.salts
                self.layout = layout
                self.partitions = layout.partitions
        return True

    def grow(self, partitions: int) -> PartitionedQueue:
        """Adds partitions, live, up to ``partitions`` in all (see
        :meth:`rqueue.Client.grow_partitions`); this queue routes over them
        at once."""
        self.client.grow_partitions(self.parts[0].root, partitions)
        self.refresh()
        return self

    def settings(self) -> Settings:
        """The settings in force for this queue (the same for every partition)."""
        return self.client.resolved_settings(self.name)

    # -- publishing ---------------------------------------------------------

    def partition_for(self, key: str | None = None, id: str | None = None) -> int:
        """The partition a message with this routing ``key`` and ``id``
        goes to; with neither, the next one round-robin."""
        if key is not None:
            return partition_of(key, self.partitions)
        if id is not None:
            return partition_of(id, self.partitions)
        with self._lock:
            self._next = (self._next + 1) % self.partitions
            return self._next

    def publish(
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
        """As :meth:`rqueue.Queue.publish`, to the partition of ``key`` (a
        str: the same key, the same partition; a routing key here, not an
        ordering key), else of ``id``, else the next one round-robin. The
        result's ``partition`` names it."""
        return self.publish_many(
            [payload],
            headers=[headers] if headers else None,
            ids=[id],
            delay=delay,
            mandatory=mandatory,
            durable=durable,
            keys=[key],
            priority=priority or None,
            ttl=ttl,
        )[0]

    def publish_many(
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
        """As :meth:`rqueue.Queue.publish_many`, each message routed as in
        :meth:`publish` (``keys``: one routing key or None per message).
        Every message is checked before anything is sent. The partitions
        are written in one pipelined round trip (one per node of a
        cluster); results come back in the order of ``payloads``."""
        routed = route(
            payloads, headers, ids, keys, self.partition_for, before=self.refresh, priority=priority, ttl=ttl
        )
        known = seen_before_growth(self, routed.routes, routed.keys, routed.ids, partition_of)
        prepared = prepare_parts(self.parts, routed, payloads, delay, mandatory, durable)
        return gather(routed.size, self._send_all(prepared), known)

    def _send_all(
        self, prepared: list[tuple[Queue, list[int], PreparedPublish]]
    ) -> list[tuple[Queue, list[int], list[PublishResult] | Exception]]:
        """Sends every partition's messages; per partition its results, or
        the error it gave (every partition is tried whatever the others did)."""
        out: list[tuple[Queue, list[int], list[PublishResult] | Exception]] = []
        if len(prepared) <= 1 or any(p.durable or len(p.calls) > 1 for _, _, p in prepared):
            # durable confirms wait per node; very large batches go as in Queue
            for part, idx, ready in prepared:
                try:
                    out.append((part, idx, send(part, ready)))
                except Exception as exc:
                    out.append((part, idx, exc))
            return out
        replies = commands.publish_each(self.client.scripts, [ready.calls[0] for _, _, ready in prepared], self.name)
        for (part, idx, ready), reply in zip(prepared, replies, strict=True):
            if isinstance(reply, Unroutable):
                # refused, nothing stored: that partition alone again, to go to the alternate queue
                try:
                    out.append((part, idx, send(part, ready)))
                except Exception as exc:
                    out.append((part, idx, exc))
            elif isinstance(reply, Exception):
                out.append((part, idx, reply))
            else:
                self.client.register(self.name)
                watch_replies(ready, [reply])
                out.append((part, idx, commands.publish_results([reply], part.partition)))
                after_publish(part, ready.settings)
        return out

    # -- consuming ----------------------------------------------------------

    def consumer(
        self,
        group: str,
        name: str | None = None,
        prefetch: int | None = None,
        liveness: float | None = None,
        **settings: Any,
    ) -> PartitionedConsumer:
        """Joins ``group`` in every partition as consumer ``name`` (see
        :meth:`rqueue.Queue.consumer`; prefetch holds per partition)."""
        return PartitionedConsumer(self, group, name, prefetch, liveness, settings)

    # -- inspection and maintenance -----------------------------------------

    def groups(self) -> list[str]:
        """Names of the groups of any partition, sorted."""
        return sorted({g for part in self.parts for g in part.groups()})

    def result(
        self,
        seq: int | str | PublishResult,
        timeout: float = 0.0,
        *,
        group: str | None = None,
        partition: int | None = None,
    ) -> Result:
        """As :meth:`rqueue.Queue.result`, in the partition that took the
        message: the one the PublishResult ``seq`` names, or ``partition``
        (a bare seq names a message of one partition only), or, for a
        message id, the partition whose de-duplication index knows it (the
        partition its id routes to is asked first)."""
        if isinstance(seq, str) and partition is None:
            result_id(seq)
            known = (p for p in id_search_order(seq, self.partitions) if self.parts[p].status(seq).seq)
            partition = next(known, None)
            if partition is None:
                raise unknown_id(self.name, seq)
        where = result_partition(self.name, self.partitions, seq, partition)
        return dataclasses.replace(self.parts[where].result(seq, timeout, group=group), partition=where)

    # -- groups and retention (docs/retention.md) ---------------------------

    def create_group(self, group: str, start: Position = "first") -> list[int]:
        """As :meth:`rqueue.Queue.create_group`, in every partition:
        "first", "last" or a time apply in each partition; a seq is refused
        (each partition has its own seqs: create the group in one
        partition's queue, ``parts[i]``, for that). Returns, per partition,
        the seq the group starts after. Refused before any partition
        changes when the group exists in any of them; a partition that
        refuses the position (a time older than it stores) has the group
        deleted again from those that created it."""
        check_name("group", group)
        mode, value = partitioned_position_args(start)
        check_partitioned_group(self.name, group, "create", [group in p.groups() for p in self.parts], [])
        return self._each(
            group,
            "create",
            lambda p: commands.group_create(p.group_call(group), mode, value).floor,
            # a partition refusing the position (a time older than it stores): the others' creates are undone
            undo=lambda p: commands.group_delete(p.group_call(group), False),
        )

    def reset_group(self, group: str, to: Position, force: bool = False) -> list[GroupReset]:
        """As :meth:`rqueue.Queue.reset_group`, in every partition (a seq is
        refused, as for :meth:`create_group`); one GroupReset per partition.
        Without ``force`` it is refused (GroupInUse), before any partition
        changes, while the group holds deliveries in any partition."""
        check_name("group", group)
        mode, value = partitioned_position_args(to)
        force = check.flag("force", force)
        present = [group in p.groups() for p in self.parts]
        check_partitioned_group(self.name, group, "reset", present, [] if force else self._held(group, present))

        def reset(p: Queue) -> GroupReset:
            r = commands.group_reset(p.group_call(group), mode, value, force)
            return GroupReset(group, r.previous, r.floor, r.cancelled, p.partition)

        return self._each(group, "reset", reset)

    def delete_group(self, group: str, force: bool = False) -> int:
        """As :meth:`rqueue.Queue.delete_group`, in every partition that has
        the group; how many deliveries were taken back in all. Without
        ``force`` refused (GroupInUse), before any partition changes, while
        the group holds deliveries in any partition."""
        check_name("group", group)
        force = check.flag("force", force)
        present = [group in p.groups() for p in self.parts]
        check_partitioned_group(self.name, group, "delete", present, [] if force else self._held(group, present))
        has = [p for p, there in zip(self.parts, present, strict=True) if there]
        return sum(self._each(group, "delete", lambda p: commands.group_delete(p.group_call(group), force), has))

    def trim(self) -> list[Trimmed]:
        """As :meth:`rqueue.Queue.trim`, one trim step in every partition."""
        return [part.trim() for part in self.parts]

    def _held(self, group: str, present: list[bool]) -> list[int]:
        return [
            commands.stats(p.group_call(group)).in_flight if there else 0
            for p, there in zip(self.parts, present, strict=True)
        ]

    def _each(self, group: str, what: str, apply: Any, parts: list[Queue] | None = None, undo: Any = None) -> list[Any]:
        """``apply`` to each partition in turn; on an error, ``undo`` (when
        given) in the partitions that had it applied, and the error names
        those it could not undo."""
        done: list[Queue] = []
        out = []
        todo = self.parts if parts is None else parts
        for part in todo:
            try:
                out.append(apply(part))
            except RQueueError as exc:
                back: list[int] = []
                for p in done:
                    if undo is None:
                        break
                    try:
                        undo(p)
                        back.append(p.partition or 0)
                    except RQueueError as why:
                        log.warning("group %r: %s not undone in partition %s: %s", group, what, p.partition, why)
                left = [n for n in (p.partition or 0 for p in done) if n not in back]
                targets = [p.partition or 0 for p in todo]
                raise partly_done(undone(exc, what, group, back), what, group, left, targets) from None
            done.append(part)
        return out

    def placement(self, refresh: bool = False) -> PlacementReport:
        """Where each partition lives: its hash tag, slot and the primary
        serving it (by the client's map of slots to nodes; ``refresh``
        reads the map from the cluster first). Moves nothing."""
        if refresh:
            self.client.refresh_topology()
        return queue_placements(self)

    def stats(self) -> QueueStats:
        """The figures of every partition, and their sums, and where each
        partition lives (``placement``)."""
        self.refresh()
        return partitioned_stats(self, [part.stats() for part in self.parts])

    def peek(self, n: int = 10, after: int = 0) -> list[Message]:
        """Up to ``n`` stored messages, oldest publish first, over every
        partition (each Message's seq is a seq of its partition)."""
        check_after(after)
        return oldest(n, [m for part in self.parts for m in part.peek(n)])

    def peek_group(self, group: str, n: int = 10) -> list[Message]:
        """The next messages ``group`` would be offered, partition by
        partition (see :meth:`rqueue.Queue.peek_group`)."""
        out: list[Message] = []
        for part in self.parts:
            if len(out) >= n:
                break
            out += part.peek_group(group, n - len(out))
        return out

    def purge(self, group: str | None = None, progress: Progress | None = None) -> dict[str, int]:
        """As :meth:`rqueue.Queue.purge`, in every partition; counts add up."""
        if group is not None and group not in self.groups():
            raise InvalidInput(f"queue {self.name!r} has no group {group!r}")
        out: dict[str, int] = {}
        for part in self.parts:
            if group is not None and group not in part.groups():
                continue
            for g, purged in part.purge(group, progress).items():
                out[g] = out.get(g, 0) + purged
        return out

    def pause(self, group: str | None = None, mode: str = "hold") -> bool:
        """As :meth:`rqueue.Queue.pause`, in every partition (one after the
        other: not one atomic step); True when any partition changed."""
        return [part.pause(group, mode) for part in self.parts].count(True) > 0

    def resume(self, group: str | None = None) -> bool:
        """As :meth:`rqueue.Queue.resume`, in every partition."""
        return [part.resume(group) for part in self.parts].count(True) > 0

    def delete(self, force: bool = False) -> int:
        """Deletes every partition and the record of the partitioning (see
        :meth:`rqueue.Queue.delete`: refused while deliveries are in flight
        in any partition, unless ``force``); returns how many keys were
        deleted."""
        if not check.flag("force", force):
            held = sum(store.in_flight(self.client.redis, part.keys) for part in self.parts)
            if held:
                raise QueueInUse(self.name, held)
        deleted = sum(part.delete(force=True) for part in self.parts)
        deleted += store.delete_partitioning(
            self.client.redis, self.client.prefix, self.name, Queue(self.client, self.name).keys
        )
        self.client.forget(self.parts[0].root)
        return deleted

    def dead_letters(
        self,
        group: str | None = None,
        reason: str | None = None,
        seq_from: int | None = None,
        seq_to: int | None = None,
        limit: int | None = None,
    ) -> list[DeadLetter]:
        """Dead letters of every partition (each with its ``partition``), by
        partition, oldest first; ``limit`` counts over all of them."""
        out: list[DeadLetter] = []
        for part in self.parts:
            if (left := left_of(limit, len(out))) == 0:
                break
            out += of_partition(part.partition, part.dead_letters(group, reason, seq_from, seq_to, left))
        return out

    def replay_dead_letters(
        self,
        group: str | None = None,
        reason: str | None = None,
        seq_from: int | None = None,
        seq_to: int | None = None,
        limit: int | None = None,
        dry_run: bool = False,
        progress: Progress | None = None,
    ) -> ReplayResult:
        """As :meth:`rqueue.Queue.replay_dead_letters`, partition by
        partition (each dead letter goes back to its own partition)."""
        total: ReplayResult | None = None
        for part in self.parts:
            if (left := left_of(limit, total.selected if total else 0)) == 0:
                break
            result = part.replay_dead_letters(group, reason, seq_from, seq_to, left, dry_run, progress)
            total = result if total is None else total.plus(result)
        assert total is not None
        return total

    def purge_dead_letters(
        self,
        group: str | None = None,
        reason: str | None = None,
        seq_from: int | None = None,
        seq_to: int | None = None,
        limit: int | None = None,
        progress: Progress | None = None,
        *,
        dead_lettered_to: int | None = None,
    ) -> int:
        """Deletes the selected dead letters of every partition; returns how many."""
        deleted = 0
        for part in self.parts:
            if (left := left_of(limit, deleted)) == 0:
                break
            deleted += part.purge_dead_letters(
                group, reason, seq_from, seq_to, left, progress, dead_lettered_to=dead_lettered_to
            )
        return deleted

    @property
    def dead_letter_queue(self) -> PartitionedQueue:
        """The dead-letter queue, partitioned like this queue (each
        partition's dead letters stay in that partition's slot)."""
        return PartitionedQueue(
            self.client, self.client.dead_letter_name(self.name), self.partitions, self.salts, self.layout
        )

    @property
    def state_losses(self) -> list[StateLost | None]:
        """Per partition, the last loss of its state in Redis that this
        client's publishes saw, or None (see
        :attr:`rqueue.Queue.last_state_loss`)."""
        return [part.last_state_loss for part in self.parts]

    def events_after(self, last_id: str, count: int = 100) -> list[dict[str, str]]:
        """Events newer than the stream id ``last_id`` ("0" for all) over
        every partition, oldest first, each with its ``partition``."""
        return merged_events([(part.partition, part.events_after(last_id, count)) for part in self.parts], count)

    def events(self, count: int = 100) -> list[dict[str, str]]:
        """The newest ``count`` events over every partition, oldest first,
        each with its ``partition``."""
        return merged_events([(part.partition, part.events(count)) for part in self.parts], count, newest=True)


def left_of(limit: int | None, used: int) -> int | None:
    """What ``limit`` leaves once ``used`` are taken: None for no limit, 0
    when nothing is left (the partitions after it are not asked)."""
    return None if limit is None else max(0, limit - used)


def of_partition(partition: int | None, dead: list[DeadLetter]) -> list[DeadLetter]:
    return [dataclasses.replace(d, partition=partition) for d in dead]


def check_after(after: int) -> None:
    if after != 0:
        raise InvalidInput(f"after={after!r}: seqs are per partition; peek one partition with .parts[i].peek()")


def oldest(n: int, messages: list[Message]) -> list[Message]:
    """The ``n`` oldest of the partitions' messages, by publish time."""
    return heapq.nsmallest(n, messages, key=lambda m: (m.published_ms, m.seq))


def partitioned_stats(queue: Any, parts: list[QueueStats]) -> QueueStats:
    """The figures of partitioned ``queue`` (sync or asyncio) from its
    partitions' figures ``parts``: their sums, and where each partition
    lives (``placement``, by the client's map of slots to nodes)."""
    return dataclasses.replace(summed_stats(queue.name, parts), placement=queue_placements(queue).placement)


def summed_stats(name: str, parts: list[QueueStats]) -> QueueStats:
    """The figures of queue ``name`` from its partitions' figures."""
    groups = [
        sum_groups(group, [g for s in parts for g in s.groups if g.name == group])
        for group in sorted({g.name for s in parts for g in s.groups})
    ]
    return QueueStats(
        name,
        sum(s.last_seq for s in parts),
        sum(s.depth for s in parts),
        sum(s.scheduled for s in parts),
        sum(s.dead_letters for s in parts),
        groups,
        parts,
        paused=next((s.paused for s in parts if s.paused), ""),
    )


def merged_events(
    per_partition: list[tuple[int | None, list[dict[str, str]]]], count: int, newest: bool = False
) -> list[dict[str, str]]:
    """The partitions' events, each with its ``partition``, in time order:
    the first ``count`` (the last ``count`` with ``newest``)."""
    merged = sorted(({**e, "partition": str(p)} for p, events in per_partition for e in events), key=event_order)
    return merged[-count:] if newest else merged[:count]


def event_order(event: dict[str, str]) -> tuple[int, ...]:
    """Stream ids ("<ms>-<n>") of different partitions, in time order."""
    return tuple(int(x) for x in event["id"].split("-")) + (int(event["partition"]),)


def sum_groups(name: str, groups: list[GroupStats]) -> GroupStats:
    """One group's figures over every partition: counts add up; the ack
    floor and cursor are sums of per-partition seqs (messages settled and
    read); the oldest lease is the oldest of all."""
    ages = [g.oldest_lease_age_ms for g in groups if g.oldest_lease_age_ms is not None]
    members: dict[str, ConsumerStats] = {}
    for g in groups:
        for c in g.consumers:
            seen = members.get(c.name)
            if seen is None:
                members[c.name] = c
            else:
                beats = [b for b in (seen.last_heartbeat_ms, c.last_heartbeat_ms) if b is not None]
                idles = [i for i in (seen.idle_ms, c.idle_ms) if i is not None]
                members[c.name] = ConsumerStats(
                    c.name, seen.held + c.held, max(beats) if beats else None, min(idles) if idles else None
                )
    counted = {
        f.name: sum(getattr(g, f.name) for g in groups)
        for f in dataclasses.fields(GroupStats)
        if f.name not in ("name", "oldest_lease_age_ms", "consumers", "paused")
    }
    return GroupStats(
        name=name,
        paused=any(g.paused for g in groups),
        oldest_lease_age_ms=max(ages) if ages else None,
        consumers=sorted(members.values(), key=lambda c: c.name),
        **counted,
    )


def result_partition(name: str, partitions: int, seq: Any, partition: int | None) -> int:
    """The partition whose result of ``seq`` a partitioned queue's result()
    reads: the PublishResult's, or ``partition``; InvalidInput when neither
    names one, or they differ."""
    if isinstance(seq, PublishResult):
        result_seq(name, seq)  # one the alternate queue took is that queue's to answer for
    named = seq.partition if isinstance(seq, PublishResult) else None
    if partition is not None:
        check.whole_number("partition", partition, 0)
        if partition >= partitions:
            raise InvalidInput(f"partition {partition} is not one of queue {name!r} (it has {partitions})")
        if named is not None and named != partition:
            raise InvalidInput(f"the PublishResult names partition {named}, not partition={partition}")
        return partition
    if named is None:
        raise InvalidInput(
            f"queue {name!r} is partitioned: a seq names a message of one partition; pass the PublishResult "
            "publish returned, the message's id, or partition="
        )
    if named >= partitions:
        raise InvalidInput(f"partition {named} is not one of queue {name!r} (it has {partitions})")
    return named


def id_search_order(msg_id: str, partitions: int) -> list[int]:
    """The partitions to look for a message id in: the one the id routes
    to first (where it went unless a key routed it), then the others."""
    first = partition_of(msg_id, partitions)
    return [first, *(p for p in range(partitions) if p != first)]

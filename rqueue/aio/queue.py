"""Queues of an asyncio client: publishing, figures, purging, dead letters
and consumers, awaitable. Messages are checked and encoded by the sync
code (rqueue.publishing.prepare), the replies judged by its functions and
parsed by the engine's shared parsers, the dead letters selected and
counted by rqueue.deadletters: only the I/O is this module's.

Long because it is the awaitable twin of rqueue.queue, method for method
(publishing, groups and their positions, dead letters, results, status,
figures), each a short one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from .. import validate as check
from ..constants import PURGE_BATCH
from ..deadletters import PAGE, REPLAY_BATCH, Selection, by_group, replay_batch, selected, tally
from ..engine import async_commands as acmd
from ..engine.keys import QueueKeys, partitions_key, queue_base
from ..engine.record import decode_record
from ..errors import InvalidInput, InvalidName, InvalidSetting, QueueInUse, QueuePartitioned, ResultTimeout, StateLost
from ..events import EventKind
from ..names import check_message_id, check_name, check_queue_name
from ..placement import Layout
from ..publishing import prepare
from ..queue import CLUSTER_DEAD_LETTER, PARTITION_DEAD_LETTER, SELF_DEAD_LETTER
from ..results import DeadLetter, GroupReset, Message, MessageStatus, PublishResult, QueueStats, ReplayResult, Trimmed
from ..retention import Position, position_args
from ..settings import DEAD_LETTER_MODES, Settings
from ..stored_results import FIRST_POLL as FIRST_RESULT_POLL
from ..stored_results import LAST_POLL as LAST_RESULT_POLL
from ..stored_results import (
    Result,
    asked,
    judged,
    result_group,
    result_id,
    unknown_id,
)
from ..tracing import sending
from ..waiting import FIRST_POLL, LAST_POLL, check_wait, groups_to_wait_for, not_settled, waited_for
from .consumer import Consumer
from .publishing import send
from .publishing import trim as trim_step

if TYPE_CHECKING:
    from ..protocols import QueueLike
    from .context import AsyncContext


class Prepared:
    """What rqueue.publishing.prepare reads of a queue, with its settings
    already read (prepare itself sends nothing)."""

    def __init__(self, queue: Queue, settings: Settings) -> None:
        self.name = queue.name
        self.keys = queue.keys
        self.client = queue.client
        self._settings = settings

    def settings(self) -> Settings:
        return self._settings


class Queue:
    """A named queue (or one partition of a partitioned queue) of an asyncio
    client. Obtain one with :meth:`rqueue.aio.Client.queue`."""

    def __init__(self, client: AsyncContext, name: str, partition: int | None = None, salt: int = 0) -> None:
        check_queue_name(name, client.dlq_prefix, client.dlq_suffix)
        root, depth = name, 0
        pre, suf = client.dlq_prefix, client.dlq_suffix
        while root.startswith(pre) and root.endswith(suf) and len(root) > len(pre) + len(suf):
            root, depth = root[len(pre) : len(root) - len(suf)], depth + 1
        if root.startswith(pre) and root.endswith(suf):
            raise InvalidName("queue", name, "is only the dead-letter prefix and suffix")
        self.client = client
        self.name = name
        self.root = root
        #: None, or which partition of a partitioned queue this is.
        self.partition = partition
        #: Which hash tag a partition was placed under (rqueue/placement.py).
        self.salt = salt
        self.keys = QueueKeys(queue_base(client.prefix, root, depth, partition, salt), client.log_layout)
        self._plain_checked = partition is not None

    def __repr__(self) -> str:
        if self.partition is not None:
            return f"rqueue.aio.Queue({self.name!r}, partition={self.partition})"
        return f"rqueue.aio.Queue({self.name!r})"

    async def check_plain(self) -> None:
        """Refuses with QueuePartitioned, once per handle, a group operation
        on a queue partitioned since this client read the partitionings
        (another process partitioned it); the client learns it, so that its
        next ``queue(name)`` is the partitioned one. A publish and a join
        need no such read: their scripts refuse the partitioned name."""
        if self._plain_checked:
            return
        r, prefix = self.client.redis, self.client.prefix
        raw = await acmd.guarded(lambda: r.hget(partitions_key(prefix), self.root))
        if raw is not None:
            text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else str(raw)
            layout = Layout.parse(text, f"{partitions_key(prefix)}[{self.root}]")
            self.client.learn_partitions(self.root, layout)
            raise QueuePartitioned(self.name, text)
        self._plain_checked = True

    async def settings(self) -> Settings:
        """The settings in force for this queue."""
        return await self.client.settings.resolve(self.name)

    async def dead_letter_queue(self) -> Queue:
        """The queue that receives this queue's dead letters."""
        target = (await self.settings()).dead_letter
        if target in DEAD_LETTER_MODES or self.partition is not None:
            return Queue(self.client, self.client.dead_letter_name(self.name), self.partition, self.salt)
        return Queue(self.client, target)

    def group_keys(self, group: str, settings: Settings) -> list[str]:
        """KEYS of the group scripts for ``group`` under ``settings``."""
        target = settings.dead_letter
        if target in DEAD_LETTER_MODES:
            return self.keys.group(group).as_list()
        if self.client.cluster:
            raise InvalidSetting("dead_letter", target, CLUSTER_DEAD_LETTER)
        if self.partition is not None:
            raise InvalidSetting("dead_letter", target, PARTITION_DEAD_LETTER)
        if target == self.name:
            raise InvalidSetting("dead_letter", target, SELF_DEAD_LETTER)
        return self.keys.group(group, Queue(self.client, target).keys).as_list()

    def group_call(self, group: str, settings: Settings | None = None, consumer: str = "") -> acmd.AsyncGroupCall:
        settings = settings if settings is not None else Settings()
        c = self.client
        return acmd.AsyncGroupCall.of(
            c.scripts, c.clock, c.randomness, self.group_keys(group, settings), self.name, self.keys.base, group,
            consumer, settings,
        )  # fmt: skip

    # -- publishing ---------------------------------------------------------

    async def publish(
        self,
        payload: bytes,
        headers: Mapping[str, str] | None = None,
        id: str | None = None,
        delay: float | None = None,
        mandatory: bool = False,
        durable: bool = False,
        priority: int = 0,
        ttl: float | None = None,
        key: str | None = None,
    ) -> PublishResult:
        """Appends one message; returns once Redis has applied it (see
        :meth:`rqueue.Queue.publish`)."""
        results = await self.publish_many(
            [payload],
            headers=[headers] if headers else None,
            ids=[id],
            delay=delay,
            mandatory=mandatory,
            durable=durable,
            priority=priority or None,
            ttl=ttl,
            key=key,
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
        priority: int | Sequence[int] | None = None,
        ttl: float | None = None,
        key: str | Sequence[str | None] | None = None,
    ) -> list[PublishResult]:
        """Appends many messages, in order, checked before anything is sent
        (see :meth:`rqueue.Queue.publish_many`; ``durable``: the client's
        durable_replicas and durable_timeout, as the sync client's)."""
        settings = self.client.settings.fresh(self.name) or await self.settings()
        with sending(self.name, payloads) as trace:
            view = cast("QueueLike", Prepared(self, settings))
            prepared = prepare(
                view,
                payloads,
                headers,
                ids,
                delay,
                mandatory,
                durable,
                trace=trace,
                priority=priority,
                ttl=ttl,
                key=key,
            )
            return await send(self, prepared) if prepared is not None else []

    # -- consuming ----------------------------------------------------------

    def consumer(
        self,
        group: str,
        name: str | None = None,
        prefetch: int | None = None,
        liveness: float | None = None,
        **settings: Any,
    ) -> Consumer:
        """A member ``name`` of ``group`` (see :meth:`rqueue.Queue.consumer`).
        It joins when entered (``async with q.consumer(...) as c``) or on
        ``await c.join()``, and leaves on exit or ``await c.close()``."""
        if prefetch is not None:
            settings["prefetch"] = prefetch
        return Consumer(self, group, name, settings, liveness)

    # -- inspection ---------------------------------------------------------

    async def groups(self) -> list[str]:
        """Names of the queue's groups, sorted."""
        return await acmd.group_names(self.client.redis, self.keys)

    async def result(self, seq: int | str | PublishResult, timeout: float = 0.0, *, group: str | None = None) -> Result:
        """See :meth:`rqueue.Queue.result`: waits up to ``timeout`` seconds
        for the stored outcome of message ``seq`` for ``group`` (the only
        group when None); raises ResultTimeout."""
        if isinstance(seq, str):
            found_seq = (await self.status(result_id(seq))).seq
            if not found_seq:
                raise unknown_id(self.name, seq)
            seq = found_seq
        seq, published = asked(self.name, seq)
        timeout = check.seconds("timeout", timeout)
        if group is not None:
            check_name("group", group)
        clock = self.client.clock
        deadline = clock.monotonic() + timeout
        pause = FIRST_RESULT_POLL
        chosen = None
        while True:
            if chosen is None:  # until the queue has a group (a worker joined): then its result is the one
                groups = await self.groups()
                chosen = result_group(self.name, group, groups)
            # Without a group yet, a PublishResult's incarnation still tells
            # whether Redis lost the message (ResultLost), so it is read.
            if chosen is not None or published is not None:
                raw, incarnation = await acmd.read_result(self.client.redis, self.keys, seq, chosen)
                found = judged(self.name, seq, published, chosen, groups, raw, incarnation)
                if found is not None:
                    return found
                if not groups:
                    chosen = None  # a named group with no result yet: its worker may still join
            left = deadline - clock.monotonic()
            if left <= 0:
                raise ResultTimeout(self.name, seq, timeout, group if group is not None else chosen)
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 1.5, LAST_RESULT_POLL)

    async def peek(self, n: int = 10, after: int = 0) -> list[Message]:
        """Up to ``n`` stored messages with seq > ``after``, oldest first."""
        check.whole_number("n", n, 1)
        check.whole_number("after", after, 0)
        return [
            self._message(seq, rec) for seq, rec in await acmd.records_after(self.client.redis, self.keys, after, n)
        ]

    async def peek_group(self, group: str, n: int = 10) -> list[Message]:
        """The next ``n`` messages ``group`` would be offered, without
        claiming them (see :meth:`rqueue.Queue.peek_group`)."""
        check_name("group", group)
        check.whole_number("n", n, 1)
        r = self.client.redis
        if not await acmd.has_group(r, self.keys, group):
            raise InvalidInput(f"queue {self.name!r} has no group {group!r}")
        ready, cursor = await acmd.group_position(r, self.keys, group, n)
        out = []
        for seq in ready:
            rec = await acmd.record(r, self.keys, seq)
            if rec is not None:
                out.append(self._message(seq, rec))
        if len(out) < n and cursor < await acmd.last_seq(r, self.keys):
            out += await self.peek(n - len(out), after=cursor)
        return out[:n]

    def _message(self, seq: int, rec: bytes) -> Message:
        published, headers, data = decode_record(rec, f"{self.keys.msgs}[{seq}]")
        return Message(seq, data, headers, published)

    async def status(self, id: str | None = None, *, seq: int | None = None) -> MessageStatus:
        """What became of one message (see :meth:`rqueue.Queue.status`)."""
        if (id is None) == (seq is None):
            raise InvalidInput("give a message id or seq=, not both and not neither")
        if id is not None:
            check_message_id(id)
        if seq is not None:
            check.whole_number("seq", seq, 1)
        client = self.client
        return await acmd.status(client.scripts, self.keys, client.clock.script_now(), id, seq, await self.groups())

    async def stats(self) -> QueueStats:
        """Depth, schedule, dead letters and per-group figures."""
        groups = [await acmd.stats(self.group_call(g)) for g in await self.groups()]
        now = self.client.clock.script_now()
        dead = await self.dead_letter_queue()
        last, depth, scheduled, dead_count = await acmd.queue_figures(
            self.client.redis, self.keys, dead.keys, int(now) if now else None
        )
        paused = await acmd.pause_state(self.client.redis, self.keys)
        return QueueStats(self.name, last, depth, scheduled, dead_count, groups, paused=paused)

    async def pause(self, group: str | None = None, mode: str = "hold") -> bool:
        """As :meth:`rqueue.Queue.pause`: pauses ``group``, or the queue
        (``mode`` "refuse" or "hold") when None; False when it was already so."""
        if group is not None:
            check_name("group", group)
        mode = check.pause_mode(mode)
        record, now = await self._pause_event()
        return (await acmd.pause(self.client.scripts, self.keys, group, True, mode, self.name, record, now)).changed

    async def resume(self, group: str | None = None) -> bool:
        """As :meth:`rqueue.Queue.resume`; False when it was not paused."""
        if group is not None:
            check_name("group", group)
        record, now = await self._pause_event()
        return (await acmd.pause(self.client.scripts, self.keys, group, False, "", self.name, record, now)).changed

    async def _pause_event(self) -> tuple[bool, str]:
        """See :meth:`rqueue.Queue._pause_event`."""
        return EventKind.PAUSED.value in (await self.settings()).events, self.client.clock.script_now()

    # -- groups and retention (docs/retention.md) ---------------------------

    async def create_group(self, group: str, start: Position = "first") -> int:
        """As :meth:`rqueue.Queue.create_group`: the seq the group starts after."""
        check_name("group", group)
        mode, value = position_args(start)
        await self.check_plain()
        return (await acmd.group_create(self.group_call(group), mode, value)).floor

    async def reset_group(self, group: str, to: Position, force: bool = False) -> GroupReset:
        """As :meth:`rqueue.Queue.reset_group`."""
        check_name("group", group)
        mode, value = position_args(to)
        force = check.flag("force", force)
        await self.check_plain()
        reply = await acmd.group_reset(self.group_call(group), mode, value, force)
        return GroupReset(group, reply.previous, reply.floor, reply.cancelled, self.partition)

    async def delete_group(self, group: str, force: bool = False) -> int:
        """As :meth:`rqueue.Queue.delete_group`: how many deliveries were taken back."""
        check_name("group", group)
        force = check.flag("force", force)
        await self.check_plain()
        return await acmd.group_delete(self.group_call(group), force)

    async def trim(self) -> Trimmed:
        """As :meth:`rqueue.Queue.trim`: one trim step now (publishers run
        them by themselves)."""
        reply = await trim_step(self)
        return Trimmed(reply.retained, reply.trimmed, reply.passed)

    async def events(self, count: int = 100) -> list[dict[str, str]]:
        """The newest ``count`` events, oldest first (see :meth:`rqueue.Queue.events`)."""
        return await acmd.newest_events(self.client.redis, self.keys, check.whole_number("count", count, 1))

    async def events_after(self, last_id: str, count: int = 100) -> list[dict[str, str]]:
        """Events newer than the stream id ``last_id`` ("0" for all), oldest first."""
        return await acmd.events_after(self.client.redis, self.keys, last_id, count)

    @property
    def last_state_loss(self) -> StateLost | None:
        """The last loss of this queue's state in Redis that this client's
        publishes saw, or None (see :attr:`rqueue.Queue.last_state_loss`)."""
        return self.client.state_watch(self.name, self.keys).last_loss

    # -- maintenance --------------------------------------------------------

    async def purge(self, group: str | None = None) -> dict[str, int]:
        """Settles, as purged, every message not in flight (see :meth:`rqueue.Queue.purge`)."""
        names = await self.groups()
        if group is not None:
            check_name("group", group)
            if group not in names:
                raise InvalidInput(f"queue {self.name!r} has no group {group!r}")
            names = [group]
        if not names:
            return {"": await acmd.purge_records(self.client.redis, self.keys, PURGE_BATCH)}
        out: dict[str, int] = {}
        for g in names:
            out[g] = 0
            call = self.group_call(g)
            while True:
                reply = await acmd.purge(call, PURGE_BATCH)
                out[g] += reply.purged
                if not reply.more:
                    break
        return out

    async def delete(self, force: bool = False) -> int:
        """Deletes the queue: messages, groups, dead-letter queue and events
        (see :meth:`rqueue.Queue.delete`); refused with QueueInUse while
        deliveries are in flight, unless ``force``. Returns how many keys
        were deleted."""
        r = self.client.redis
        force = check.flag("force", force)
        # A trim step this client's publishes left running would store the
        # queue's retention in a meta hash of its own after the delete.
        await self.client.background_done()
        if not force and (held := await acmd.in_flight(r, self.keys)):
            raise QueueInUse(self.name, held)
        deleted = await acmd.delete_queue(r, self.keys, self.client.prefix, self.name)
        self.client.forget(self.name)
        # Its next incarnation is no loss to this client.
        self.client.state_watch(self.name, self.keys).forget()
        return deleted

    async def settle_through(self, group: str, seq: int) -> int:
        """Settles, for ``group``, every message up to ``seq`` that is not in
        flight (see :meth:`rqueue.Queue.settle_through`); how many."""
        check_name("group", group)
        check.whole_number("seq", seq, 0)
        if group not in await self.groups():
            raise InvalidInput(f"queue {self.name!r} has no group {group!r}")
        call = self.group_call(group)
        total, after = 0, 0
        while True:
            reply = await acmd.settle_to(call, seq, after, PURGE_BATCH)
            total += reply.settled
            if not reply.more:
                return total
            after = reply.reached

    async def wait_settled(self, group: str | None = None, timeout: float | None = None) -> dict[str, int]:
        """Waits, without blocking the loop, until ``group`` (every group
        when None) has settled every message published before the call
        (see :meth:`rqueue.Queue.wait_settled`)."""
        check_wait(group, timeout)
        clock = self.client.clock
        deadline = None if timeout is None else clock.monotonic() + timeout
        groups = groups_to_wait_for(self.name, group, await self.groups())
        last = await acmd.last_seq(self.client.redis, self.keys)
        targets = {(0, g): last for g in groups}
        floors = dict.fromkeys(targets, 0)
        pending = [key for key, target in targets.items() if target > 0]
        pause = FIRST_POLL
        while True:
            for key in list(pending):
                floors[key] = (await acmd.stats(self.group_call(key[1]))).ack_floor
                if floors[key] >= targets[key]:
                    pending.remove(key)
            if not pending:
                return waited_for(targets, groups)
            left = None if deadline is None else deadline - clock.monotonic()
            if left is not None and left <= 0:
                raise not_settled(self.name, floors, targets, pending, timeout)
            await asyncio.sleep(pause if left is None else min(pause, left))
            pause = min(pause * 1.5, LAST_POLL)

    # -- dead letters -------------------------------------------------------

    async def dead_letters(
        self,
        group: str | None = None,
        reason: str | None = None,
        seq_from: int | None = None,
        seq_to: int | None = None,
        limit: int | None = None,
    ) -> list[DeadLetter]:
        """Dead letters of this queue, oldest first, filtered as
        :meth:`rqueue.Queue.dead_letters`."""
        return await self._dead_letters(Selection(group, reason, seq_from, seq_to, limit))

    async def _dead_letters(self, selection: Selection) -> list[DeadLetter]:
        dlq = await self.dead_letter_queue()
        after, out = 0, list[DeadLetter]()
        while selection.limit is None or len(out) < selection.limit:
            page = await dlq.peek(PAGE, after=after)
            if not page:
                break
            out += selected(self.name, selection, page, len(out))
            after = page[-1].seq
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
        """Returns the selected dead letters to the group that dead-lettered
        each, exactly once (see :meth:`rqueue.Queue.replay_dead_letters`)."""
        chosen = await self._dead_letters(Selection(group, reason, seq_from, seq_to, limit))
        result = ReplayResult(selected=len(chosen), dry_run=dry_run)
        groups = by_group(chosen)
        if dry_run:
            result.by_group = {g: len(s) for g, s in groups.items()}
            return result
        settings = await self.settings()
        for g, letters in groups.items():
            call = self.group_call(g, settings)
            for start in range(0, len(letters), REPLAY_BATCH):
                batch, result_keys = replay_batch(self.keys, g, letters[start : start + REPLAY_BATCH])
                tally(result, g, await acmd.replay(call, batch, result_keys))
        return result

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
        """As :meth:`rqueue.Queue.purge_dead_letters`."""
        dlq = await self.dead_letter_queue()
        selection = Selection(group, reason, seq_from, seq_to, limit, dead_lettered_to)
        chosen = [d.dlq_seq for d in await self._dead_letters(selection)]
        deleted = 0
        for start in range(0, len(chosen), PAGE):
            batch = chosen[start : start + PAGE]
            deleted += await acmd.delete_dead_letters(self.client.redis, dlq.keys, self.keys.events, batch)
        return deleted

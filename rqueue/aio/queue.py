"""Queues of an asyncio client: publishing, figures, purging, dead letters
and consumers, awaitable. Messages are checked and encoded by the sync
code (rqueue.publishing.prepare) and the replies parsed by the engine's
shared parsers: only the I/O is this module's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from .. import validate as check
from ..constants import PURGE_BATCH
from ..deadletters import PAGE, REPLAY_BATCH, Selection
from ..engine import async_commands as acmd
from ..engine import commands
from ..engine.keys import QueueKeys, partitions_key, queue_base
from ..engine.record import decode_record
from ..errors import InvalidInput, InvalidName, InvalidSetting, PartialPublish, Unroutable
from ..names import check_name, check_queue_name
from ..publishing import prepare
from ..queue import CLUSTER_DEAD_LETTER
from ..results import DeadLetter, Message, PublishResult, QueueStats, ReplayResult
from ..settings import DEAD_LETTER_MODES, Settings
from ..tracing import sending
from .consumer import Consumer

if TYPE_CHECKING:
    from ..protocols import QueueLike
    from .context import AsyncContext

PARTITIONED = "rqueue.aio does not serve partitioned queues: use rqueue.connect for this one"


class _Prepared:
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
    """A named queue of an asyncio client. Obtain one with
    :meth:`rqueue.aio.Client.queue`."""

    def __init__(self, client: AsyncContext, name: str) -> None:
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
        self.partition: int | None = None
        self.keys = QueueKeys(queue_base(client.prefix, root, depth))
        self._plain_checked = False

    def __repr__(self) -> str:
        return f"rqueue.aio.Queue({self.name!r})"

    async def check_plain(self) -> None:
        """Refuses a partitioned queue (checked once per handle)."""
        if self._plain_checked:
            return
        r = self.client.redis
        raw = await acmd.guarded(lambda: r.hget(partitions_key(self.client.prefix), self.root))
        if raw is not None:
            raise InvalidSetting("partitions", raw.decode(errors="replace"), PARTITIONED)
        self._plain_checked = True

    async def settings(self) -> Settings:
        """The settings in force for this queue."""
        return await self.client.settings.resolve(self.name)

    async def dead_letter_queue(self) -> Queue:
        """The queue that receives this queue's dead letters."""
        target = (await self.settings()).dead_letter
        if target in DEAD_LETTER_MODES:
            return Queue(self.client, self.client.dead_letter_name(self.name))
        return Queue(self.client, target)

    def group_keys(self, group: str, settings: Settings) -> list[str]:
        """KEYS of the group scripts for ``group`` under ``settings``."""
        target = settings.dead_letter
        if target in DEAD_LETTER_MODES:
            return self.keys.group(group).as_list()
        if self.client.cluster:
            raise InvalidSetting("dead_letter", target, CLUSTER_DEAD_LETTER)
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
    ) -> list[PublishResult]:
        """Appends many messages, in order, checked before anything is sent
        (see :meth:`rqueue.Queue.publish_many`); MAX_BATCH messages a round
        trip. ``durable=True`` is refused: use the sync client for it."""
        if check.flag("durable", durable):
            raise InvalidInput(
                "rqueue.aio does not publish durably (WAIT/WAITAOF): use rqueue.connect for durable=True"
            )
        await self.check_plain()
        settings = await self.settings()
        with sending(self.name, payloads) as trace:
            view = cast("QueueLike", _Prepared(self, settings))
            prepared = prepare(view, payloads, headers, ids, delay, mandatory, False, trace=trace, priority=priority)
            if prepared is None:
                return []
            replies = await acmd.publish_each(self.client.scripts, prepared.calls, self.name)
        failed = [r for r in replies if isinstance(r, Exception)]
        if failed and len(failed) == len(replies):
            if isinstance(failed[0], Unroutable) and settings.alternate is not None:
                alternate = Queue(self.client, settings.alternate)
                results = await alternate.publish_many(
                    prepared.payloads, headers=prepared.headers, ids=prepared.ids, delay=delay, priority=priority
                )
                return [PublishResult(r.seq, r.duplicate, settings.alternate) for r in results]
            raise failed[0]
        await self.client.register(self.name)
        if failed:
            stored: list[PublishResult | None] = []
            for reply, size in zip(replies, prepared.sizes, strict=True):
                stored += [None] * size if isinstance(reply, Exception) else commands.publish_results([reply])
            raise PartialPublish(stored, {i: r for i, r in enumerate(replies) if isinstance(r, Exception)}, unit="call")
        return commands.publish_results(replies)

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

    async def peek(self, n: int = 10, after: int = 0) -> list[Message]:
        """Up to ``n`` stored messages with seq > ``after``, oldest first."""
        check.whole_number("n", n, 1)
        check.whole_number("after", after, 0)
        out = []
        for seq, rec in await acmd.records_after(self.client.redis, self.keys, after, n):
            published, headers, data = decode_record(rec, f"{self.keys.msgs}[{seq}]")
            out.append(Message(seq, data, headers, published))
        return out

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
            for m in page:
                d = DeadLetter.from_message(m)
                if d.queue in ("", self.name) and selection.matches(d):
                    out.append(d)
                    if selection.limit is not None and len(out) >= selection.limit:
                        break
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
        by_group: dict[str, list[int]] = {}
        for d in chosen:
            by_group.setdefault(d.group, []).append(d.dlq_seq)
        if dry_run:
            result.by_group = {g: len(s) for g, s in by_group.items()}
            return result
        settings = await self.settings()
        for g, dseqs in by_group.items():
            call = self.group_call(g, settings)
            for start in range(0, len(dseqs), REPLAY_BATCH):
                for status in await acmd.replay(call, dseqs[start : start + REPLAY_BATCH]):
                    if status == "replayed":
                        result.replayed += 1
                        result.by_group[g] = result.by_group.get(g, 0) + 1
                    elif status == "missing":
                        result.missing += 1
                    else:
                        result.skipped += 1
        return result

    replay = replay_dead_letters

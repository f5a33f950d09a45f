"""Connecting with redis-py's asyncio client, and the client object that
hands out queues (the awaitable twin of rqueue.client)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

import redis.asyncio as aioredis

from .. import validate as check
from ..clock import SYSTEM_CLOCK, Clock
from ..connection.urls import CLUSTER_SCHEMES, CONNECT_TIMEOUT, mask_url, reads_shebang
from ..constants import (
    DEFAULT_DLQ_PREFIX,
    DEFAULT_DLQ_SUFFIX,
    DEFAULT_PREFIX,
    DURABLE_REPLICAS,
    DURABLE_TIMEOUT,
    FAILOVER_TIMEOUT,
    SETTINGS_CACHE_TTL,
)
from ..engine import async_commands as acmd
from ..engine.async_scripts import AsyncScripts
from ..engine.commands import MarkStatus
from ..engine.keys import LogLayout, QueueKeys, default_layout, partitions_key
from ..engine.prefix_layout import AsyncPrefixLayout
from ..errors import ConnectionLost, CorruptRecord, InvalidInput, InvalidName, InvalidSetting, OutOfMemory
from ..names import check_name
from ..partitions import check_partitions
from ..placement import Layout, already_plain, partitioning_refused, place, plain_meta_name
from ..queue import CLUSTER_DEAD_LETTER
from ..randomness import Randomness
from ..settings import DEAD_LETTER_MODES, validate
from ..statewatch import StateWatch
from .connect import cluster_retry, open_async_redis, scheme_of
from .notify import AsyncNotifier
from .partitions import PartitionedQueue
from .queue import Queue
from .settings import AsyncSettings

log = logging.getLogger("rqueue")


async def connect(
    url: str = "memory://",
    *,
    prefix: str = DEFAULT_PREFIX,
    clock: Clock | None = None,
    randomness: Randomness | None = None,
    dlq_prefix: str = DEFAULT_DLQ_PREFIX,
    dlq_suffix: str = DEFAULT_DLQ_SUFFIX,
    settings_ttl: float = SETTINGS_CACHE_TTL,
    failover_timeout: float = FAILOVER_TIMEOUT,
    durable_replicas: int = DURABLE_REPLICAS,
    durable_timeout: float = DURABLE_TIMEOUT,
    connect_timeout: float = CONNECT_TIMEOUT,
    allow_eviction: bool = False,
    **redis_options: Any,
) -> Client:
    """Connects to Redis with redis-py's asyncio client and checks that
    rqueue can work there. Takes the URLs and arguments of
    :func:`rqueue.connect` (every scheme: redis, rediss, unix, cluster,
    sentinel, memory) and raises the same exceptions."""
    check_name("key prefix", prefix)
    check.durable_options(failover_timeout, durable_replicas, durable_timeout)
    if not isinstance(dlq_prefix, str) or not isinstance(dlq_suffix, str) or not (dlq_prefix or dlq_suffix):
        raise InvalidInput(f"dlq_prefix {dlq_prefix!r} and dlq_suffix {dlq_suffix!r} must be str, not both empty")
    r = await open_async_redis(url, redis_options, connect_timeout, allow_eviction)
    client = Client(
        r,
        url=mask_url(url),
        prefix=prefix,
        clock=clock,
        randomness=randomness,
        dlq_prefix=dlq_prefix,
        dlq_suffix=dlq_suffix,
        settings_ttl=settings_ttl,
        failover_timeout=failover_timeout if scheme_of(url) in CLUSTER_SCHEMES else 0.0,
    )
    client.durable_replicas = durable_replicas
    client.durable_timeout = durable_timeout
    try:
        await client._marker.read()
        await client.read_layout()
    except BaseException:
        await client.close()
        raise
    return client


class Client:
    """A connection to one Redis with redis-py's asyncio client, with its
    scripts, settings and queues. Use it on one event loop."""

    def __init__(
        self,
        redis_client: Any,
        *,
        url: str = "",
        prefix: str = DEFAULT_PREFIX,
        clock: Clock | None = None,
        randomness: Randomness | None = None,
        dlq_prefix: str = DEFAULT_DLQ_PREFIX,
        dlq_suffix: str = DEFAULT_DLQ_SUFFIX,
        settings_ttl: float = SETTINGS_CACHE_TTL,
        failover_timeout: float = 0.0,
    ) -> None:
        self.redis = redis_client
        self.cluster = isinstance(redis_client, aioredis.RedisCluster)
        self.url = url
        self.prefix = prefix
        self.clock = clock or SYSTEM_CLOCK
        self.randomness = randomness or Randomness()
        self.dlq_prefix = dlq_prefix
        self.dlq_suffix = dlq_suffix
        self._marker = AsyncPrefixLayout(redis_client, prefix, default_layout())
        self.failover_timeout = failover_timeout
        self.scripts = AsyncScripts(redis_client, cluster_retry(failover_timeout), shebang=reads_shebang(url))
        self.settings = AsyncSettings(redis_client, prefix, self.clock.monotonic, settings_ttl)
        self.notifier = AsyncNotifier(redis_client)
        #: Replicas that must acknowledge a durable publish, and seconds to wait.
        self.durable_replicas = DURABLE_REPLICAS
        self.durable_timeout = DURABLE_TIMEOUT
        #: Per node: what durable publishes learned it supports (rqueue.engine.durable).
        self.durable_state: dict[str, Any] = {}
        self._nodes: dict[str, Any] = {}  # cluster node name -> a client of that node alone
        self._registered: set[str] = set()
        self._partitioned: dict[str, Layout] = {}  # queue -> its layout (partitioned queues), as last read
        self._watches: dict[str, StateWatch] = {}  # key base -> what this client's publishes saw
        # Work a call started and does not wait for (state-lost events, trim
        # steps), kept until done; close() waits for it.
        self._background: set[asyncio.Task[Any]] = set()

    def __repr__(self) -> str:
        return f"rqueue.aio.Client({self.url!r}, prefix={self.prefix!r})"

    async def configure(self, pattern: str, **settings: Any) -> None:
        """Stores settings for every queue whose name matches ``pattern``,
        for all processes (as :meth:`rqueue.Client.configure`)."""
        target = validate(settings).get("dead_letter") if self.cluster else None
        if target is not None and target not in DEAD_LETTER_MODES:
            raise InvalidSetting("dead_letter", target, CLUSTER_DEAD_LETTER)
        await self.settings.configure(pattern, settings)

    async def resolved_settings(self, queue: str) -> Any:
        """The settings that apply to ``queue`` now."""
        return await self.settings.resolve(queue)

    def queue(self, name: str) -> Queue | PartitionedQueue:
        """A handle on queue ``name`` (nothing is sent): a
        :class:`PartitionedQueue` when the queue was partitioned when this
        client last read the prefix's partitionings (at connect, and on
        :meth:`open_queue`), else a :class:`Queue`. ``DLQ.<name>`` is the
        dead-letter queue of ``<name>``. A plain handle on a queue
        partitioned since (by another process) refuses its first publish or
        join with InvalidSetting and learns the partitioning, so the next
        ``queue(name)`` gives the partitioned queue."""
        plain = Queue(self, name)  # checks the name
        layout = self._partitioned.get(plain.root)
        return PartitionedQueue(self, name, layout) if layout is not None else plain

    async def open_queue(self, name: str, partitions: int | None = None) -> Queue | PartitionedQueue:
        """The queue ``name``, its partitioning read from Redis now;
        ``partitions=N`` makes it a partitioned queue (see
        :meth:`rqueue.Client.queue`: the number is stored the first time;
        another number, or partitioning a queue that holds messages
        unpartitioned, raises InvalidSetting and changes nothing)."""
        plain = Queue(self, name)
        layout = await self._layout(plain.root)
        if partitions is not None:
            layout = await self._create_partitioned(plain, check_partitions(partitions), layout)
        return PartitionedQueue(self, name, layout) if layout.partitions > 1 else plain

    async def read_layout(self) -> None:
        """Reads which queues of the prefix are partitioned (one HGETALL)."""
        layouts: dict[str, Layout] = {}
        for root, raw in (await acmd.partition_counts(self.redis, self.prefix)).items():
            try:
                layouts[root] = Layout.parse(raw, f"{partitions_key(self.prefix)}[{root}]")
            except CorruptRecord as exc:
                log.error("%s", exc)  # raised again when that queue is opened
        self._partitioned = layouts

    async def _layout(self, root: str) -> Layout:
        raw = await acmd.guarded(lambda: self.redis.hget(partitions_key(self.prefix), root))
        layout = Layout.plain(1) if raw is None else Layout.parse(raw, f"{partitions_key(self.prefix)}[{root}]")
        self.learn_partitions(root, layout)
        return layout

    def learn_partitions(self, root: str, layout: Layout) -> None:
        """Records queue ``root``'s layout (one partition: not partitioned)."""
        if layout.partitions > 1:
            self._partitioned[root] = layout
        else:
            self._partitioned.pop(root, None)

    async def _create_partitioned(self, plain: Queue, partitions: int, stored: Layout) -> Layout:
        """As rqueue.Client's: the marker in the plain queue's slot decides
        (lua/partition.lua), atomically with the check that the plain queue
        is unused; the prefix's hash, which every process reads, is its copy."""
        if stored.partitions == partitions:
            return stored
        why = partitioning_refused(plain.name, plain.root, stored.partitions)
        if why is None:
            layout = place(self.redis, plain.root, partitions)
            status, text = await acmd.mark_partitioned(self.scripts, plain.keys, layout.text(), "", plain.root)
            if status is MarkStatus.IN_USE:
                why = already_plain(plain.root)
            else:
                made = await self.partitioned_now(plain.root, text)
                if made.partitions != partitions:
                    return await self._create_partitioned(plain, partitions, made)  # another process made it just now
                return made
        raise InvalidSetting("partitions", partitions, why)

    async def partitioned_now(self, root: str, text: str) -> Layout:
        """Queue ``root`` is partitioned with the layout ``text`` (as its
        marker says): the prefix's copy is written when it is missing (a
        creator that stopped between the two writes), and this client routes
        by it from now on."""
        layout = Layout.parse(text, f"{plain_meta_name(self, root)}[partitioned]")
        await acmd.claim_partitions(self.redis, self.prefix, root, text)
        self.learn_partitions(root, layout)
        return layout

    async def queues(self) -> list[str]:
        """Names of every queue this prefix has written to (see
        :meth:`rqueue.Client.queues`; the dead-letter queues listed are
        those of the registered queues that hold or held dead letters)."""
        names = await acmd.registered_queues(self.redis, self.prefix)
        dead: set[str] = set()
        for name in names:
            try:
                q = self.queue(name)
            except InvalidName:
                continue  # listed all the same: using it raises
            parts = q.parts if isinstance(q, PartitionedQueue) else [q]
            for part in parts:
                meta = part.keys.dead_letters.meta
                if await acmd.guarded(partial(self.redis.exists, meta)):
                    dead.add(self.dead_letter_name(name))
        return sorted(set(names) | dead)

    def forget(self, name: str) -> None:
        """Drops what this client remembers of queue ``name`` (it was deleted)."""
        self._registered.discard(name)
        self._partitioned.pop(name, None)

    async def node_for(self, key: str) -> tuple[Any, str]:
        """A client of the one server that holds ``key`` (on a cluster: the
        primary serving its slot now, on a connection of its own, as WAIT
        needs), and that server's name."""
        r = self.redis
        if not self.cluster:
            return r, ""
        node = r.get_node_from_key(key)
        client = self._nodes.get(node.name)
        if client is None:
            kwargs = {k: v for k, v in node.connection_kwargs.items() if k != "event_dispatcher"}
            pool = aioredis.ConnectionPool(connection_class=node.connection_class, **kwargs)
            client = self._nodes[node.name] = aioredis.Redis(connection_pool=pool)
        return client, node.name

    async def refresh_topology(self) -> None:
        """Reads the cluster's map of slots to nodes again (after a failover)."""
        if self.cluster:
            await self.redis.nodes_manager.initialize()

    def dead_letter_name(self, queue: str) -> str:
        return self.dlq_prefix + queue + self.dlq_suffix

    def state_watch(self, name: str, keys: QueueKeys) -> StateWatch:
        """What this client's publishes saw of queue ``name``'s state in
        Redis (rqueue.statewatch; one watch per queue)."""
        watch = self._watches.get(keys.base)
        if watch is None:
            watch = self._watches.setdefault(
                keys.base,
                StateWatch(name, keys, self.redis, self.randomness, "publisher", record=self.event_writer(keys)),
            )
        return watch

    def event_writer(self, keys: QueueKeys) -> Callable[[dict[str, str]], None]:
        """Writes an event of queue ``keys`` from sync code on the loop: as
        a task (its failure is logged), kept until it is done."""

        async def write(fields: dict[str, str]) -> None:
            try:
                await acmd.record_event(self.redis, keys, fields)
            except ConnectionLost:
                # A loss is often seen right after Redis came back, on a
                # pooled connection it closed: once more, on a new one. An
                # event written twice says no more than one written once.
                await acmd.record_event(self.redis, keys, fields)

        def record(fields: dict[str, str]) -> None:
            self.in_background(write(fields), _event_failed)

        return record

    def in_background(
        self, work: Coroutine[Any, Any, Any], failed: Callable[[BaseException], None]
    ) -> asyncio.Task[Any]:
        """Runs ``work`` as a task of the running loop that no caller
        awaits: kept until it is done, its failure (or its cancel, as
        CancelledError) handed to ``failed``, awaited by :meth:`close`."""
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)

        def done(task: asyncio.Task[Any]) -> None:
            self._background.discard(task)
            exc = asyncio.CancelledError() if task.cancelled() else task.exception()
            if exc is not None:
                failed(exc)

        task.add_done_callback(done)
        return task

    @property
    def log_layout(self) -> LogLayout:
        """The log layout of the queues this client makes and uses: the
        prefix's, read at connect (as rqueue.Client.log_layout)."""
        return self._marker.layout

    @log_layout.setter
    def log_layout(self, layout: LogLayout) -> None:
        self._marker.layout = layout

    async def register(self, name: str, again: bool = False) -> None:
        """Records queue ``name`` in the prefix's list of queues (once per
        client, and ``again`` as rqueue.Client.register says), the prefix's
        layout marker first (as rqueue.Client.register)."""
        if name in self._registered and not again:
            return
        try:
            await self._marker.mark(name)
            await acmd.register_queue(self.redis, self.prefix, name)
        except (ConnectionLost, OutOfMemory) as exc:
            # called after a publish or join was applied: see rqueue.Client.register
            log.warning("could not record queue %r in the list of queues (%s); will try again", name, exc)
            return
        self._registered.add(name)

    async def background_done(self) -> None:
        """Waits until the work :meth:`in_background` runs is done (each a
        call or two): what must come after it (a delete, which a trim step
        run later would write the queue's meta hash again for; the close)
        awaits this first."""
        while self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    async def close(self) -> None:
        await self.background_done()
        for node in self._nodes.values():
            await node.aclose()
        await self.notifier.close()
        await self.scripts.close()
        await self.redis.aclose()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _event_failed(exc: BaseException) -> None:
    log.warning("could not record a state-lost event: %s", exc)

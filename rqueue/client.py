"""Connecting to Redis, and the client object that hands out queues."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import redis

from . import schedules as scheduling
from . import validate as check
from .clock import SYSTEM_CLOCK, Clock
from .connection.cluster import Retrier, cluster_retry, no_retry
from .connection.open import RedisClient, open_redis
from .connection.urls import CLUSTER_SCHEMES, CONNECT_TIMEOUT, reads_shebang
from .constants import (
    DEFAULT_DLQ_PREFIX,
    DEFAULT_DLQ_SUFFIX,
    DEFAULT_PREFIX,
    DURABLE_REPLICAS,
    DURABLE_TIMEOUT,
    FAILOVER_TIMEOUT,
    SETTINGS_CACHE_TTL,
)
from .engine import commands, store
from .engine.keys import LogLayout, QueueKeys, default_layout, partitions_key
from .engine.notify import Notifier
from .engine.prefix_layout import PrefixLayout
from .engine.scripts import Scripts
from .errors import ConnectionLost, CorruptRecord, InvalidInput, InvalidName, InvalidSetting, OutOfMemory
from .names import check_name
from .overview import QueueSummary, add_up, summarize
from .partitions import PartitionedQueue, check_partitions
from .placement import Layout, already_plain, partitioning_refused, place, plain_meta_name
from .queue import CLUSTER_DEAD_LETTER, Queue
from .randomness import Randomness
from .schedules import Missed, ScheduleInfo
from .settings import DEAD_LETTER_MODES, Settings, SettingsStore, resolve, validate
from .statewatch import StateWatch

if TYPE_CHECKING:
    from .protocols import AnyQueue

log = logging.getLogger("rqueue")


def connect(
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
    """Connects to Redis and checks that rqueue can work there.

    ``url`` is ``redis://``, ``rediss://`` (TLS), ``unix://``,
    ``redis+cluster://host:port`` (any node of a Redis Cluster; ``rediss+cluster``
    with TLS), ``redis+sentinel://[user:password@]host:port[,host:port...]/service[/db]``
    (the primary that Redis Sentinel names, followed through failovers;
    ``?sentinel_password=`` for the sentinels; ``rediss+sentinel`` with TLS)
    or ``memory://[name]`` (an in-process server running the same
    scripts; clients that name the same server share it). ``prefix`` starts
    every key. On a cluster, script calls are retried through topology
    changes and failovers for up to ``failover_timeout`` seconds.
    ``publish(durable=True)`` waits up to ``durable_timeout`` seconds for
    ``durable_replicas`` replicas (and for fsync where the server has WAITAOF
    and AOF is on).
    The dead-letter queue of queue ``q`` is named ``dlq_prefix + q + dlq_suffix``
    (``DLQ.q`` by default).
    Raises InvalidURL for a URL of another kind, ConnectionFailed when the
    server cannot be reached, is not Redis or has not answered within
    ``connect_timeout`` seconds, ServerTooOld for Redis < 6.2, and
    EvictionPolicy for a server whose maxmemory-policy may evict keys
    (anything but noeviction) unless ``allow_eviction`` accepts that risk
    (docs/memory.md).
    """
    check_name("key prefix", prefix)
    check.durable_options(failover_timeout, durable_replicas, durable_timeout)
    r, shown, scheme = open_redis(url, redis_options, connect_timeout, allow_eviction)
    if not isinstance(dlq_prefix, str) or not isinstance(dlq_suffix, str) or not (dlq_prefix or dlq_suffix):
        raise InvalidInput(f"dlq_prefix {dlq_prefix!r} and dlq_suffix {dlq_suffix!r} must be str, not both empty")
    client = Client(
        r,
        url=shown,
        prefix=prefix,
        clock=clock,
        randomness=randomness,
        dlq_prefix=dlq_prefix,
        dlq_suffix=dlq_suffix,
        settings_ttl=settings_ttl,
        retry=cluster_retry(failover_timeout) if scheme in CLUSTER_SCHEMES else no_retry,
        idempotent_retry=cluster_retry(failover_timeout, idempotent=True) if scheme in CLUSTER_SCHEMES else no_retry,
    )
    client.durable_replicas = durable_replicas
    client.durable_timeout = durable_timeout
    client.failover_timeout = failover_timeout
    return client


class Client:
    """A connection to one Redis, with its scripts, settings and queues.

    Thread-safe: redis-py pools connections, so one client can serve many
    threads.
    """

    def __init__(
        self,
        redis_client: RedisClient,
        *,
        url: str = "",
        prefix: str = DEFAULT_PREFIX,
        clock: Clock | None = None,
        randomness: Randomness | None = None,
        dlq_prefix: str = DEFAULT_DLQ_PREFIX,
        dlq_suffix: str = DEFAULT_DLQ_SUFFIX,
        settings_ttl: float = SETTINGS_CACHE_TTL,
        retry: Retrier[Any] = no_retry,
        idempotent_retry: Retrier[Any] = no_retry,
    ) -> None:
        self.redis = redis_client
        #: Whether this is a Redis Cluster client (redis+cluster://).
        self.cluster = isinstance(redis_client, redis.RedisCluster)
        #: Replicas that must acknowledge a durable publish, and seconds to wait.
        self.durable_replicas = DURABLE_REPLICAS
        self.durable_timeout = DURABLE_TIMEOUT
        #: Seconds a cluster client retries through a failover.
        self.failover_timeout = FAILOVER_TIMEOUT
        #: Per node: what durable publishes learned it supports (rqueue.engine.durable).
        self.durable_state: dict[str, Any] = {}
        self.url = url
        self.prefix = prefix
        self.clock = clock or SYSTEM_CLOCK
        self.randomness = randomness or Randomness()
        self.dlq_prefix = dlq_prefix
        self.dlq_suffix = dlq_suffix
        self._marker = PrefixLayout(redis_client, prefix, default_layout(), idempotent_retry)
        self.scripts = Scripts(redis_client, retry, shebang=reads_shebang(url))
        #: Wraps plain commands that may safely be sent twice (reads, SADD, HSETNX).
        self.idempotent = idempotent_retry
        self.settings = SettingsStore(redis_client, prefix, self.clock.monotonic, settings_ttl, idempotent_retry)
        self.notifier = Notifier(redis_client)
        self._registered: set[str] = set()
        self._partitioned: dict[str, tuple[Layout, float]] = {}  # queue -> (its layout, monotonic time read)
        self._watches: dict[str, StateWatch] = {}  # key base -> what this client's publishes saw

    def configure(self, pattern: str, **settings: Any) -> None:
        """Stores settings for every queue whose name matches ``pattern``
        (``*`` = one word, ``#`` = any number of words), for all processes.

        Raises InvalidSetting (naming the setting) or InvalidName; nothing is
        stored then.
        """
        target = validate(settings).get("dead_letter") if self.cluster else None
        if target is not None and target not in DEAD_LETTER_MODES:
            raise InvalidSetting("dead_letter", target, CLUSTER_DEAD_LETTER)
        self.settings.configure(pattern, settings)

    def resolved_settings(self, queue: str) -> Settings:
        """The settings that apply to ``queue`` now."""
        return self.settings.resolve(queue)[0]

    def queue(self, name: str, partitions: int | None = None) -> AnyQueue:
        """A handle on queue ``name`` (nothing is written until it is used).

        ``partitions=N`` (N > 1) makes it a partitioned queue
        (:class:`rqueue.PartitionedQueue`, see rqueue/partitions.py): the
        number is stored in Redis the first time, and from then on
        ``queue(name)`` in any process returns the partitioned queue. Asking
        for another number, or partitioning a queue that already holds
        messages unpartitioned, raises InvalidSetting and changes nothing.

        ``DLQ.<name>`` (with the client's dlq_prefix) is the dead-letter queue
        of ``<name>`` (partitioned like it).
        """
        return self._queue(name, partitions)

    def _queue(self, name: str, partitions: int | None = None) -> Queue | PartitionedQueue:
        plain = Queue(self, name)  # checks the name
        layout = self._layout(plain.root)
        if partitions is not None:
            layout = self._create_partitioned(plain, check_partitions(partitions), layout)
        return PartitionedQueue(self, name, layout.partitions, layout.salts, layout) if layout.partitions > 1 else plain

    def layout(self, root: str) -> Layout:
        """The layout of queue ``root`` as this client last read it (read
        again after the settings' cache time); one partition: not partitioned."""
        return self._layout(root)

    def grow_partitions(self, name: str, partitions: int) -> PartitionedQueue:
        """Adds partitions to partitioned queue ``name``, live, up to
        ``partitions`` in all; returns the grown queue. Nothing moves: the
        existing partitions keep their messages and are still consumed,
        new messages are routed over every partition (each process within
        the settings' cache time, 1 s by default), consumers and workers
        join the new partitions by themselves. Order per key holds for keys
        whose partition stays the same; a key that moves may have a newer
        message handled before an older one that still waits in its old
        partition (docs/connections.md, "Growing"). Message ids keep
        de-duplicating across the change. InvalidSetting when the queue is
        not partitioned, ``partitions`` is not more than it has, or it grew
        less than one de-duplication window ago; nothing changes then."""
        plain = Queue(self, name)
        target = check_partitions(partitions)
        if plain.name != plain.root:
            raise InvalidSetting("partitions", partitions, f"{name!r} is a dead-letter queue: grow {plain.root!r}")
        self._partitioned.pop(plain.root, None)
        current = self._layout(plain.root)
        window_ms = round(self.resolved_settings(plain.root).dedup_window * 1000)
        while True:
            if current.partitions < 2:
                raise InvalidSetting("partitions", partitions, f"queue {name!r} is not partitioned")
            if target == current.partitions:
                break
            if target < current.partitions:
                raise InvalidSetting(
                    "partitions", partitions, f"queue {name!r} has {current.partitions} partitions; they only grow"
                )
            now = self._now_ms()
            if current.in_transition(now, window_ms):
                raise InvalidSetting(
                    "partitions",
                    partitions,
                    f"queue {name!r} grew {(now - current.grown_ms) / 1000:.1f} s ago; it may grow again once "
                    f"its de-duplication window ({window_ms / 1000:g} s) has passed since",
                )
            grown = current.grown(self.redis, plain.root, target, now)
            status, stored = commands.mark_partitioned(self.scripts, plain.keys, grown.text(), current.text(), name)
            if status is commands.MarkStatus.STORED:
                self._publish_layout(plain, grown.text())
                break
            current = Layout.parse(stored, f"{plain.keys.meta}[partitioned]")  # another process changed it
        queue = self._queue(name)
        assert isinstance(queue, PartitionedQueue)
        return queue

    def _publish_layout(self, plain: Queue, text: str) -> None:
        """Writes the prefix's copy of a grown layout, and again while the
        marker says something else: two growths that write their copies in
        the wrong order still leave the copy at the marker's (the larger)."""
        for _ in range(10):
            store.set_partitions(self.redis, self.prefix, plain.root, text, self.idempotent)
            marker = store.partition_marker(self.redis, plain.keys, self.idempotent)
            if marker is None or marker.decode("ascii", "replace") == text:
                break
            text = marker.decode("ascii", "replace")
        self._partitioned[plain.root] = (Layout.parse(text, f"{plain.keys.meta}[partitioned]"), self.clock.monotonic())

    def _now_ms(self) -> int:
        """The scripts' time in ms: the test clock's, else the server's."""
        now = self.clock.script_now()
        return int(now) if now else store.now_ms(self.redis)

    def _partition_count(self, root: str) -> int:
        """How many partitions queue ``root`` has (1 = not partitioned)."""
        return self._layout(root).partitions

    def _layout(self, root: str) -> Layout:
        """The stored layout of queue ``root`` (one partition: not
        partitioned), re-read after the settings' cache time, like settings
        (a queue may be deleted and created again, or grown)."""
        now = self.clock.monotonic()
        seen = self._partitioned.get(root)
        if seen is not None and now - seen[1] < self.settings.ttl:
            return seen[0]
        raw = store.stored_partitions(self.redis, self.prefix, root, self.idempotent)
        layout = Layout.plain(1) if raw is None else Layout.parse(raw, f"{partitions_key(self.prefix)}[{root}]")
        self._partitioned[root] = (layout, now)
        return layout

    def _create_partitioned(self, plain: Queue, partitions: int, stored: Layout) -> Layout:
        if stored.partitions == partitions:
            return stored
        why = partitioning_refused(plain.name, plain.root, stored.partitions)
        if why is None:
            # The marker in the plain queue's slot decides, atomically with
            # the check that the plain queue is unused; the prefix's hash,
            # which every process reads, is its copy.
            layout = place(self.redis, plain.root, partitions)
            status, text = commands.mark_partitioned(self.scripts, plain.keys, layout.text(), "", plain.root)
            if status is commands.MarkStatus.IN_USE:
                why = already_plain(plain.root)
            else:
                made = self.partitioned_now(plain.root, text)
                if made.partitions != partitions:
                    return self._create_partitioned(plain, partitions, made)  # another process created it just now
                return made
        raise InvalidSetting("partitions", partitions, why)

    def partitioned_now(self, root: str, text: str) -> Layout:
        """Queue ``root`` is partitioned with the layout ``text`` (as its
        marker says): the prefix's copy is written when it is missing
        (a creator that stopped between the two writes) and this client
        routes by it from now on."""
        layout = Layout.parse(text, f"{plain_meta_name(self, root)}[partitioned]")
        store.claim_partitions(self.redis, self.prefix, root, text, self.idempotent)
        self._partitioned[root] = (layout, self.clock.monotonic())
        return layout

    def queues(self) -> list[str]:
        """Names of every queue this prefix has written to, and of their
        dead-letter queues that hold or held messages, sorted. A name that
        this client cannot open (written by another client or an older
        version) is listed too; using it raises the reason."""
        names = store.registered_queues(self.redis, self.prefix)
        owners: list[str] = []
        levels: list[QueueKeys] = []
        for name in names:
            try:
                q = self._queue(name)
            except (InvalidName, CorruptRecord):
                continue  # listed all the same: one bad name never fails the list (using it raises)
            for part in q.parts if isinstance(q, PartitionedQueue) else [q]:
                levels.append(part.keys)
                owners.append(name)
        has = store.have_dead_letters(self.redis, levels)
        dead = {self.dead_letter_name(n) for n, written in zip(owners, has, strict=True) if written}
        return sorted(set(names) | dead)

    def overview(self) -> list[QueueSummary]:
        """The figures of every queue this prefix has written to (not of
        the dead-letter queues: each queue counts its dead letters), sorted
        by name, in at most five round trips however many queues there are
        (the list, the time, the settings when not cached, and two pipelines;
        on a cluster, each pipeline is one round trip per node). A queue that cannot be read has its ``error`` and no
        figures."""
        names, stored = store.queue_index(self.redis, self.prefix)
        script_now = self.clock.script_now()
        now = int(script_now) if script_now else store.now_ms(self.redis)
        patterns = self.settings.patterns()
        plans: list[tuple[str, list[Queue], str | None]] = []
        levels: list[tuple[QueueKeys, QueueKeys]] = []
        for name in names:
            try:
                plain = Queue(self, name)
                if plain.name != plain.root:
                    continue  # a dead-letter queue: counted by its queue
                raw = stored.get(name)
                layout = Layout.parse(raw, f"{partitions_key(self.prefix)}[{name}]") if raw is not None else None
                parts = [Queue(self, name, i, s) for i, s in enumerate(layout.salts)] if layout else [plain]
                count = len(parts)
                target = resolve(patterns, name)[0].dead_letter
                named = count == 1 and target not in DEAD_LETTER_MODES and not self.cluster
                dead = Queue(self, target).keys if named else None
                levels += [(p.keys, dead or p.keys.dead_letters) for p in parts]
                plans.append((name, parts, None))
            except (InvalidName, CorruptRecord, InvalidSetting) as exc:
                plans.append((name, [], str(exc)))
        figures = iter(store.queue_overview(self.redis, levels, now))
        out: list[QueueSummary] = []
        for name, parts, error in plans:
            read = [next(figures) for _ in parts]
            if error is not None:
                out.append(QueueSummary(name, error=error))
            else:
                out.append(summarize(name, read[0]) if len(read) == 1 else add_up(name, read))
        return out

    def dead_letter_name(self, queue: str) -> str:
        """Name of the default dead-letter queue of ``queue``."""
        return self.dlq_prefix + queue + self.dlq_suffix

    def node_for(self, key: str) -> tuple[Any, str]:
        """A client of the one server that holds ``key`` (on a cluster: the
        primary serving its slot now), and that server's name."""
        r = self.redis
        if not isinstance(r, redis.RedisCluster):
            return r, ""
        node = r.get_node_from_key(key)  # type: ignore[no-untyped-call]  # unannotated in redis-py
        return r.get_redis_connection(node), node.name

    def refresh_topology(self) -> None:
        """Reads the cluster's map of slots to nodes again (after a failover)."""
        if isinstance(self.redis, redis.RedisCluster):
            self.redis.nodes_manager.initialize()

    @property
    def log_layout(self) -> LogLayout:
        """The prefix's log layout (rqueue.engine.prefix_layout), read at the first queue handle."""
        return self._marker.layout

    @log_layout.setter
    def log_layout(self, layout: LogLayout) -> None:
        self._marker.use(layout)

    def register(self, name: str, again: bool = False) -> None:
        """Records queue ``name`` in the prefix's list of queues (once per
        client, or ``again``). The list is a global key, outside every queue's
        hash slot, so it is written beside the scripts rather than by them,
        after the prefix's layout marker (rqueue.engine.prefix_layout)."""
        if again or name not in self._registered:
            try:
                self._marker.mark(name)
                store.register_queue(self.redis, self.prefix, name, self.idempotent)
            except (ConnectionLost, OutOfMemory) as exc:
                # called after a publish or join was applied: failing it would
                # report a stored message as not stored, or keep a worker from
                # joining a full server to drain it (the SADD is refused there
                # even when the queue is listed); the next use tries again
                log.warning("could not record queue %r in the list of queues (%s); will try again", name, exc)
                return
            self._registered.add(name)

    def state_watch(self, name: str, keys: QueueKeys) -> StateWatch:
        """What this client's publishes saw of queue ``name``'s state in
        Redis (one watch per queue, whichever Queue object publishes)."""
        watch = self._watches.get(keys.base)
        if watch is None:
            watch = self._watches.setdefault(
                keys.base, StateWatch(name, keys, self.redis, self.randomness, "publisher")
            )
        return watch

    def forget(self, name: str) -> None:
        """Drops what this client remembers of queue ``name`` (it was deleted)."""
        self._registered.discard(name)
        self._partitioned.pop(name, None)

    # -- recurring schedules (rqueue/schedules.py, docs/schedules.md) ----------

    def schedule(
        self,
        name: str,
        queue: str,
        *,
        every: float | None = None,
        cron: str | None = None,
        payload: bytes = b"",
        headers: Mapping[str, str] | None = None,
        timezone: str | None = None,
        missed: Missed | str = Missed.ONCE,
    ) -> ScheduleInfo:
        """Publishes ``payload`` with ``headers`` to ``queue`` at every tick
        of schedule ``name``: ``every`` seconds (ticks at its multiples since
        the epoch) or at the times of the five-field expression ``cron`` in
        ``timezone`` (an IANA name; UTC by default). Each tick is published
        once, whatever number of schedulers run (a Worker runs one; so does
        ``rqueue scheduler``); the message carries the headers
        ``x-rq-schedule`` (the name) and ``x-rq-tick`` (the tick, ms).

        ``missed`` says what happens to ticks that passed while no
        scheduler ran: "once" (default) publishes one message for the
        latest of them, "all" publishes each, "skip" publishes only a tick
        found within a minute of its time.

        Defining a schedule that exists replaces its payload, headers and
        policy; a new timing fires from its first tick after now, the same
        timing goes on where it was. Raises InvalidInput (or InvalidName,
        PayloadTooLarge) naming the problem; nothing is stored then.
        """
        return scheduling.define(
            self,
            name,
            queue,
            every=every,
            cron=cron,
            payload=payload,
            headers=headers,
            timezone=timezone,
            missed=missed,
        )

    def schedules(self) -> list[ScheduleInfo]:
        """Every recurring schedule of this prefix, by name, with its last
        and next tick and whether it is paused."""
        return scheduling.list_all(self)

    def pause_schedule(self, name: str) -> ScheduleInfo:
        """Stops publishing schedule ``name`` until :meth:`resume_schedule`."""
        return scheduling.pause(self, name)

    def resume_schedule(self, name: str) -> ScheduleInfo:
        """Publishes schedule ``name`` again from its next tick after now
        (the ticks of the pause are not published)."""
        return scheduling.resume(self, name)

    def remove_schedule(self, name: str) -> bool:
        """Deletes schedule ``name``; False when there was none."""
        return scheduling.remove(self, name)

    def close(self) -> None:
        self.notifier.close()
        self.scripts.close()
        self.redis.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

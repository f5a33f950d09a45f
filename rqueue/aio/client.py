"""Connecting with redis-py's asyncio client, and the client object that
hands out queues (the awaitable twin of rqueue.client)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis

from ..client import check_durable
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
from ..engine.keys import QueueKeys
from ..errors import ConnectionLost, InvalidInput, InvalidSetting
from ..names import check_name
from ..queue import CLUSTER_DEAD_LETTER
from ..randomness import Randomness
from ..settings import DEAD_LETTER_MODES, validate
from ..statewatch import StateWatch
from .connect import cluster_retry, open_async_redis, scheme_of
from .notify import AsyncNotifier
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
    connect_timeout: float = CONNECT_TIMEOUT,
    **redis_options: Any,
) -> Client:
    """Connects to Redis with redis-py's asyncio client and checks that
    rqueue can work there. Takes the URLs and arguments of
    :func:`rqueue.connect` (every scheme: redis, rediss, unix, cluster,
    sentinel, memory) and raises the same exceptions."""
    check_name("key prefix", prefix)
    check_durable(failover_timeout, DURABLE_REPLICAS, DURABLE_TIMEOUT)
    if not isinstance(dlq_prefix, str) or not isinstance(dlq_suffix, str) or not (dlq_prefix or dlq_suffix):
        raise InvalidInput(f"dlq_prefix {dlq_prefix!r} and dlq_suffix {dlq_suffix!r} must be str, not both empty")
    r = await open_async_redis(url, redis_options, connect_timeout)
    return Client(
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
        self.failover_timeout = failover_timeout
        self.scripts = AsyncScripts(redis_client, cluster_retry(failover_timeout), shebang=reads_shebang(url))
        self.settings = AsyncSettings(redis_client, prefix, self.clock.monotonic, settings_ttl)
        self.notifier = AsyncNotifier(redis_client)
        self._registered: set[str] = set()
        self._watches: dict[str, StateWatch] = {}  # key base -> what this client's publishes saw
        self._events: set[asyncio.Task[Any]] = set()  # state-lost events being written

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

    def queue(self, name: str) -> Queue:
        """A handle on queue ``name`` (nothing is sent until it is used).
        ``DLQ.<name>`` is the dead-letter queue of ``<name>``. A partitioned
        queue is refused, on first use, with InvalidSetting: use the sync
        client for those."""
        return Queue(self, name)

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

        def record(fields: dict[str, str]) -> None:
            task = asyncio.get_running_loop().create_task(acmd.record_event(self.redis, keys, fields))
            self._events.add(task)
            task.add_done_callback(self._event_written)

        return record

    def _event_written(self, task: asyncio.Task[Any]) -> None:
        self._events.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("could not record a state-lost event: %s", task.exception())

    async def register(self, name: str) -> None:
        """Records queue ``name`` in the prefix's list of queues (once per client)."""
        if name in self._registered:
            return
        try:
            await acmd.register_queue(self.redis, self.prefix, name)
        except ConnectionLost as exc:
            # called after a publish or join was applied: see rqueue.Client.register
            log.warning("could not record queue %r in the list of queues (%s); will try again", name, exc)
            return
        self._registered.add(name)

    async def close(self) -> None:
        await self.notifier.close()
        await self.scripts.close()
        await self.redis.aclose()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

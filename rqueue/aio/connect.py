"""Opening a redis-py asyncio client for any URL rqueue takes.

The URL is checked and parsed by the sync code (rqueue.connection): a
sentinel URL is resolved by the sync sentinel client, whose settings the
asyncio one is then made with; memory:// shares its in-process server with
the sync clients of the same name, so that both kinds of client see the
same queues.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.backoff import NoBackoff
from redis.retry import Retry
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_exponential_jitter

from .. import validate as check
from ..connection.cluster import not_run
from ..connection.open import check_policy, check_version, open_redis, server_version
from ..connection.sentinel import sentinel_redis
from ..connection.urls import (
    CLUSTER_SCHEMES,
    CONNECT_TIMEOUT,
    SCHEMES,
    SENTINEL_SCHEMES,
    SOCKET_TIMEOUT,
    check_db,
    describe,
    mask_url,
    scrub,
)
from ..engine.async_scripts import AsyncRetrier, no_async_retry, seeing_closes
from ..errors import ConnectionFailed, EvictionPolicy, InvalidURL, ServerTooOld
from .cutoff import within


def scheme_of(url: str) -> str:
    return url.split("://", 1)[0] if "://" in url else ""


async def open_async_redis(
    url: str, redis_options: dict[str, Any], connect_timeout: float = CONNECT_TIMEOUT, allow_eviction: bool = False
) -> Any:
    """An asyncio client for ``url`` that answered PING and runs a Redis new
    enough for rqueue, that does not evict keys unless ``allow_eviction``.
    Raises InvalidURL, ConnectionFailed, ServerTooOld or EvictionPolicy, as
    rqueue.connect does; ConnectionFailed also when the server has not
    answered within ``connect_timeout`` seconds."""
    if not isinstance(url, str):
        raise InvalidURL(f"<{type(url).__name__}>", f"must be a str, not {type(url).__name__}")
    check.positive_seconds("connect_timeout", connect_timeout)
    shown = mask_url(url)
    scheme = scheme_of(url)
    if scheme not in SCHEMES:
        raise InvalidURL(shown, f"scheme must be one of {', '.join(s + '://' for s in SCHEMES)}")
    if scheme == "memory":
        return await _memory(url)
    options: dict[str, Any] = {
        "socket_connect_timeout": connect_timeout,
        "socket_timeout": SOCKET_TIMEOUT,  # see rqueue.connection.open
        "health_check_interval": 30,
    }
    if scheme != "unix":
        options["socket_keepalive"] = True
    options.update(redis_options)
    if scheme != "unix" and scheme not in SENTINEL_SCHEMES:
        check_db(shown)
    made: list[Any] = []
    try:
        return await within(connect_timeout, _open(url, shown, scheme, options, made, allow_eviction))
    except TimeoutError:
        for r in made:
            with contextlib.suppress(Exception):
                await r.aclose()
        raise ConnectionFailed(shown, f"no answer within {connect_timeout:g} s (connect_timeout)") from None


async def _memory(url: str) -> Any:
    try:
        import fakeredis
    except ImportError:  # pragma: no cover - depends on the install
        raise InvalidURL(url, "memory:// needs fakeredis with Lua: pip install 'rqueue[memory]'") from None
    sync: Any = open_redis(url, {})[0]  # the named in-process server, shared with sync clients
    server = sync.connection_pool.connection_kwargs["server"]
    sync.close()
    return fakeredis.FakeAsyncRedis(server=server)


async def _open(
    url: str, shown: str, scheme: str, options: dict[str, Any], made: list[Any], allow_eviction: bool
) -> Any:
    try:
        if scheme in CLUSTER_SCHEMES:
            r = _cluster(url, shown, options)
        elif scheme in SENTINEL_SCHEMES:
            r = await _sentinel(url, shown, options)
        else:
            r = aioredis.Redis.from_url(url, **options)
            r.connection_pool.connection_class = seeing_closes(r.connection_pool.connection_class)
    except InvalidURL:
        raise
    except ValueError as exc:
        raise InvalidURL(shown, scrub(str(exc), url)) from None
    made.append(r)
    try:
        if isinstance(r, aioredis.RedisCluster):
            await r.initialize()
        await r.ping()
        await _check_server(r, url, allow_eviction)
    except (ServerTooOld, EvictionPolicy):
        await r.aclose()
        raise
    except (redis.RedisError, OSError) as exc:
        await r.aclose()
        text = scrub(describe(exc), url)
        if "cluster mode is not enabled" in text.lower() or "cluster support disabled" in text.lower():
            text = "the server is not a Redis Cluster (use redis:// for a single server)"
        raise ConnectionFailed(shown, text) from None
    return r


async def _check_server(r: Any, url: str, allow_eviction: bool) -> None:
    """As the sync client's check: the version and the eviction policy of
    the server, or of every primary of a cluster."""
    if isinstance(r, aioredis.RedisCluster):
        nodes: list[Any] = list(r.get_primaries())
        for node in nodes:
            check_version(server_version(_Info(await r.info("server", target_nodes=node))))
    else:
        nodes = [None]
        check_version(server_version(_Info(await r.info("server"))))
    for node in nodes:
        try:
            reply = await (
                r.config_get("maxmemory-policy", target_nodes=node) if node else r.config_get("maxmemory-policy")
            )
        except redis.ResponseError:
            return  # CONFIG may be refused by ACLs: docs/memory.md says what to check by hand
        check_policy(reply, url, allow_eviction)


class _Info:
    """An INFO reply already read, for server_version."""

    def __init__(self, info: Any) -> None:
        self._info = info if isinstance(info, dict) else {}

    def info(self, _section: str) -> dict[str, Any]:
        return self._info


def _cluster(url: str, shown: str, options: dict[str, Any]) -> Any:
    node_url = CLUSTER_SCHEMES[scheme_of(url)] + "://" + url.split("://", 1)[1]
    db = shown.split("://", 1)[1].partition("/")[2].partition("?")[0].strip("/")
    if db not in ("", "0"):
        raise InvalidURL(shown, f"a Redis Cluster has only database 0, not {db}")
    options.pop("health_check_interval", None)
    # A script sent again after a lost reply could apply twice: rqueue
    # retries only what never ran (cluster_retry below).
    options.setdefault("retry", Retry(NoBackoff(), 0))
    return aioredis.RedisCluster.from_url(node_url, **options)


async def _sentinel(url: str, shown: str, options: dict[str, Any]) -> Any:
    """The sync sentinel client parses the URL and finds a healthy primary;
    the asyncio client is made with the same addresses and settings."""
    sync = await asyncio.to_thread(sentinel_redis, url, shown, dict(options))
    try:
        manager = sync.sentinel_manager
        assert manager is not None
        addresses = [
            (n.connection_pool.connection_kwargs["host"], n.connection_pool.connection_kwargs["port"])
            for n in manager.sentinels
        ]
        pool = sync.connection_pool
        service: str = pool.service_name  # type: ignore[attr-defined]  # a SentinelConnectionPool
        server = {
            k: v
            for k, v in pool.connection_kwargs.items()
            if k not in ("host", "port", "connection_pool", "retry", "redis_connect_func")
        }
        sentinel_kwargs = dict(manager.sentinel_kwargs)
    finally:
        sync.close()
    make: Callable[..., Any] = AsyncSentinel
    sentinel = make(addresses, sentinel_kwargs=sentinel_kwargs)
    client = sentinel.master_for(service, redis_class=AsyncSentinelRedis, **server)
    client.sentinel_manager = sentinel
    return client


class AsyncSentinelRedis(aioredis.Redis):
    """The asyncio client of the primary; closing it also closes the
    connections to the sentinels."""

    sentinel_manager: Any = None

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        try:
            await super().aclose(close_connection_pool)
        finally:
            if self.sentinel_manager is not None:
                for node in self.sentinel_manager.sentinels:
                    await node.aclose()


def cluster_retry(timeout: float) -> AsyncRetrier:
    """As rqueue.connection.cluster.cluster_retry, awaited: retries only the
    errors that prove the call did not run, for up to ``timeout`` seconds."""
    retrying = AsyncRetrying(
        retry=retry_if_exception(not_run),
        stop=stop_after_delay(timeout),
        wait=wait_exponential_jitter(multiplier=0.05, max=1.0, jitter=0.05),
        reraise=True,
    )

    async def retry(call: Callable[[], Awaitable[Any]]) -> Any:
        async for attempt in retrying:
            with attempt:
                return await call()
        raise AssertionError("unreachable")  # pragma: no cover - reraise=True raises the last error

    return retry if timeout > 0 else no_async_retry

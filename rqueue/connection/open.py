"""Opening a redis-py client for any URL rqueue takes, and checking that
the server it reaches can run rqueue."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections.abc import Callable
from typing import Any, TypeAlias, TypeVar

import redis

from .. import validate as check
from ..constants import MIN_SERVER_VERSION
from ..errors import ConnectionFailed, EvictionPolicy, InvalidURL, ServerTooOld
from .cluster import cluster_redis
from .memory import memory_redis
from .sentinel import sentinel_redis
from .urls import (
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

log = logging.getLogger("rqueue")

# The clients rqueue runs on: one server (also a Sentinel primary and
# memory://'s fakeredis), or a Redis Cluster.
RedisClient: TypeAlias = "redis.Redis | redis.RedisCluster"
T = TypeVar("T")


def server_version(r: Any) -> str:
    info = r.info("server")
    return str(info.get("valkey_version") or info.get("redis_version") or "0")


def _parse_version(version: str) -> tuple[int, ...]:
    out = []
    for part in version.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits or 0))
    return tuple(out)


def check_version(version: str) -> None:
    """Raises ServerTooOld for a server version rqueue does not run on."""
    if _parse_version(version) < MIN_SERVER_VERSION:
        raise ServerTooOld(version, ".".join(map(str, MIN_SERVER_VERSION)))


def check_policy(reply: Any, url: str, allow_eviction: bool) -> None:
    """Judges a server's CONFIG GET maxmemory-policy reply: a policy that may
    evict keys raises EvictionPolicy, unless ``allow_eviction`` accepts the
    risk (then a warning is logged)."""
    # redis-py decodes the keys and values of CONFIG GET (str), older
    # versions and decode_responses=False clients may not (bytes)
    policy = reply.get("maxmemory-policy", reply.get(b"maxmemory-policy"))
    if isinstance(policy, bytes):
        policy = policy.decode(errors="replace")
    if policy in (None, "noeviction"):
        return
    if not allow_eviction:
        raise EvictionPolicy(mask_url(url), policy)
    log.warning(
        "Redis at %s has maxmemory-policy %s (allowed by allow_eviction=True): under memory pressure it may "
        "evict queue data; set maxmemory-policy noeviction",
        mask_url(url),
        policy,
    )


def _check_server(r: Any, url: str, allow_eviction: bool) -> None:
    if isinstance(r, redis.RedisCluster):
        for node in r.get_primaries():  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
            _check_server(node.redis_connection or r.get_redis_connection(node), url, allow_eviction)
        return
    check_version(server_version(r))
    try:
        reply = r.config_get("maxmemory-policy")
    except redis.ResponseError:
        return  # CONFIG may be refused by ACLs: docs/memory.md says what to check by hand
    check_policy(reply, url, allow_eviction)


def open_redis(
    url: str, redis_options: dict[str, Any], connect_timeout: float = CONNECT_TIMEOUT, allow_eviction: bool = False
) -> tuple[RedisClient, str, str]:
    """A redis-py client for ``url`` that answered PING and runs a Redis new
    enough for rqueue, with the URL as shown (password masked) and its
    scheme. Raises InvalidURL, ConnectionFailed, ServerTooOld, or
    EvictionPolicy for a server that may evict keys (unless
    ``allow_eviction``: then a warning is logged); ConnectionFailed
    also when the server has not answered within ``connect_timeout`` seconds
    (one that accepts connections but never replies would otherwise hold the
    caller for the socket timeout)."""
    if not isinstance(url, str):
        if isinstance(url, (bytes, bytearray)):  # shown masked, like any URL
            raise InvalidURL(mask_url(bytes(url).decode("utf-8", "replace")), "must be a str, not bytes")
        raise InvalidURL(f"<{type(url).__name__}>", f"must be a str, not {type(url).__name__}")
    check.positive_seconds("connect_timeout", connect_timeout)
    shown = mask_url(url)
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme not in SCHEMES:
        raise InvalidURL(shown, f"scheme must be one of {', '.join(s + '://' for s in SCHEMES)}")
    if scheme == "memory":
        try:
            r = memory_redis(url)
        except InvalidURL:
            raise  # already names the URL; wrapping it would say "invalid URL" twice
        except ValueError as exc:
            raise InvalidURL(shown, scrub(str(exc), url)) from None
        _handshake(r, url, shown, scheme, allow_eviction)
        return r, shown, scheme
    options = {
        "socket_connect_timeout": connect_timeout,
        # Scripts do bounded work, so a reply that takes this long means a
        # dead connection: the call fails (and a worker retries) instead
        # of hanging on a half-open socket.
        "socket_timeout": SOCKET_TIMEOUT,
        "health_check_interval": 30,
    }
    if scheme != "unix":  # TCP only
        options["socket_keepalive"] = True
    options.update(redis_options)
    r = _within(connect_timeout, lambda: _open_network(url, shown, scheme, options, allow_eviction), shown)
    return r, shown, scheme


def _open_network(url: str, shown: str, scheme: str, options: dict[str, Any], allow_eviction: bool) -> RedisClient:
    try:
        if scheme != "unix" and scheme not in SENTINEL_SCHEMES:  # a sentinel URL's path is /service[/db]
            check_db(shown)
        r: RedisClient
        if scheme in CLUSTER_SCHEMES:
            r = cluster_redis(url, shown, options)
        elif scheme in SENTINEL_SCHEMES:
            r = sentinel_redis(url, shown, options)
        else:
            r = redis.Redis.from_url(url, **options)
    except InvalidURL:
        raise  # an InvalidURL is a ValueError too; wrapping it would say "invalid URL" twice
    except ValueError as exc:
        raise InvalidURL(shown, scrub(str(exc), url)) from None
    _handshake(r, url, shown, scheme, allow_eviction)
    return r


def _handshake(r: RedisClient, url: str, shown: str, scheme: str, allow_eviction: bool) -> None:
    try:
        r.ping()
        if scheme != "memory":  # fakeredis has no INFO; it is as new as its Lua
            _check_server(r, url, allow_eviction)
    except (ServerTooOld, EvictionPolicy):
        r.close()
        raise
    except (redis.RedisError, OSError) as exc:
        r.close()
        raise ConnectionFailed(shown, scrub(describe(exc), url)) from None


def _within(timeout: float, opening: Callable[[], RedisClient], shown: str) -> RedisClient:
    """``opening()``, given up after ``timeout`` seconds with ConnectionFailed.
    It runs in a thread of its own: a server that accepts connections and
    never answers holds a reply's read for the whole socket timeout, and
    the reads of a cluster's or the sentinels' discovery cannot be reached
    from here to be cut short. A client that such a thread opens after the
    caller gave up is closed."""
    lock = threading.Lock()
    done = threading.Event()
    outcome: list[Any] = []  # [client] or [None, error]
    abandoned = False

    def run() -> None:
        try:
            r = opening()
        except BaseException as exc:
            with lock:
                outcome.extend((None, exc))
                done.set()
            return
        with lock:
            if abandoned:
                r.close()
                return
            outcome.append(r)
            done.set()

    threading.Thread(target=run, name="rqueue-connect", daemon=True).start()
    if not done.wait(timeout):
        with lock:
            if not done.is_set():
                abandoned = True
                raise ConnectionFailed(shown, f"no answer within {timeout:g} s (connect_timeout)")
    if outcome[0] is None:
        raise outcome[1]
    client: RedisClient = outcome[0]
    return client


def shut_connections(r: RedisClient) -> None:
    """Shuts down the socket of every connection of ``r``'s pools, those in
    use too, so that a call blocked on one (a server that accepts but never
    answers) wakes at once with a connection error. The thread that owns the
    connection then closes it (redis-py does on any error of a call), and an
    idle one is found shut at its next checkout, closed and made again.

    Shut down, not closed: a descriptor closed under another thread is free
    for the next socket any thread opens, and a call that had read the old
    number but not yet begun its wait would wait on that other socket,
    which no later cut-off reaches once its own owner closes it."""
    for pool in _pools(r):
        for conn in pool_connections(pool):
            shut(conn)


def shut(conn: Any) -> None:
    """Shuts down ``conn``'s socket, if it has one, without closing it."""
    conn = getattr(conn, "_conn", conn)  # a client-side cache's proxy wraps the connection
    if getattr(conn, "pid", None) != os.getpid():
        return  # the socket is shared with the process that made it: its copy is dropped, not shut
    sock = getattr(conn, "_sock", None)  # redis-py's connection keeps its socket there
    if not isinstance(sock, socket.socket):  # none yet, or memory://'s, which never blocks
        return
    with contextlib.suppress(OSError):  # closed meanwhile by its owner, or not connected yet
        # The plain socket's shutdown, also for TLS: SSLSocket.shutdown
        # first unwraps it, and the owner's thread could then send or read
        # plaintext on the TLS connection before the shutdown.
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


def pool_connections(pool: Any) -> list[Any]:
    """The connections of a redis-py pool, idle and in use."""
    with pool._lock:
        if hasattr(pool, "_in_use_connections"):  # ConnectionPool, SentinelConnectionPool
            return [*pool._available_connections, *pool._in_use_connections]
        return [c for c in getattr(pool, "_connections", ()) if c is not None]  # BlockingConnectionPool


def _pools(r: RedisClient) -> list[Any]:
    if isinstance(r, redis.RedisCluster):
        nodes = r.get_nodes()  # type: ignore[no-untyped-call]  # unannotated in redis-py
        return [node.redis_connection.connection_pool for node in nodes if node.redis_connection]
    return [r.connection_pool]

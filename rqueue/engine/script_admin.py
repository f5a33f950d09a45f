"""The administrator's side of the scripts (``rqueue scripts``): load
them, or find which ones each server holds, on every server a client
reaches. A cluster's replicas and a Sentinel service's replicas are
included: SCRIPT LOAD is not replicated, and a promoted replica starts with
an empty script cache. The application's user then needs EVALSHA only
(docs/ACL.md); rqueue.engine.scripts raises ScriptsNotLoaded when a script
is missing and it may not load it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.cluster import PRIMARY, REPLICA, ClusterNode
from redis.exceptions import NoPermissionError
from redis.sentinel import SentinelConnectionPool

from ..connection.open import RedisClient
from ..connection.urls import describe
from .commands import text
from .scripts import Script


def load_everywhere(r: RedisClient, by_name: Mapping[str, Script]) -> list[ServerScripts]:
    """SCRIPT LOAD of each script of ``by_name`` on every server ``r`` reaches
    (see :func:`servers`), one round trip per server. A server that
    refuses or cannot be reached is reported in its entry's ``error``;
    the others are loaded all the same."""
    out = []
    with servers(r) as found:
        for server in found:
            entry = ServerScripts(server.name, server.role)
            try:
                pipe = server.client.pipeline(transaction=False)
                for script in by_name.values():
                    pipe.script_load(script.text)
                replies = pipe.execute(raise_on_error=False)
            except (redis.RedisError, OSError) as exc:
                entry.error = _why(exc)
            else:
                for (name, script), reply in zip(by_name.items(), replies, strict=True):
                    if isinstance(reply, Exception):
                        entry.error = entry.error or _why(reply)
                    elif text(reply) == script.sha:
                        entry.held.append(name)
                    else:  # the server hashed another text: never seen, but never hidden
                        entry.error = entry.error or f"SCRIPT LOAD of {name} answered {text(reply)!r}, not {script.sha}"
            out.append(entry)
    return out


def where_held(r: RedisClient, by_name: Mapping[str, Script]) -> list[ServerScripts]:
    """Which scripts of ``by_name`` each server ``r`` reaches holds (SCRIPT
    EXISTS, one round trip per server); a server that cannot be asked
    has its ``error``."""
    out = []
    with servers(r) as found:
        for server in found:
            entry = ServerScripts(server.name, server.role)
            try:
                held = server.client.script_exists(*(s.sha for s in by_name.values()))
            except (redis.RedisError, OSError) as exc:
                entry.error = _why(exc)
            else:
                entry.held = [name for name, there in zip(by_name, held, strict=True) if there]
            out.append(entry)
    return out


@dataclass
class ServerScripts:
    """rqueue's scripts on one server."""

    #: The server's address, "host:port" (or a Unix socket's path).
    server: str
    #: "primary" or "replica" (of a cluster or a Sentinel service), or
    #: "server" for a URL of one server, whose role is not asked.
    role: str
    #: The names of the scripts the server holds (or has just loaded).
    held: list[str] = field(default_factory=list)
    #: Why the server could not be asked, or refused (e.g. an ACL without SCRIPT LOAD).
    error: str | None = None


@dataclass(frozen=True)
class Server:
    """One server a client reaches, with a client of its own."""

    name: str
    role: str
    client: Any


@contextmanager
def servers(r: RedisClient) -> Iterator[list[Server]]:
    """Every server ``r`` reaches: each node of a cluster (replicas too);
    a Sentinel service's primary and the replicas the sentinels report
    (clients made for them are closed at the end); else the one server."""
    if isinstance(r, redis.RedisCluster):
        yield [
            Server(node.name, "replica" if node.server_type == REPLICA else "primary", r.get_redis_connection(node))
            for node in sorted(_cluster_nodes(r), key=lambda n: (n.server_type == REPLICA, n.name))
        ]
        return
    pool = r.connection_pool
    if not isinstance(pool, SentinelConnectionPool):
        yield [Server(_address(r), "server", r)]
        return
    host, port = pool.get_master_address()  # type: ignore[no-untyped-call]  # unannotated in redis-py
    found = [Server(f"{host}:{port}", "primary", r)]
    # The replicas' clients take the primary's connection settings
    # (credentials, TLS, timeouts) on plain connections.
    kwargs = {k: v for k, v in pool.connection_kwargs.items() if k not in ("connection_pool", "host", "port")}
    plain = redis.SSLConnection if issubclass(pool.connection_class, redis.SSLConnection) else redis.Connection
    try:
        for host, port in pool.sentinel_manager.discover_slaves(pool.service_name):
            replica = redis.Redis(
                connection_pool=redis.ConnectionPool(connection_class=plain, host=host, port=port, **kwargs)
            )
            found.append(Server(f"{host}:{port}", "replica", replica))
        yield found
    finally:
        for server in found[1:]:
            server.client.close()


def _cluster_nodes(r: redis.RedisCluster) -> list[ClusterNode]:
    """The nodes of the cluster's map, and the replicas that CLUSTER NODES
    names beside them: CLUSTER SLOTS (the map) leaves out a replica that
    has not yet copied a write (Redis 7), as in a new cluster. Nodes marked
    failing, without address or in handshake are left out."""
    found = {node.name: node for node in r.get_nodes()}  # type: ignore[no-untyped-call]  # unannotated in redis-py
    try:
        listed = r.cluster_nodes()
    except (redis.RedisError, OSError):  # refused by an ACL without CLUSTER NODES: the map alone
        listed = {}
    for address, info in listed.items():
        flags = str(info.get("flags", "")).split(",")
        if address in found or {"fail", "noaddr", "handshake"} & set(flags):
            continue
        host, _, port = address.rpartition(":")
        role = REPLICA if "slave" in flags else PRIMARY
        found[address] = ClusterNode(host, int(port), role)  # type: ignore[no-untyped-call]  # unannotated in redis-py
    return list(found.values())


def _address(r: redis.Redis) -> str:
    if type(r).__module__.startswith("fakeredis"):  # memory://: its host is a random name
        return "memory"
    kwargs = r.connection_pool.connection_kwargs
    if kwargs.get("path"):
        return str(kwargs["path"])
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"


def _why(exc: BaseException) -> str:
    if isinstance(exc, NoPermissionError):
        return f"refused: {exc}"
    return describe(exc)

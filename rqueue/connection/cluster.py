"""Redis Cluster: the client, and the errors that prove a call never ran
(the only ones retried, since a script sent again could apply twice)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import PRIMARY, ClusterNode
from redis.crc import key_slot
from redis.retry import Retry
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential_jitter

from ..errors import ConnectionFailed, InvalidURL
from .urls import CLUSTER_SCHEMES, describe, scrub

T = TypeVar("T")
Retrier = Callable[[Callable[[], T]], T]


def no_retry(call: Callable[[], T]) -> T:
    """The Retrier of a single server: the call once."""
    return call()


# Errors a Redis Cluster gives while a failover or resharding is under way
# that prove the command did not run, so that sending it again cannot apply
# it twice. A reply lost after the command was sent (a timeout, a reset
# connection) proves nothing and is never retried here: a script is not
# idempotent (a publish without id would be stored twice).
CLUSTER_NOT_RUN: tuple[type[BaseException], ...] = (
    redis.exceptions.ClusterDownError,  # also MasterDownError
    redis.exceptions.TryAgainError,
    redis.exceptions.MovedError,
    redis.exceptions.AskError,
    redis.exceptions.SlotNotCoveredError,
    redis.exceptions.ReadOnlyError,  # a demoted primary refused the write, until the slot map is refreshed
    redis.exceptions.BusyLoadingError,
)


def not_run(exc: BaseException | None) -> bool:
    """True when ``exc`` proves that the command it answers never ran: one of
    CLUSTER_NOT_RUN, or a connection that could not even be opened (redis-py
    says "Error N connecting to host:port" or "Timeout connecting to ...").
    redis-py's "cluster cannot be connected" counts only when it did not
    replace another error (it is raised while refreshing the slot map, also
    right after a reply was lost). redis-py's "TTL exhausted" counts: it
    comes only after every attempt was redirected or refused."""
    if exc is None:
        return False
    if isinstance(exc, CLUSTER_NOT_RUN):
        return True
    text = str(exc)
    if isinstance(exc, redis.exceptions.ConnectionError) and not isinstance(exc, redis.exceptions.AuthenticationError):
        return " connecting to " in text
    if isinstance(exc, redis.exceptions.TimeoutError):
        return text.startswith("Timeout connecting to")
    if type(exc) is redis.exceptions.ClusterError and text == "TTL exhausted.":
        # redis-py followed MOVED / ASK and waited out TRYAGAIN (a slot whose
        # keys are split by a migration) until its own budget ran out: every
        # attempt was refused, none ran.
        return True
    if isinstance(exc, redis.exceptions.RedisClusterException) and "cannot be connected" in text:
        return exc.__context__ is None or not_run(exc.__context__)
    return False


class RedirectableCluster(redis.RedisCluster):
    """redis-py's RedisCluster, which can follow an ASK redirect to a node
    its slot map does not list yet. A primary added to a cluster serves no
    slot, so CLUSTER SLOTS does not name it, until a resharding moves a slot
    to it; while the slot migrates, the old node answers ASK naming it, and
    redis-py looks the name up in its map, finds nothing and fails with an
    AttributeError (which ended a worker). Here an unknown node named by
    ``host:port`` is added to the map as a primary, as redis-py does for a
    MOVED."""

    def get_node(self, host: str | None = None, port: int | None = None, node_name: str | None = None) -> Any:
        node = super().get_node(host, port, node_name)  # type: ignore[no-untyped-call]  # unannotated in redis-py
        if node is not None or not node_name or ":" not in node_name:
            return node
        name_host, _, name_port = node_name.rpartition(":")
        if not name_port.isdigit():
            return None
        manager = self.nodes_manager
        with manager._lock:  # redis-py guards its map with this lock
            node = manager.nodes_cache.get(node_name)
            if node is None:
                node = ClusterNode(name_host, int(name_port), PRIMARY)  # type: ignore[no-untyped-call]  # unannotated in redis-py
                manager.nodes_cache[node.name] = node
        return node


def cluster_redis(url: str, shown: str, options: dict[str, Any]) -> Any:
    """A RedisCluster client for ``redis+cluster://host:port`` (any one node).
    Raises ConnectionFailed when no node answers or the server is not a
    cluster."""
    node_url = CLUSTER_SCHEMES[url.split("://", 1)[0]] + "://" + url.split("://", 1)[1]
    db = urlsplit(shown).path.strip("/")
    if db not in ("", "0"):
        raise InvalidURL(shown, f"a Redis Cluster has only database 0, not {db}")
    options.pop("health_check_interval", None)
    # redis-py would send a command again after a lost reply (ten times by
    # default): a script could run twice. rqueue retries what never ran.
    options.setdefault("retry", Retry(NoBackoff(), 0))
    try:
        return RedirectableCluster.from_url(node_url, **options)
    except (redis.RedisError, redis.exceptions.RedisClusterException, OSError) as exc:
        text = scrub(describe(exc), url)
        if "cluster mode is not enabled" in text.lower() or "cluster support disabled" in text.lower():
            text = "the server is not a Redis Cluster (use redis:// for a single server)"
        raise ConnectionFailed(shown, text) from None


def cluster_retry(timeout: float, idempotent: bool = False) -> Retrier[Any]:
    """Retries a call through the errors a cluster gives while its topology
    changes (failover, resharding, a restarted node) for up to ``timeout``
    seconds, but only errors that prove the call did not run
    (errors.not_run): a lost reply is raised, as on a single server, since
    a script sent again could be applied twice. An ``idempotent`` call (a
    read, SADD, HSETNX) is retried after any connection error too. redis-py
    refreshes its map of slots to nodes on the way."""

    def worth_retrying(exc: BaseException) -> bool:
        return not_run(exc) or (idempotent and isinstance(exc, (redis.ConnectionError, redis.TimeoutError)))

    retrying = Retrying(
        retry=retry_if_exception(worth_retrying),
        stop=stop_after_delay(timeout),
        wait=wait_exponential_jitter(multiplier=0.05, max=1.0, jitter=0.05),
        reraise=True,
    )
    return lambda call: retrying(call)


# Both clients keep the slot map in memory (read without I/O).
_CLUSTERS = (redis.RedisCluster, redis.asyncio.RedisCluster)


def slot_of(key: str) -> int:
    """The cluster slot of ``key`` (of its hash tag, when it has one)."""
    return int(key_slot(key.encode("utf-8", "surrogateescape")))


def primary_names(r: Any) -> list[str]:
    """The names (host:port) of a cluster's primaries as the client's slot
    map knows them, sorted; [] for a client of one server."""
    if not isinstance(r, _CLUSTERS):
        return []
    return sorted(str(node.name) for node in r.get_primaries())


def slot_owner(r: Any, slot: int) -> str:
    """The name of the primary that serves ``slot`` in the client's slot
    map, or "" for a client of one server (or a slot no node covers)."""
    if not isinstance(r, _CLUSTERS):
        return ""
    nodes = r.nodes_manager.slots_cache.get(slot)
    return str(nodes[0].name) if nodes else ""

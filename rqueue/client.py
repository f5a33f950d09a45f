"""Connecting to Redis, and the client object that hands out queues."""

from __future__ import annotations

import logging
import re
import threading
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from . import constants as C
from .clock import SYSTEM_CLOCK, Clock
from .errors import ConnectionFailed, CorruptRecord, InvalidInput, InvalidSetting, InvalidURL, ServerTooOld
from .keys import partitions_key, registry_key
from .names import check_name
from .notify import Notifier
from .randomness import Randomness
from .scripts import Retrier, Scripts, no_retry
from .settings import DEAD_LETTER_MODES, Settings, SettingsStore, validate

if TYPE_CHECKING:
    from .partitions import PartitionedQueue
    from .queue import Queue

log = logging.getLogger("rqueue")

SCHEMES = ("redis", "rediss", "unix", "memory", "redis+cluster", "rediss+cluster", "redis+sentinel", "rediss+sentinel")
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}  # -> the scheme of one node's URL
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")  # rqueue.sentinel
CONNECT_TIMEOUT = 5.0  # seconds to open a TCP connection
SOCKET_TIMEOUT = 30.0  # seconds to wait for any one reply

_memory_servers: dict[str, Any] = {}
_memory_lock = threading.Lock()


# Also prefixed names such as ssl_password (a TLS key's passphrase).
_SECRET_PARAM = re.compile(r"([?&;](?:\w+_)?(?:password|pass|pwd|passwd|secret|token)=)([^&;#]*)", re.IGNORECASE)


def _split_secrets(url: str) -> tuple[str, str, str, str]:
    """``url`` as (scheme with "://", user and ":" or "", password, the rest
    from "@" or the whole authority when there is no password).

    The user info ends at the last "@" before the query; an "@" after a "?"
    still ends it when no query argument comes before it (the "?" is then
    part of the password). A password may thus hold "/", "#" or "?", which a
    URL parser would take as the end of the host.
    """
    head, sep, rest = url.partition("://")
    if not sep:
        head, rest = "", url
    query = rest.find("?")
    at = rest.rfind("@", 0, query if query != -1 else len(rest))
    if query != -1:
        later = rest.rfind("@")
        if later > query and "=" not in rest[query:later]:
            at = later
    if at != -1:
        user, colon, password = rest[:at].partition(":")
        if colon:
            return head + sep, user + ":", password, rest[at:]
    return head + sep, "", "", rest


def mask_url(url: str) -> str:
    """``url`` with any password replaced by ``***``, for messages and logs:
    the password of ``user:password@host`` (also without a scheme) and one
    given as a query argument (``?password=...``)."""
    head, user, password, rest = _split_secrets(url)
    if password or user:
        rest = "***" + rest
    return head + user + _SECRET_PARAM.sub(r"\1***", rest)


def _scrub(text: str, url: str) -> str:
    """``text`` (e.g. an error from redis-py) without any password of ``url``
    in it, nor a piece of one (a parser may have split it at a "/")."""
    secrets = [m.group(2) for m in _SECRET_PARAM.finditer(url)]
    password = _split_secrets(url)[2]
    if password:
        secrets += [password, *re.split(r"[/?#@:]", password)]
    for secret in sorted({s for s in secrets if len(s) >= 3}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def _check_db(shown: str) -> None:
    """redis-py quietly uses db 0 for a path that is not a number; refuse it
    (a typo must not put queues into another database)."""
    path = urlsplit(shown).path
    if path not in ("", "/") and not (path[1:].isascii() and path[1:].isdigit()):
        raise InvalidURL(shown, f"the path {path!r} is not a database number (use /0, /1, ...)")


def _memory_redis(url: str) -> Any:
    try:
        import fakeredis
    except ImportError:  # pragma: no cover - depends on the install
        raise InvalidURL(url, "memory:// needs fakeredis with Lua: pip install 'rqueue[memory]'") from None
    name = urlsplit(url).netloc or "default"
    with _memory_lock:
        server = _memory_servers.get(name)
        if server is None:
            server = _memory_servers[name] = fakeredis.FakeServer()
    return fakeredis.FakeRedis(server=server)


def server_version(r: Any) -> str:
    info = r.info("server")
    return str(info.get("valkey_version") or info.get("redis_version") or "0")


def _parse_version(version: str) -> tuple[int, ...]:
    out = []
    for part in version.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits or 0))
    return tuple(out)


def _check_server(r: Any, url: str) -> None:
    if isinstance(r, redis.RedisCluster):
        for node in r.get_primaries():
            _check_server(node.redis_connection or r.get_redis_connection(node), url)
        return
    version = server_version(r)
    if _parse_version(version) < C.MIN_SERVER_VERSION:
        raise ServerTooOld(version, ".".join(map(str, C.MIN_SERVER_VERSION)))
    try:
        reply = r.config_get("maxmemory-policy")
    except redis.ResponseError:
        return  # CONFIG may be refused by ACLs; the check is advice only
    # redis-py decodes the keys and values of CONFIG GET (str), older
    # versions and decode_responses=False clients may not (bytes)
    policy = reply.get("maxmemory-policy", reply.get(b"maxmemory-policy"))
    if isinstance(policy, bytes):
        policy = policy.decode(errors="replace")
    if policy not in (None, "noeviction"):
        log.warning(
            "Redis at %s has maxmemory-policy %s: under memory pressure it may evict "
            "queue data; set maxmemory-policy noeviction",
            mask_url(url),
            policy,
        )


def connect(
    url: str = "memory://",
    *,
    prefix: str = C.DEFAULT_PREFIX,
    clock: Clock | None = None,
    randomness: Randomness | None = None,
    dlq_prefix: str = C.DEFAULT_DLQ_PREFIX,
    dlq_suffix: str = C.DEFAULT_DLQ_SUFFIX,
    settings_ttl: float = C.SETTINGS_CACHE_TTL,
    failover_timeout: float = C.FAILOVER_TIMEOUT,
    durable_replicas: int = C.DURABLE_REPLICAS,
    durable_timeout: float = C.DURABLE_TIMEOUT,
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
    server cannot be reached or is not Redis, ServerTooOld for Redis < 6.2.
    """
    if not isinstance(url, str):
        if isinstance(url, (bytes, bytearray)):  # shown masked, like any URL
            raise InvalidURL(mask_url(bytes(url).decode("utf-8", "replace")), "must be a str, not bytes")
        raise InvalidURL(f"<{type(url).__name__}>", f"must be a str, not {type(url).__name__}")
    shown = mask_url(url)
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme not in SCHEMES:
        raise InvalidURL(shown, f"scheme must be one of {', '.join(s + '://' for s in SCHEMES)}")
    check_name("key prefix", prefix)
    _check_durable(failover_timeout, durable_replicas, durable_timeout)
    if scheme == "memory":
        try:
            r = _memory_redis(url)
        except ValueError as exc:
            raise InvalidURL(shown, _scrub(str(exc), url)) from None
    else:
        options = {
            "socket_connect_timeout": CONNECT_TIMEOUT,
            # Scripts do bounded work, so a reply that takes this long means a
            # dead connection: the call fails (and a worker retries) instead
            # of hanging on a half-open socket.
            "socket_timeout": SOCKET_TIMEOUT,
            "health_check_interval": 30,
        }
        if scheme != "unix":  # TCP only
            options["socket_keepalive"] = True
        options.update(redis_options)
        try:
            if scheme != "unix" and scheme not in SENTINEL_SCHEMES:  # a sentinel URL's path is /service[/db]
                _check_db(shown)
            if scheme in CLUSTER_SCHEMES:
                r = _cluster_redis(url, shown, options)
            elif scheme in SENTINEL_SCHEMES:
                from .sentinel import sentinel_redis  # here: rqueue.sentinel imports this module

                r = sentinel_redis(url, shown, options)
            else:
                r = redis.Redis.from_url(url, **options)
        except InvalidURL:
            raise  # an InvalidURL is a ValueError too; wrapping it would say "invalid URL" twice
        except ValueError as exc:
            raise InvalidURL(shown, _scrub(str(exc), url)) from None
    try:
        r.ping()
        if scheme != "memory":  # fakeredis has no INFO; it is as new as its Lua
            _check_server(r, url)
    except ServerTooOld:
        r.close()
        raise
    except (redis.RedisError, OSError) as exc:
        r.close()
        raise ConnectionFailed(shown, _scrub(_describe(exc), url)) from None
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


def _check_durable(failover_timeout: float, durable_replicas: int, durable_timeout: float) -> None:
    for what, value in (("failover_timeout", failover_timeout), ("durable_timeout", durable_timeout)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 3600:
            raise InvalidInput(f"{what} must be a number of seconds from 0 to 3600 (not 0), not {value!r}")
    if isinstance(durable_replicas, bool) or not isinstance(durable_replicas, int) or not 0 <= durable_replicas <= 100:
        raise InvalidInput(f"durable_replicas must be a whole number from 0 to 100, not {durable_replicas!r}")


def _cluster_redis(url: str, shown: str, options: dict[str, Any]) -> Any:
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
        return redis.RedisCluster.from_url(node_url, **options)
    except (redis.RedisError, redis.exceptions.RedisClusterException, OSError) as exc:
        text = _scrub(_describe(exc), url)
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
    from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential_jitter

    from .errors import not_run

    def worth_retrying(exc: BaseException) -> bool:
        return not_run(exc) or (idempotent and isinstance(exc, (redis.ConnectionError, redis.TimeoutError)))

    retrying = Retrying(
        retry=retry_if_exception(worth_retrying),
        stop=stop_after_delay(timeout),
        wait=wait_exponential_jitter(multiplier=0.05, max=1.0, jitter=0.05),
        reraise=True,
    )
    return lambda call: retrying(call)


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, redis.ConnectionError) and "Protocol" in text or isinstance(exc, redis.InvalidResponse):
        return f"the server does not speak the Redis protocol ({text})"
    if isinstance(exc, redis.AuthenticationError):
        return "authentication failed"
    if isinstance(exc, redis.ConnectionError) and "reset by peer" in text:
        return f"{text} (a TLS port? TLS needs a rediss:// URL)"
    return text


class Client:
    """A connection to one Redis, with its scripts, settings and queues.

    Thread-safe: redis-py pools connections, so one client can serve many
    threads.
    """

    def __init__(
        self,
        redis_client: Any,
        *,
        url: str = "",
        prefix: str = C.DEFAULT_PREFIX,
        clock: Clock | None = None,
        randomness: Randomness | None = None,
        dlq_prefix: str = C.DEFAULT_DLQ_PREFIX,
        dlq_suffix: str = C.DEFAULT_DLQ_SUFFIX,
        settings_ttl: float = C.SETTINGS_CACHE_TTL,
        retry: Retrier[Any] = no_retry,
        idempotent_retry: Retrier[Any] = no_retry,
    ) -> None:
        self.redis = redis_client
        #: Whether this is a Redis Cluster client (redis+cluster://).
        self.cluster = isinstance(redis_client, redis.RedisCluster)
        #: Replicas that must acknowledge a durable publish, and seconds to wait.
        self.durable_replicas = C.DURABLE_REPLICAS
        self.durable_timeout = C.DURABLE_TIMEOUT
        #: Seconds a cluster client retries through a failover.
        self.failover_timeout = C.FAILOVER_TIMEOUT
        #: Per node: what durable publishes learned it supports (rqueue.durable).
        self.durable_state: dict[str, Any] = {}
        self.url = url
        self.prefix = prefix
        self.clock = clock or SYSTEM_CLOCK
        self.randomness = randomness or Randomness()
        self.dlq_prefix = dlq_prefix
        self.dlq_suffix = dlq_suffix
        self.scripts = Scripts(redis_client, retry)
        #: Wraps plain commands that may safely be sent twice (reads, SADD, HSETNX).
        self.idempotent = idempotent_retry
        self.settings = SettingsStore(redis_client, prefix, self.clock.monotonic, settings_ttl, idempotent_retry)
        self.notifier = Notifier(redis_client)
        self._registered: set[str] = set()
        self._partitioned: dict[str, tuple[int, float]] = {}  # queue -> (partitions, monotonic time read)

    def configure(self, pattern: str, **settings: Any) -> None:
        """Stores settings for every queue whose name matches ``pattern``
        (``*`` = one word, ``#`` = any number of words), for all processes.

        Raises InvalidSetting (naming the setting) or InvalidName; nothing is
        stored then.
        """
        target = validate(settings).get("dead_letter") if self.cluster else None
        if target is not None and target not in DEAD_LETTER_MODES:
            from .queue import CLUSTER_DEAD_LETTER

            raise InvalidSetting("dead_letter", target, CLUSTER_DEAD_LETTER)
        self.settings.configure(pattern, settings)

    def resolved_settings(self, queue: str) -> Settings:
        """The settings that apply to ``queue`` now."""
        return self.settings.resolve(queue)[0]

    def queue(self, name: str, partitions: int | None = None) -> Queue | PartitionedQueue:
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
        from .partitions import PartitionedQueue, check_partitions
        from .queue import Queue

        plain = Queue(self, name)  # checks the name
        count = self._partition_count(plain.root)
        if partitions is not None:
            count = self._create_partitioned(plain, check_partitions(partitions), count)
        return PartitionedQueue(self, name, count) if count > 1 else plain

    def _partition_count(self, root: str) -> int:
        """How many partitions queue ``root`` has (1 = not partitioned),
        re-read after the settings' cache time, like settings (a queue may
        be deleted and created again)."""
        now = self.clock.monotonic()
        seen = self._partitioned.get(root)
        if seen is not None and now - seen[1] < self.settings.ttl:
            return seen[0]
        raw = self.idempotent(lambda: self.redis.hget(partitions_key(self.prefix), root))
        count = 1
        if raw is not None:
            text = raw.decode("ascii", "replace")
            if not text.isdigit() or not 2 <= int(text) <= C.MAX_PARTITIONS:
                raise CorruptRecord(
                    f"{partitions_key(self.prefix)}[{root}]",
                    f"{text!r} is not a number of partitions from 2 to {C.MAX_PARTITIONS}",
                )
            count = int(text)
        self._partitioned[root] = (count, now)
        return count

    def _create_partitioned(self, plain: Queue, partitions: int, stored: int) -> int:
        if stored == partitions:
            return stored
        why = None
        if stored > 1:
            why = f"queue {plain.root!r} has {stored} partitions; the number cannot change"
        elif plain.name != plain.root:
            why = f"{plain.name!r} is a dead-letter queue: partition its queue {plain.root!r} instead"
        elif self.idempotent(lambda: self.redis.sismember(registry_key(self.prefix), plain.root)) or self.idempotent(
            lambda: self.redis.exists(plain.keys.meta, plain.keys.floors)
        ):
            why = f"queue {plain.root!r} already exists without partitions (it has messages or groups)"
        elif not self.idempotent(lambda: self.redis.hsetnx(partitions_key(self.prefix), plain.root, partitions)):
            # another process created it just now
            self._partitioned.pop(plain.root, None)
            return self._create_partitioned(plain, partitions, self._partition_count(plain.root))
        if why is not None:
            raise InvalidSetting("partitions", partitions, why)
        self._partitioned[plain.root] = (partitions, self.clock.monotonic())
        return partitions

    def queues(self) -> list[str]:
        """Names of every queue this prefix has written to, and of their
        dead-letter queues that hold or held messages, sorted."""
        names = sorted(m.decode() for m in self.redis.smembers(registry_key(self.prefix)))
        pipe = self.redis.pipeline(transaction=False)  # plain reads: safe to send again
        owners = []
        for name in names:
            q = self.queue(name)
            for part in getattr(q, "parts", [q]):
                pipe.exists(part.keys.dead_letters.meta)
                owners.append(name)
        dead = {self.dead_letter_name(n) for n, has in zip(owners, pipe.execute()) if has}
        return sorted(set(names) | dead)

    def dead_letter_name(self, queue: str) -> str:
        """Name of the default dead-letter queue of ``queue``."""
        return self.dlq_prefix + queue + self.dlq_suffix

    def node_for(self, key: str) -> tuple[Any, str]:
        """A client of the one server that holds ``key`` (on a cluster: the
        primary serving its slot now), and that server's name."""
        if not self.cluster:
            return self.redis, ""
        node = self.redis.get_node_from_key(key)
        return self.redis.get_redis_connection(node), node.name

    def refresh_topology(self) -> None:
        """Reads the cluster's map of slots to nodes again (after a failover)."""
        if self.cluster:
            self.redis.nodes_manager.initialize()

    def _register(self, name: str) -> None:
        # The registry is a global key, outside every queue's hash slot, so it
        # is written beside the scripts rather than by them.
        if name not in self._registered:
            try:
                self.idempotent(lambda: self.redis.sadd(registry_key(self.prefix), name))
            except (redis.ConnectionError, redis.TimeoutError, redis.exceptions.ClusterError) as exc:
                # called after a publish or join was applied: failing it would
                # report a stored message as not stored; the next use tries again
                log.warning("could not record queue %r in the list of queues (%s); will try again", name, exc)
                return
            self._registered.add(name)

    def close(self) -> None:
        self.notifier.close()
        self.scripts.close()
        self.redis.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""Redis Sentinel URLs: failover without a cluster.

A Redis Cluster shards keys and fails over by itself, but it is a different
deployment (hash slots, every node in cluster mode). Many sites instead run
one primary with replicas and Redis Sentinel, which watches the primary and
promotes a replica when it dies. rqueue keeps every queue's keys on one
server anyway, so such a setup serves it as it is; what the client needs is
to ask the sentinels where the primary is::

    redis+sentinel://[user:password@]host1:port1[,host2:port2...]/service_name[/db]
    rediss+sentinel://...                       (TLS to the sentinels and the servers)

``service_name`` is the name the sentinels monitor the primary under
(``sentinel monitor <service_name> ...``); a host without a port means port
26379. The user and password are those of the Redis servers; sentinels that
want a password of their own get it as ``?sentinel_password=...`` (and
``?sentinel_username=...``). Other query arguments are redis-py's connection
options (``?socket_timeout=2``...).

The client is redis-py's ``Sentinel(...).master_for(service_name)``: every
new connection asks the sentinels for the primary, and a connection that
breaks or finds its server demoted (READONLY) is dropped, so after a failover
the next calls go to the promoted replica. The calls that fail meanwhile
raise connection errors, which a Worker retries (``reconnect_timeout``) and a
producer may retry with the same message ids.

Replication is asynchronous: a write the dead primary had not passed on is
lost, which ``publish(durable=True)`` (WAIT for a replica) guards against.
An old primary that still runs (``SENTINEL FAILOVER``, a network partition)
keeps taking writes on open connections until the sentinels demote it (up to
about 10 s); they are lost when it resyncs. Durable publishes are not
confirmed there (its replicas have moved), and ``min-replicas-to-write 1`` on
the servers makes it refuse them instead.

:class:`EmbeddedSentinelGroup` starts a primary, replicas and sentinels on
loopback for tests and benchmarks.
"""

from __future__ import annotations

import re
import shlex
import time
from typing import Any
from urllib.parse import parse_qs, quote, unquote

import redis
from redis.backoff import NoBackoff
from redis.connection import URL_QUERY_ARGUMENT_PARSERS
from redis.retry import Retry
from redis.sentinel import Sentinel

from .client import CONNECT_TIMEOUT, _describe, _scrub, _split_secrets
from .embedded import EmbeddedServer, find_binary
from .errors import ConnectionFailed, InvalidURL, RQueueError

SENTINEL_PORT = 26379  # a sentinel's port when the URL gives none
_ADDRESS = re.compile(r"(?:\[([0-9A-Fa-f:.]+)\]|([\w.-]+))(?::(\d{1,5}))?")


class SentinelRedis(redis.Redis):
    """The client of the primary; closing it also closes the connections to
    the sentinels."""

    sentinel: Sentinel | None = None

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self.sentinel is not None:
                self.sentinel.close()


def sentinel_redis(url: str, shown: str, options: dict[str, Any]) -> SentinelRedis:
    """A client of the primary that the sentinels of ``url`` name, with the
    redis client ``options`` (and the URL's query arguments). ``shown`` is
    ``url`` with its passwords masked, for messages.

    Raises InvalidURL for a URL of the wrong form, ConnectionFailed when no
    sentinel answers, none knows the service, or none reports a healthy
    primary for it."""

    def invalid(why: str) -> InvalidURL:
        return InvalidURL(shown, _scrub(why, url))

    _, user, password, rest = _split_secrets(url)
    if user:  # "user:password@..."; rest starts at the "@"
        username, rest = user[:-1], rest[1:]
    else:  # "user@..." or no user at all
        username = rest.partition("/")[0].rpartition("@")[0]
        rest = rest[len(username) + 1 :] if username else rest
    rest, _, query = rest.partition("?")
    hosts, _, path = rest.partition("/")
    addresses: list[tuple[str, int]] = []
    for entry in hosts.split(","):
        match = _ADDRESS.fullmatch(entry)
        port = int(match.group(3) or SENTINEL_PORT) if match else 0
        if not 1 <= port <= 65535:
            raise invalid(
                f"bad sentinel address {entry!r}: expected host:port with a port from 1 to 65535, "
                "several separated by commas"
            )
        addresses.append((match.group(1) or match.group(2), port))  # type: ignore[union-attr]
    service, _, db = path.partition("/")
    if not service:
        raise invalid(
            "no service name: give the name the sentinels monitor the primary under, "
            "as in redis+sentinel://host:26379/mymaster[/db]"
        )
    db = db.removesuffix("/")
    if db and not (db.isascii() and db.isdigit()):
        raise invalid(f"the database {db!r} is not a number (use /{service}/0, /{service}/1, ...)")
    server = dict(options, db=int(db or 0), ssl=url.startswith("rediss+"))
    sentinel_auth: dict[str, str] = {}
    for name, values in parse_qs(query).items():
        if name in ("sentinel_password", "sentinel_username"):
            sentinel_auth[name.removeprefix("sentinel_")] = values[-1]
        elif name in URL_QUERY_ARGUMENT_PARSERS and name != "db":
            try:
                server[name] = URL_QUERY_ARGUMENT_PARSERS[name](values[-1])
            except (TypeError, ValueError):
                raise invalid(f"bad value for the query argument {name!r}") from None
        elif name.startswith("ssl_") or name == "client_name":
            server[name] = values[-1]
        elif name == "db":
            raise invalid(f"give the database in the path (/{service}/<db>), not as ?db=")
        else:
            raise invalid(
                f"unknown query argument {name!r} (sentinel_password, sentinel_username, "
                "or a redis-py connection option)"
            )
    if username or password:
        server.update(username=unquote(username) or None, password=unquote(password) or None)
    # The sentinels get the socket and TLS options and their own credentials;
    # no retries and at most CONNECT_TIMEOUT per reply, as the next sentinel
    # is the retry (redis-py's default retries a dead one for seconds, and
    # every new connection asks them).
    to_sentinels = {k: v for k, v in server.items() if k.startswith(("socket_", "ssl"))}
    to_sentinels["socket_timeout"] = min(server.get("socket_timeout") or CONNECT_TIMEOUT, CONNECT_TIMEOUT)
    sentinel = Sentinel(addresses, sentinel_kwargs={"retry": Retry(NoBackoff(), 0), **to_sentinels, **sentinel_auth})
    service = unquote(service)
    try:
        _find_primary(sentinel, service, [f"{h}:{p}" for h, p in addresses], shown, url)
    except BaseException:
        sentinel.close()
        raise
    client = sentinel.master_for(service, redis_class=SentinelRedis, **server)
    client.sentinel = sentinel
    return client


def _find_primary(sentinel: Sentinel, service: str, where: list[str], shown: str, url: str) -> None:
    """Asks each sentinel in turn until one reports a healthy primary for
    ``service``; raises ConnectionFailed saying why none did."""
    answered: list[str] = []
    failures: list[str] = []
    unhealthy = False
    for node, address in zip(sentinel.sentinels, where):
        try:
            masters = node.sentinel_masters()
        except redis.AuthenticationError:
            failures.append(
                f"{address}: authentication failed (the URL's password is for the Redis servers; "
                "give the sentinels' as ?sentinel_password=...)"
            )
            continue
        except redis.ResponseError as exc:  # e.g. a plain Redis server: unknown command 'SENTINEL'
            failures.append(f"{address} is not a sentinel: {_describe(exc)}")
            continue
        except (redis.RedisError, OSError) as exc:
            failures.append(f"{address}: {_describe(exc)}")
            continue
        answered.append(address)
        state = masters.get(service)
        if state and sentinel.check_master_state(state, service):
            return
        unhealthy |= bool(state)
    if unhealthy:
        why = f"the sentinels know service {service!r} but report no healthy primary (a failover under way?)"
    elif answered:
        why = f"no sentinel at {', '.join(answered)} knows service {service!r}"
    else:
        why = "no sentinel answered"
    if failures:
        why += f" ({'; '.join(failures)})"
    raise ConnectionFailed(shown, _scrub(why, url))


READY_TIMEOUT = 30.0  # seconds to wait for the sentinels to know every replica and each other


class EmbeddedSentinelGroup:
    """A primary with ``replicas`` replicas (``--replicaof``) and ``sentinels``
    sentinels (quorum: a majority) as child processes on loopback, each on
    its own free port with its own data directory (a sentinel rewrites its
    config file there). The sentinels declare the primary down after
    ``down_after_ms`` and fail over. ``password`` is the servers',
    ``sentinel_password`` the sentinels'. Use as a context manager or call
    :meth:`start` and :meth:`stop`."""

    def __init__(
        self,
        binary: str | None = None,
        replicas: int = 1,
        sentinels: int = 3,
        service: str = "mymaster",
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 3000,
        password: str | None = None,
        sentinel_password: str | None = None,
    ) -> None:
        self.binary = binary or find_binary(prefer="redis")
        self.replica_count, self.sentinel_count, self.service = replicas, sentinels, service
        self.down_after_ms, self.failover_timeout_ms = down_after_ms, failover_timeout_ms
        self.password, self.sentinel_password = password, sentinel_password
        self.servers: list[EmbeddedServer] = []  # the first primary, then the replicas
        self.sentinels: list[EmbeddedServer] = []

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        query = f"?sentinel_password={quote(self.sentinel_password)}" if self.sentinel_password else ""
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{auth}{hosts}/{self.service}{query}"

    def start(self) -> EmbeddedSentinelGroup:
        try:
            no_delay = ["--repl-diskless-sync-delay", "0"]  # full syncs at once (the default waits 5 s)
            primary = EmbeddedServer(self.binary, extra_args=no_delay).start()
            self.servers.append(primary)
            for _ in range(self.replica_count):
                args = [*no_delay, "--replicaof", "127.0.0.1", str(primary.port)]
                self.servers.append(EmbeddedServer(self.binary, extra_args=args).start())
            self._wait(lambda: all(self._in_sync(s) for s in self.servers[1:]), "the replicas to sync")
            if self.password:  # set once running: EmbeddedServer checks a start with a PING without password
                for server in self.servers[1:] + [primary]:
                    with redis.Redis(port=server.port) as r:
                        r.config_set("masterauth", self.password)
                        r.config_set("requirepass", self.password)
            for _ in range(self.sentinel_count):
                self.sentinels.append(self._start_sentinel(primary.port))
            if self.sentinel_password:
                for s in self.sentinels:
                    with redis.Redis(port=s.port) as r:
                        r.execute_command("ACL", "SETUSER", "default", "resetpass", f">{self.sentinel_password}")
            self._wait(self._sentinels_ready, "the sentinels to know every replica and each other")
        except BaseException:
            self.stop()
            raise
        return self

    def _start_sentinel(self, primary_port: int) -> EmbeddedServer:
        sentinel = EmbeddedServer(self.binary)
        sentinel.data_dir.mkdir(parents=True, exist_ok=True)
        lines = [
            f"sentinel monitor {self.service} 127.0.0.1 {primary_port} {self.sentinel_count // 2 + 1}",
            f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}",
            f"sentinel failover-timeout {self.service} {self.failover_timeout_ms}",
        ]
        if self.password:
            lines.append(f"sentinel auth-pass {self.service} {self.password}")
        if self.sentinel_password:
            lines.append(f"sentinel sentinel-pass {self.sentinel_password}")
        config = sentinel.data_dir / "sentinel.conf"
        config.write_text("\n".join(lines) + "\n")
        # Sentinel mode needs the config file as the first argument, before
        # the options EmbeddedServer passes: a wrapper puts it there.
        wrapper = sentinel.data_dir / "sentinel.sh"
        wrapper.write_text(f'#!/bin/sh\nexec {shlex.quote(self.binary)} {shlex.quote(str(config))} --sentinel "$@"\n')
        wrapper.chmod(0o755)
        sentinel.binary = str(wrapper)
        return sentinel.start()

    def _in_sync(self, server: EmbeddedServer) -> bool:
        with redis.Redis(port=server.port, password=self.password) as r:
            info = r.info("replication")
        return info.get("master_link_status") == "up" and info.get("master_sync_in_progress") == 0

    def _ask(self, sentinel: EmbeddedServer, command: str, *args: Any) -> Any:
        """Calls redis-py's ``sentinel_<command>`` (which parses the reply) on ``sentinel``."""
        with redis.Redis(port=sentinel.port, password=self.sentinel_password, socket_timeout=2) as r:
            return getattr(r, f"sentinel_{command}")(*args)

    def _sentinels_ready(self) -> bool:
        for s in self.sentinels:
            replicas = self._ask(s, "slaves", self.service)
            if len(replicas) != self.replica_count or any(r["is_sdown"] for r in replicas):
                return False
            if len(self._ask(s, "sentinels", self.service)) != self.sentinel_count - 1:
                return False
        return True

    def primary(self) -> EmbeddedServer:
        """The server a live sentinel names as the primary now."""
        for s in self.sentinels:
            try:
                _, port = self._ask(s, "get_master_addr_by_name", self.service)
            except (redis.RedisError, OSError, TypeError):
                continue
            return next(server for server in self.servers if server.port == int(port))
        raise RQueueError(f"no sentinel names a primary for {self.service!r}")

    def wait_for_failover(self, old: EmbeddedServer, timeout: float = READY_TIMEOUT) -> EmbeddedServer:
        """Waits until every sentinel names the same primary other than
        ``old`` and that server acts as one; returns it."""

        def promoted() -> bool:
            named = {self._ask(s, "get_master_addr_by_name", self.service)[1] for s in self.sentinels}
            if len(named) != 1 or named == {old.port}:
                return False
            with redis.Redis(port=named.pop(), password=self.password, socket_timeout=2) as r:
                return r.info("replication").get("role") == "master"

        self._wait(promoted, f"a replica of port {old.port} to be promoted", timeout)
        return self.primary()

    def _wait(self, condition: Any, what: str, timeout: float = READY_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if condition():
                    return
            except (redis.RedisError, OSError):
                pass  # not up yet: ask again
            if time.monotonic() > deadline:
                raise RQueueError(f"sentinel group: timed out after {timeout} s waiting for {what}")
            time.sleep(0.05)

    def stop(self) -> None:
        """Stops every process (also those already killed) and removes their directories."""
        for server in self.sentinels + self.servers:
            try:
                server.stop()
            except Exception:  # pragma: no cover - stop the others all the same
                pass
        self.sentinels, self.servers = [], []

    def __enter__(self) -> EmbeddedSentinelGroup:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

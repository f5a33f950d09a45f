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

:class:`rqueue.embedded.EmbeddedSentinelGroup` starts a primary, replicas
and sentinels on loopback for tests and benchmarks.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qs, unquote

import redis
from redis.backoff import NoBackoff
from redis.connection import URL_QUERY_ARGUMENT_PARSERS
from redis.retry import Retry
from redis.sentinel import Sentinel

from ..errors import ConnectionFailed, InvalidURL
from .urls import CONNECT_TIMEOUT, describe, scrub, split_secrets

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
        return InvalidURL(shown, scrub(why, url))

    _, user, password, rest = split_secrets(url)
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
            failures.append(f"{address} is not a sentinel: {describe(exc)}")
            continue
        except (redis.RedisError, OSError) as exc:
            failures.append(f"{address}: {describe(exc)}")
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
    raise ConnectionFailed(shown, scrub(why, url))

"""Redis Sentinel URLs (``redis+sentinel://``, ``rediss+sentinel://``): a
client of the primary that the sentinels name, which follows it through
failovers. docs/connections.md describes the URL form, its options and what
a failover does to calls under way."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, cast
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

    # Not "sentinel": that name is redis-py's SENTINEL command method.
    sentinel_manager: Sentinel | None = None

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self.sentinel_manager is not None:
                self.sentinel_manager.close()


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
        if match is None or not 1 <= port <= 65535:
            raise invalid(
                f"bad sentinel address {entry!r}: expected host:port with a port from 1 to 65535, "
                "several separated by commas"
            )
        addresses.append((match.group(1) or match.group(2), port))
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
            parse = cast(Callable[[str], object], URL_QUERY_ARGUMENT_PARSERS[name])  # int, float, to_bool, ...
            try:
                server[name] = parse(values[-1])
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
    # redis-py's Sentinel class and master_for() carry no annotations: called
    # through these typed names.
    make_sentinel: Callable[..., Sentinel] = Sentinel
    sentinel = make_sentinel(
        addresses, sentinel_kwargs={"retry": Retry(NoBackoff(), 0), **to_sentinels, **sentinel_auth}
    )
    service = unquote(service)
    try:
        _find_primary(sentinel, service, [f"{h}:{p}" for h, p in addresses], shown, url)
    except BaseException:
        sentinel.close()
        raise
    primary_for: Callable[..., SentinelRedis] = sentinel.master_for
    client = primary_for(service, redis_class=SentinelRedis, **server)
    client.sentinel_manager = sentinel
    return client


def _find_primary(sentinel: Sentinel, service: str, where: list[str], shown: str, url: str) -> None:
    """Asks each sentinel in turn until one reports a healthy primary for
    ``service``; raises ConnectionFailed saying why none did."""
    answered: list[str] = []
    failures: list[str] = []
    unhealthy = False
    healthy: Callable[[dict[str, Any], str], bool] = sentinel.check_master_state  # not annotated in redis-py
    nodes: list[redis.Redis] = sentinel.sentinels
    for node, address in zip(nodes, where, strict=True):
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
        # redis-py parses SENTINEL MASTERS into a dict by name (its annotation also allows a list)
        state = masters.get(service) if isinstance(masters, dict) else None
        if state and healthy(state, service):
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

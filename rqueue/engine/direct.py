"""The direct path of script calls: a client of one server checks its
connections out of :class:`ScriptConnections` and sends commands on them
packed by hiredis, without redis-py's per-call bookkeeping (observability
hooks, option parsing, response callbacks), which costs more client CPU
than a small script's time in Redis. rqueue.engine.scripts sends its calls
this way where it can."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import redis
from redis.exceptions import DataError

from ..connection.open import RedisClient, shut

_pack: Callable[[tuple[Any, ...]], bytes] | None
_HIREDIS_PACKER: type | None
try:
    from hiredis import pack_command as _pack
    from redis.connection import HiredisRespSerializer as _HIREDIS_PACKER
except ImportError:  # redis-py packs in Python then
    _pack = None
    _HIREDIS_PACKER = None

# Clients whose script calls take the direct path (Script._direct): a
# single server's, a Sentinel primary's and memory://'s (fakeredis) clients
# are all redis.Redis; RedisCluster is not.
_PLAIN = (redis.Redis,)


def takes_direct_path(client: Any) -> bool:
    """True when script calls of ``client`` go straight to a pooled
    connection (Script._direct): a client of one server, not a cluster, not a
    single-connection client."""
    return isinstance(client, _PLAIN) and getattr(client, "connection", None) is None


class ScriptConnections:
    """The connections that the script calls of one client take, made with
    the settings of the client's own pool (address, credentials, TLS,
    timeouts, the connection's Retry) but checked out and returned without
    its bookkeeping: redis-py 8 spends client CPU on every checkout
    and return on metrics and events, as much as a small script's time in
    Redis. What a checkout must do stays: a connection the server closed, or
    one with an unread reply, is reconnected before use (the pool's
    ``can_read`` check), a forked child makes its own, and ``max_connections``
    holds as in the pool (these count apart from the pool's).

    Used for a plain :class:`redis.ConnectionPool` without a client-side
    cache (:meth:`of`); a Sentinel pool re-checks the primary's address on
    every return and is used as it is."""

    def __init__(self, pool: redis.ConnectionPool) -> None:
        self._class = pool.connection_class
        self._kwargs = pool.connection_kwargs
        self._max = pool.max_connections
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._free: list[Any] = []  # list.pop and append are atomic: no lock per call
        self._made: list[Any] = []

    @classmethod
    def of(cls, client: Any) -> ScriptConnections | None:
        """The connections for ``client``'s script calls; None when they go
        through redis-py (a cluster, a single-connection client, a Sentinel
        or blocking pool, a client-side cache)."""
        if not takes_direct_path(client):
            return None
        pool = client.connection_pool
        if type(pool) is not redis.ConnectionPool or getattr(pool, "cache", None) is not None:
            return None
        return cls(pool)

    def get_connection(self) -> Any:
        if os.getpid() != self._pid:
            self._forked()
        try:
            conn = self._free.pop()
        except IndexError:
            conn = self._make()
        try:
            conn.connect()
            try:
                if conn.can_read():
                    raise redis.ConnectionError("Connection has data")
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                conn.disconnect()
                conn.connect()
                if conn.can_read():
                    raise redis.ConnectionError("Connection not ready") from None
        except BaseException:
            self._free.append(conn)
            raise
        return conn

    def release(self, conn: Any) -> None:
        if conn.pid == self._pid:  # not one made before a fork
            self._free.append(conn)

    def disconnect(self) -> None:
        """Closes every connection, in use or not (as the pool's own)."""
        with self._lock:
            made = list(self._made)
        for conn in made:
            conn.disconnect()

    def shut(self) -> None:
        """Shuts down the socket of every connection, in use or not,
        without closing it (:func:`rqueue.connection.open.shut_connections`)."""
        with self._lock:
            made = list(self._made)
        for conn in made:
            shut(conn)

    def _make(self) -> Any:
        with self._lock:
            if len(self._made) >= self._max:
                raise redis.exceptions.MaxConnectionsError("Too many connections")
            conn = self._class(**self._kwargs)
            self._made.append(conn)
        return conn

    def _forked(self) -> None:
        # The parent's sockets stay the parent's: dropped here, not closed.
        with self._lock:
            if os.getpid() != self._pid:
                self._free, self._made, self._pid = [], [], os.getpid()


def direct_pool(server: RedisClient, connections: ScriptConnections | None) -> Any:
    """The pool of the direct path (Script._direct) of ``server``'s calls:
    ``connections``, or the client's own pool; None for no direct path."""
    if connections is None and isinstance(server, redis.Redis) and takes_direct_path(server):
        return server.connection_pool
    return connections


def send_direct(pool: Any, command: tuple[Any, ...]) -> Any:
    """``command`` on a connection of ``pool``, its reply as Redis sent it
    (Script._direct)."""
    conn = pool.get_connection()

    def attempt() -> Any:
        send_packed(conn, (command,))
        return conn.read_response()

    try:
        return conn.retry.call_with_retry(attempt, lambda error: conn.disconnect())
    finally:
        pool.release(conn)


def send_direct_pair(pool: Any, first: tuple[Any, ...], second: tuple[Any, ...]) -> tuple[Any, Any]:
    """``first`` and ``second`` on one connection of ``pool`` in one write
    (Script.call_and_read): their replies as Redis sent them, an error
    reply as its exception, returned rather than raised. Both replies are
    read whatever the first is, so that the connection stays in step."""
    conn = pool.get_connection()

    def attempt() -> tuple[Any, Any]:
        send_packed(conn, (first, second))
        replies = []
        for _ in range(2):
            try:
                replies.append(conn.read_response())
            except redis.ResponseError as exc:
                replies.append(exc)
        return replies[0], replies[1]

    try:
        replies: tuple[Any, Any] = conn.retry.call_with_retry(attempt, lambda error: conn.disconnect())
        return replies
    finally:
        pool.release(conn)


def send_packed(conn: Any, commands: tuple[tuple[Any, ...], ...]) -> None:
    """Writes ``commands`` to ``conn`` in one write."""
    if _pack is not None and type(getattr(conn, "_command_packer", None)) is _HIREDIS_PACKER:
        # What the hiredis packer does, without its per-argument
        # pass (rqueue sends str, bytes and numbers only).
        # One bytes object: redis-py writes each item of a list apart.
        try:
            packed = _pack(commands[0]) if len(commands) == 1 else b"".join(_pack(c) for c in commands)
        except TypeError as exc:
            raise DataError(str(exc)) from None
        conn.send_packed_command([packed])
    elif len(commands) == 1:
        conn.send_command(*commands[0])
    else:
        conn.send_packed_command(conn.pack_commands(commands))

"""Running the Lua scripts: EVALSHA first, SCRIPT LOAD and again on
NOSCRIPT (so a server restart, a failover to a replica or SCRIPT FLUSH is
harmless), alone or in pipelines. In pipelines EVALSHA is sent with
``execute_command``: redis-py's own pipelined scripts ask SCRIPT EXISTS
before every execute (one more round trip) and its cluster pipelines refuse
``evalsha()`` altogether.

A user whose ACL refuses SCRIPT LOAD (docs/ACL.md: an administrator loads
the scripts, see rqueue.engine.script_admin) gets ScriptsNotLoaded instead,
and the call that met NOSCRIPT stays unsent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis
from redis.exceptions import NoPermissionError, NoScriptError

from ..connection.cluster import Retrier, no_retry, not_run
from ..connection.open import RedisClient
from ..errors import ScriptsNotLoaded
from .direct import ScriptConnections, direct_pool, send_direct, send_direct_pair
from .loader import SCRIPT_NAMES, script_sha
from .text_cache import cached_texts


def sent_stream_log(keys: Sequence[Any]) -> bool:
    """Whether the KEYS of a script call name a stream log (a key ending in
    ":log", QueueKeys.msgs of LogLayout.STREAM): such a call runs the
    script's stream-layout text. A hash-layout call whose other keys happen
    to end so (a writer or schedule named "log") runs it too, which is safe:
    the stream text keeps the hash layout's code and its runtime checks of
    the log key (lua/includes/log.lua); the hash text alone leaves the
    stream layout's code out (loader's ``--@layout`` blocks)."""
    return any(key.endswith(":log" if isinstance(key, str) else b":log") for key in keys)


def _is_noscript(reply: object) -> bool:
    return isinstance(reply, NoScriptError) or (isinstance(reply, Exception) and str(reply).startswith("NOSCRIPT"))


class Script:
    """One script of one connection. Call it with ``keys`` and ``args``;
    with ``client=`` a :class:`ScriptPipeline` it is queued there instead.
    ``connections`` (from :meth:`ScriptConnections.of`) carries the calls of
    a client of one server; without it they take redis-py's pool."""

    def __init__(
        self,
        server: RedisClient,
        name: str,
        text: str,
        retry: Retrier[Any],
        connections: ScriptConnections | None = None,
        stream_text: str | None = None,
    ) -> None:
        self.name = name
        self.text = text
        self.sha = script_sha(text)
        self._redis = server
        self._retry = retry
        self._pool = direct_pool(server, connections)
        #: The stream layout's text of this script, when it differs from
        #: ``text`` (the hash layout's, or both layouts'): calls sent a
        #: stream log's keys run it (sent_stream_log).
        self.stream: Script | None = None
        if stream_text is not None:
            self.stream = Script(server, f"{name}@stream", stream_text, retry, connections)

    def for_keys(self, keys: Sequence[Any]) -> Script:
        """The script, of this script's layouts' texts, that a call sent ``keys`` runs."""
        if self.stream is not None and sent_stream_log(keys):
            return self.stream
        return self

    def __call__(
        self, keys: Sequence[Any], args: Sequence[Any], client: ScriptPipeline | None = None, stream: bool | None = None
    ) -> Any:
        """Runs the script; ``stream``: sent_stream_log(keys), when the
        caller knows it already (a group view works it out once)."""
        if self.stream is not None and (sent_stream_log(keys) if stream is None else stream):
            return self.stream(keys, args, client)
        if client is not None:
            client.call(self, keys, args)
            return client
        if self._pool is not None and self._retry is no_retry:
            try:
                return self._direct(keys, args)
            except NoScriptError:
                self.load()
                return self._direct(keys, args)
        return self._retry(lambda: self._run(keys, args))

    def _run(self, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        try:
            return self._redis.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            self.load()
            return self._redis.evalsha(self.sha, len(keys), *keys, *args)

    def _direct(self, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """EVALSHA on a pooled connection, as redis-py's execute_command does
        it (the connection's own Retry, a disconnect before each retry, the
        connection back to the pool) without its per-call bookkeeping
        (observability hooks, option parsing, response callbacks: EVALSHA
        has none), which cost more client CPU than a small script call."""
        return send_direct(self._pool, ("EVALSHA", self.sha, len(keys), *keys, *args))

    def call_and_read(
        self, keys: Sequence[Any], args: Sequence[Any], read: tuple[Any, ...], stream: bool | None = None
    ) -> tuple[Any, Any] | None:
        """The script's call, then the read-only command ``read``, in one
        round trip: (the script's reply, ``read``'s reply or its error);
        the script's error raises, after both replies are read. None where
        script calls take another path than the direct one (a cluster, the
        client's retry, redis-py's pool): the caller sends ``read`` on its
        own, after the call. After NOSCRIPT the call is sent again alone,
        and ``read``'s reply (read before the script ran) is None."""
        if self.stream is not None and (sent_stream_log(keys) if stream is None else stream):
            return self.stream.call_and_read(keys, args, read, False)
        if self._pool is None or self._retry is not no_retry:
            return None
        reply, got = send_direct_pair(self._pool, ("EVALSHA", self.sha, len(keys), *keys, *args), read)
        if isinstance(reply, NoScriptError):
            self.load()
            return self._direct(keys, args), None
        if isinstance(reply, BaseException):
            raise reply
        return reply, got

    def load(self) -> None:
        """SCRIPT LOAD (on every primary of a cluster). ScriptsNotLoaded when
        the user's ACL refuses it."""
        try:
            self._redis.script_load(self.text)
        except NoPermissionError as exc:
            raise ScriptsNotLoaded(self.name, self.sha, str(exc)) from exc


class ScriptPipeline:
    """A non-transactional pipeline of script calls and plain commands, sent
    in one round trip (per node of a cluster). Obtain one with
    :meth:`Scripts.pipeline`."""

    def __init__(self, redis: RedisClient, retry: Retrier[Any]) -> None:
        self._redis = redis
        self._retry = retry
        self._commands: list[tuple[Script | None, tuple[Any, ...]]] = []
        self._then: list[tuple[Script | None, tuple[Any, ...]]] = []

    def call(self, script: Script, keys: Sequence[Any], args: Sequence[Any]) -> None:
        script = script.for_keys(keys)
        self._commands.append((script, ("EVALSHA", script.sha, len(keys), *keys, *args)))

    def command(self, *args: Any) -> None:
        """Queues a plain command, e.g. ``command("WAIT", 1, 1000)``."""
        self._commands.append((None, args))

    def then(self, *args: Any) -> None:
        """Queues a command that must come after every script call, even one
        sent again after NOSCRIPT (WAIT counts the writes before it)."""
        self._then.append((None, args))

    def _send(self, commands: list[tuple[Script | None, tuple[Any, ...]]]) -> list[Any]:
        if isinstance(self._redis, redis.RedisCluster):
            return self._send_per_node(commands)

        def attempt() -> list[Any]:
            # a fresh pipeline per attempt: redis-py empties one as it executes
            pipe = self._redis.pipeline(transaction=False)
            for _, args in commands:
                pipe.execute_command(*args)
            return list(pipe.execute(raise_on_error=False))

        replies: list[Any] = self._retry(attempt)
        return replies

    def _send_per_node(self, commands: list[tuple[Script | None, tuple[Any, ...]]]) -> list[Any]:
        cluster = self._redis
        assert isinstance(cluster, redis.RedisCluster)
        """A cluster's pipeline, as one plain pipeline per node that serves
        the commands' slots. redis-py's cluster pipeline is not used: after a
        lost reply it sends the command again, which would run a script
        twice. Here a command is sent again only when its reply proves it
        did not run (MOVED, TRYAGAIN, ...; connection.cluster.not_run), after the slot
        map is read again, within the client's retry budget."""
        replies: list[Any] = [None] * len(commands)
        pending = list(range(len(commands)))

        def attempt() -> None:
            by_node: dict[str, tuple[Any, list[int]]] = {}
            for i in pending:
                args = commands[i][1]
                if args[0] != "EVALSHA" or int(args[2]) < 1:
                    raise ValueError(f"a cluster pipeline takes script calls with keys only, not {args[0]!r}")
                node = cluster.get_node_from_key(args[3])  # type: ignore[no-untyped-call]  # unannotated in redis-py
                by_node.setdefault(node.name, (cluster.get_redis_connection(node), []))[1].append(i)
            for conn, indices in by_node.values():
                pipe = conn.pipeline(transaction=False)
                for i in indices:
                    pipe.execute_command(*commands[i][1])
                try:
                    got = pipe.execute(raise_on_error=False)
                except Exception as exc:
                    # That node's calls may or may not have run: their reply is
                    # the error (never sent again unless it proves they did not
                    # run), and the other nodes' calls go on.
                    got = [exc] * len(indices)
                for i, reply in zip(indices, got, strict=True):
                    replies[i] = reply
            pending[:] = [i for i in pending if isinstance(replies[i], BaseException) and not_run(replies[i])]
            if pending:
                cluster.nodes_manager.initialize()
                raise replies[pending[0]]

        try:
            self._retry(attempt)
        except Exception as exc:
            if not pending or not not_run(exc):
                raise
            # out of retries: the calls that never ran keep their error reply
        return replies

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        """The replies in order. A script the server did not know is loaded
        and that call alone sent again (a NOSCRIPT reply means it did not
        run). With ``raise_on_error`` the first error reply is raised;
        otherwise error replies are returned in place."""
        commands, then = self._commands + self._then, self._then
        self._commands, self._then = [], []
        replies = self._send(commands)
        missing = [i for i, (script, _) in enumerate(commands) if script is not None and _is_noscript(replies[i])]
        if missing:
            scripts = {id(script): script for i in missing if (script := commands[i][0]) is not None}
            refused: dict[int, ScriptsNotLoaded] = {}
            for key, script in scripts.items():
                try:
                    script.load()
                except ScriptsNotLoaded as exc:
                    refused[key] = exc
            # A call whose script could not be loaded did not run: its
            # error takes its place, like any error reply.
            for i in missing:
                if id(commands[i][0]) in refused:
                    replies[i] = refused[id(commands[i][0])]
            missing = [i for i in missing if id(commands[i][0]) not in refused]
        if missing:
            again = self._send([commands[i] for i in missing] + then)
            for i, reply in zip(missing, again, strict=False):  # WAIT and the like follow
                replies[i] = reply
            if then:
                replies[-len(then) :] = again[-len(then) :]
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
        return replies


class Scripts:
    """The scripts of one Redis connection, as attributes, and pipelines
    that can run them. ``retry`` wraps every call that reaches Redis (the
    cluster client retries topology changes with it)."""

    publish: Script
    fetch: Script
    ack: Script
    nack: Script
    reject: Script
    set_aside: Script
    extend: Script
    heartbeat: Script
    join: Script
    leave: Script
    purge: Script
    replay: Script
    stats: Script
    schedule_fire: Script
    repair: Script
    settle_to: Script
    publish_tracked: Script
    retain: Script
    group_create: Script
    group_reset: Script
    group_delete: Script
    status: Script
    partition: Script
    pause: Script
    ack_result: Script
    migrate: Script

    def __init__(self, redis: RedisClient, retry: Retrier[Any] = no_retry, shebang: bool = True) -> None:
        self._redis = redis
        self._retry = retry
        #: The connections of the script calls (None: redis-py's pool).
        self.connections = ScriptConnections.of(redis)
        self._direct = direct_pool(redis, self.connections)
        for name in SCRIPT_NAMES:
            texts = cached_texts(name, shebang)
            setattr(self, name, Script(redis, name, texts["hash"], retry, self.connections, texts.get("stream")))

    @property
    def redis(self) -> RedisClient:
        """The client the scripts are sent with."""
        return self._redis

    def close(self) -> None:
        """Closes the connections of the script calls."""
        if self.connections is not None:
            self.connections.disconnect()

    def shut(self) -> None:
        """Shuts down the sockets of the script calls' connections
        (:meth:`ScriptConnections.shut`): a call blocked on one wakes."""
        if self.connections is not None:
            self.connections.shut()

    def read_log(self, key: str, first: int, last: int, meta: str) -> tuple[list[Any], str]:
        """XRANGE of the stream ``key`` from seq ``first`` to ``last``, then
        the queue's incarnation (field "inc" of its meta hash ``meta``, ""
        when none) in the same round trip: on the script calls' direct path
        the entries as Redis sent them ([id, [field, value]]), without the
        response callback that would make a dict of each entry's fields;
        through the client (a cluster's) as redis-py parses them, (id,
        {field: value}). lua/fetch.lua's claim leaves these records to the
        client; the incarnation, read after them, tells whether they are of
        the claim's queue (Redis lost its data, or the queue was made again,
        in between: another's)."""
        if self._direct is not None and self._retry is no_retry:
            entries, inc = send_direct_pair(self._direct, ("XRANGE", key, first, last), ("HGET", meta, "inc"))
            for reply in (entries, inc):
                if isinstance(reply, BaseException):
                    raise reply
            return entries, field_text(inc)

        def both() -> list[Any]:
            pipe = self._redis.pipeline(transaction=False)
            pipe.xrange(key, first, last)
            pipe.hget(meta, "inc")
            replies: list[Any] = pipe.execute()
            return replies

        parsed, inc = self._retry(both)
        return parsed, field_text(inc)

    def pipeline(self) -> ScriptPipeline:
        """A new pipeline for script calls (``script(keys=, args=, client=pipeline)``)."""
        return ScriptPipeline(self._redis, self._retry)

    def by_name(self) -> dict[str, Script]:
        """Every script text, by name, in the order of SCRIPT_NAMES: a
        script's stream-layout text, when it has one of its own, follows it
        as ``name@stream`` (SCRIPT LOAD by an administrator loads both)."""
        out: dict[str, Script] = {}
        for name in SCRIPT_NAMES:
            script: Script = getattr(self, name)
            out[name] = script
            if script.stream is not None:
                out[script.stream.name] = script.stream
        return out


def field_text(value: Any) -> str:
    """A field read by HGET as str ("" when it is missing)."""
    if value is None:
        return ""
    return value.decode(errors="surrogateescape") if isinstance(value, bytes) else str(value)

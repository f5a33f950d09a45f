"""Loading and running of the Lua scripts in lua/, one per command.

A line ``--@include name`` pulls in ``lua/includes/name.lua`` (once per
script); the includes' top-level helpers that the script never calls are
left out. ``--@lazy name inc ...`` pulls in includes whose helpers are made
only where a ``--@make name`` line stands (see _make_lazy). Scripts run
redis-py style: EVALSHA first, SCRIPT LOAD and retry on NOSCRIPT, so a
server restart, a failover to a replica or SCRIPT FLUSH is
harmless. In pipelines EVALSHA is sent with ``execute_command``: redis-py's
own pipelined scripts ask SCRIPT EXISTS before every execute (one more round
trip) and its cluster pipelines refuse ``evalsha()`` altogether.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

import redis
from redis.exceptions import DataError, NoScriptError

try:
    from hiredis import pack_command as _pack
    from redis.connection import HiredisRespSerializer as _HIREDIS_PACKER
except ImportError:  # redis-py packs in Python then
    _pack = None
    _HIREDIS_PACKER = None

from .errors import not_run

_DIRECTIVE = re.compile(r"^--@(include|lazy)[ \t]+(\w+)((?:[ \t]+\w+)*)[ \t]*$", re.MULTILINE)
_MAKE = re.compile(r"^([ \t]*)--@make[ \t]+(\w+)[ \t]*\n", re.MULTILINE)
_LAZY_REGION = re.compile(r"^--@lazy-begin (\w+)\n(.*?)^--@lazy-end\n", re.MULTILINE | re.DOTALL)
_COMMENT = re.compile(r"--\[\[.*?\]\]|--[^\n]*", re.DOTALL)
# A top-level helper of an include: "local function name(" at the start of a
# line, up to the first "end" alone at the start of a line (the scripts'
# layout; nested functions are indented).
_TOP_FUNCTION = re.compile(r"^local function (\w+)\(.*?^end\n", re.MULTILINE | re.DOTALL)
# A top-level helper with the comment lines right above it, moved together.
_NOTED_FUNCTION = re.compile(r"(?:^--(?!\[\[)[^\n]*\n)*" + _TOP_FUNCTION.pattern, re.MULTILINE | re.DOTALL)
_WORD = re.compile(r"\w+")

SCRIPT_NAMES = (
    "publish",
    "fetch",
    "ack",
    "nack",
    "reject",
    "extend",
    "heartbeat",
    "join",
    "leave",
    "purge",
    "replay",
    "stats",
)


def lua_dir() -> Path:
    """The scripts' folder: ``rqueue/lua`` in an installed wheel (the
    top-level ``lua/`` is packaged there), ``lua/`` in a source checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "lua", here.parent / "lua"):
        if (candidate / "fetch.lua").is_file():
            return candidate
    raise FileNotFoundError(f"rqueue's Lua scripts are missing (looked in {here / 'lua'} and {here.parent / 'lua'})")


@cache
def source(name: str) -> str:
    """The full text of script ``name`` with its includes expanded."""
    root = lua_dir()
    seen: set[str] = set()

    def include(inc: str) -> str:
        if inc in seen:
            return ""
        seen.add(inc)
        return _DIRECTIVE.sub(expand, root.joinpath("includes", f"{inc}.lua").read_text())

    def expand(match: re.Match[str]) -> str:
        kind, first, rest = match.groups()
        if kind == "include":
            if rest.strip():
                raise ValueError(f"{match.group(0)!r}: --@include takes one name")
            return include(first)
        if not rest.strip():
            raise ValueError(f"{match.group(0)!r}: --@lazy takes a loader name, then the includes it makes")
        return f"--@lazy-begin {first}\n" + "".join(include(inc) for inc in rest.split()) + "--@lazy-end\n"

    return _make_lazy(_drop_unused(_DIRECTIVE.sub(expand, root.joinpath(f"{name}.lua").read_text())))


def _drop_unused(text: str) -> str:
    """``text`` without the top-level local functions nothing calls. Every
    local function is made anew (a closure) on each script call, about 750
    Redis instructions each, so a script pays only for the helpers it uses."""
    while True:
        words = Counter(_WORD.findall(text))
        unused = [m for m in _TOP_FUNCTION.finditer(text) if words[m.group(1)] == 1]  # only its own definition
        if not unused:
            return text
        for m in unused:
            # The span must be one function: a one-line function, an "end"
            # followed by a comment, or a long string or comment ([[ ]]) that
            # holds "end" at column 0 would cut it wrongly.
            span = m.group(0)
            inner = span.split("\n")[1:-2]
            if (
                span.split("\n", 1)[0].rstrip().endswith("end")
                or "[[" in span
                or any(line[:1].strip() for line in inner)
            ):
                raise ValueError(
                    f"cannot tell where the Lua helper {m.group(1)!r} ends: write it over several "
                    "lines, its body indented, closed by 'end' alone at the start of a line"
                )
        for m in reversed(unused):
            text = text[: m.start()] + text[m.end() :]


def _make_lazy(text: str) -> str:
    """Helpers of a ``--@lazy name`` region made where ``--@make name`` stands.

    The region's constants stay where they are and its top-level helpers
    become locals declared there, still nil. Each ``--@make name`` line is
    replaced by their definitions, run only when the first of them is still
    nil. A script puts it on the paths that need them (a failure, a
    redelivery), so the common call builds none: every closure a call makes
    costs Redis about 1,500 instructions (the closure, the upvalues it binds,
    their collection). A loader function would not do: making it binds every
    upvalue its helpers use, on every call.
    """
    regions = {m.group(1): m for m in _LAZY_REGION.finditer(text)}
    if not regions:
        return text
    helpers = {name: list(_NOTED_FUNCTION.finditer(m.group(2))) for name, m in regions.items()}
    nested = [h.group(1) for found in helpers.values() for h in found if _MAKE.search(h.group(0))]
    if nested:
        raise ValueError(f"--@make inside the lazy helper {', '.join(nested)}: its copy would keep the directive")

    def region(match: re.Match[str]) -> str:
        name = match.group(1)
        names = [h.group(1) for h in helpers[name]]
        # Named above the region, a helper would be read as a global there.
        above = _COMMENT.sub("", text[: match.start()])
        early = [n for n in names if re.search(rf"\b{n}\b", above)]
        if early:
            raise ValueError(f"--@lazy {name}: {', '.join(early)} named above the region that defines them")
        constants = re.sub(r"\n{3,}", "\n\n", _NOTED_FUNCTION.sub("", match.group(2)))
        if not names:  # the script calls none of them
            return constants
        return f"{constants}local {', '.join(names)} -- made where --@make {name} stands\n"

    def make(match: re.Match[str]) -> str:
        indent, name = match.group(1), match.group(2)
        if name not in regions or regions[name].start() > match.start():
            raise ValueError(f"--@make {name}: no --@lazy {name} region above it")
        found = helpers[name]
        if not found:
            return ""
        shadowed = _free_names("".join(h.group(0) for h in found)) & _visible_block_locals(text, match.start())
        if shadowed:
            raise ValueError(
                f"--@make {name}: {', '.join(sorted(shadowed))} would be read from the enclosing "
                "block, not from the top level its helpers were written for"
            )
        bodies = "".join(
            re.sub(r"^local function ", "function ", h.group(0), count=1, flags=re.MULTILINE) for h in found
        )
        return f"{indent}if {found[0].group(1)} == nil then\n{bodies}{indent}end\n"

    made = {m.group(2) for m in _MAKE.finditer(text)}
    text = _MAKE.sub(make, text)
    unused = [name for name in regions if name not in made and helpers[name]]
    if unused:
        raise ValueError(f"--@lazy {', '.join(unused)}: no --@make to define its helpers")
    return _LAZY_REGION.sub(region, text)


_LUA_KEYWORDS = frozenset(
    ["and", "break", "do", "else", "elseif", "end", "false", "for", "function", "if", "in", "local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while"]
)
_STRING = re.compile(r"'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"")
_DECLARED = re.compile(
    r"\blocal\s+function\s+(\w+)\s*\(([^)]*)\)|\blocal\s+(\w+(?:\s*,\s*\w+)*)|\bfunction\b[^(\n]*\(([^)]*)\)"
    r"|\bfor\s+(\w+(?:\s*,\s*\w+)*)\s+(?:in|=)"
)


def _declared(code: str) -> set[str]:
    """Names that ``code`` declares: locals, parameters, loop variables."""
    out: set[str] = set()
    for m in _DECLARED.finditer(code):
        out.update(re.findall(r"\w+", " ".join(g or "" for g in m.groups())))
    return out


def _free_names(code: str) -> set[str]:
    """Names ``code`` reads that it does not declare (globals included;
    field names after "." or ":" left out)."""
    bare = _STRING.sub("''", _COMMENT.sub("", code))
    words = set(re.findall(r"(?<![.:\w])[A-Za-z_]\w*", bare))
    return words - _LUA_KEYWORDS - _declared(bare)


def _visible_block_locals(text: str, pos: int) -> set[str]:
    """Names declared in the blocks that enclose ``pos`` (not at the top
    level), read from the scripts' two-space indentation."""
    names: set[str] = set()
    *lines, site = text[:pos].split("\n")
    site += text[pos:].split("\n", 1)[0]
    limit = len(site) - len(site.lstrip())
    for line in reversed(lines):
        if limit == 0:
            break
        code = _STRING.sub("''", _COMMENT.sub("", line))
        if not code.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if indent < limit:
            limit = indent  # the line that opens an enclosing block: its parameters and loop variables count
            names |= _declared(code)
        elif indent == limit:
            names |= {
                w
                for m in re.finditer(r"\blocal\s+(?:function\s+)?(\w+(?:\s*,\s*\w+)*)", code)
                for w in re.findall(r"\w+", m.group(1))
            }
    return names


T = TypeVar("T")
Retrier = Callable[[Callable[[], T]], T]


def no_retry(call: Callable[[], T]) -> T:
    """The Retrier of a single server: the call once."""
    return call()


# Clients whose script calls take the direct path (Script._direct): a
# single server's, a Sentinel primary's and memory://'s (fakeredis) clients
# are all redis.Redis; RedisCluster is not.
_PLAIN = (redis.Redis,)


def _takes_direct_path(client: Any) -> bool:
    """True when script calls of ``client`` go straight to a pooled
    connection (Script._direct): a client of one server, not a cluster, not a
    single-connection client."""
    return isinstance(client, _PLAIN) and getattr(client, "connection", None) is None


def _is_noscript(reply: object) -> bool:
    return isinstance(reply, NoScriptError) or (isinstance(reply, Exception) and str(reply).startswith("NOSCRIPT"))


class ScriptConnections:
    """The connections that the script calls of one client take, made with
    the settings of the client's own pool (address, credentials, TLS,
    timeouts, the connection's Retry) but checked out and returned without
    its bookkeeping: redis-py 8 spends about 10 us of client CPU per checkout
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
        if not _takes_direct_path(client):
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


class Script:
    """One script of one connection. Call it with ``keys`` and ``args``;
    with ``client=`` a :class:`ScriptPipeline` it is queued there instead.
    ``connections`` (from :meth:`ScriptConnections.of`) carries the calls of
    a client of one server; without it they take redis-py's pool."""

    def __init__(
        self, redis: Any, name: str, text: str, retry: Retrier[Any], connections: ScriptConnections | None = None
    ) -> None:
        self.name = name
        self.text = text
        self.sha = hashlib.sha1(text.encode()).hexdigest()
        self._redis = redis
        self._retry = retry
        self._pool: Any = connections
        if connections is None and _takes_direct_path(redis):
            self._pool = redis.connection_pool

    def __call__(self, keys: Sequence[Any], args: Sequence[Any], client: ScriptPipeline | None = None) -> Any:
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
        pool = self._pool
        conn = pool.get_connection()
        command = ("EVALSHA", self.sha, len(keys), *keys, *args)

        def attempt() -> Any:
            if _pack is not None and type(getattr(conn, "_command_packer", None)) is _HIREDIS_PACKER:
                # What the hiredis packer does, without its per-argument
                # pass (rqueue sends str, bytes and numbers only).
                try:
                    packed = _pack(command)
                except TypeError as exc:
                    raise DataError(str(exc)) from None
                conn.send_packed_command([packed])
            else:
                conn.send_command(*command)
            return conn.read_response()

        try:
            return conn.retry.call_with_retry(attempt, lambda error: conn.disconnect())
        finally:
            pool.release(conn)

    def load(self) -> None:
        """SCRIPT LOAD (on every primary of a cluster)."""
        self._redis.script_load(self.text)


class ScriptPipeline:
    """A non-transactional pipeline of script calls and plain commands, sent
    in one round trip (per node of a cluster). Obtain one with
    :meth:`Scripts.pipeline`."""

    def __init__(self, redis: Any, retry: Retrier[Any]) -> None:
        self._redis = redis
        self._retry = retry
        self._commands: list[tuple[Script | None, tuple[Any, ...]]] = []
        self._then: list[tuple[Script | None, tuple[Any, ...]]] = []

    def call(self, script: Script, keys: Sequence[Any], args: Sequence[Any]) -> None:
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

        return self._retry(attempt)

    def _send_per_node(self, commands: list[tuple[Script | None, tuple[Any, ...]]]) -> list[Any]:
        """A cluster's pipeline, as one plain pipeline per node that serves
        the commands' slots. redis-py's cluster pipeline is not used: after a
        lost reply it sends the command again, which would run a script
        twice. Here a command is sent again only when its reply proves it
        did not run (MOVED, TRYAGAIN, ...; errors.not_run), after the slot
        map is read again, within the client's retry budget."""
        replies: list[Any] = [None] * len(commands)
        pending = list(range(len(commands)))

        def attempt() -> None:
            by_node: dict[str, tuple[Any, list[int]]] = {}
            for i in pending:
                args = commands[i][1]
                if args[0] != "EVALSHA" or int(args[2]) < 1:
                    raise ValueError(f"a cluster pipeline takes script calls with keys only, not {args[0]!r}")
                node = self._redis.get_node_from_key(args[3])
                by_node.setdefault(node.name, (self._redis.get_redis_connection(node), []))[1].append(i)
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
                for i, reply in zip(indices, got):
                    replies[i] = reply
            pending[:] = [i for i in pending if isinstance(replies[i], BaseException) and not_run(replies[i])]
            if pending:
                self._redis.nodes_manager.initialize()
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
            for script in {id(commands[i][0]): commands[i][0] for i in missing}.values():
                script.load()  # type: ignore[union-attr]
            again = self._send([commands[i] for i in missing] + then)
            for i, reply in zip(missing, again):
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
    extend: Script
    heartbeat: Script
    join: Script
    leave: Script
    purge: Script
    replay: Script
    stats: Script

    def __init__(self, redis: Any, retry: Retrier[Any] = no_retry) -> None:
        self._redis = redis
        self._retry = retry
        #: The connections of the script calls (None: redis-py's pool).
        self.connections = ScriptConnections.of(redis)
        for name in SCRIPT_NAMES:
            setattr(self, name, Script(redis, name, source(name), retry, self.connections))

    def close(self) -> None:
        """Closes the connections of the script calls."""
        if self.connections is not None:
            self.connections.disconnect()

    def pipeline(self) -> ScriptPipeline:
        """A new pipeline for script calls (``script(keys=, args=, client=pipeline)``)."""
        return ScriptPipeline(self._redis, self._retry)

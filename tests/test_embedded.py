"""The embedded servers the tests and `rqueue demo` start: a port picked for
them and taken before the server binds it is picked again."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import redis
from support.servers import start_cluster, start_server

from rqueue import embedded
from rqueue.errors import RQueueError


@pytest.fixture(params=["connection", "listener"])
def taken(request: pytest.FixtureRequest) -> Iterator[int]:
    """A loopback port held for the test's length: bound as an outgoing
    connection's ephemeral port is (connecting to it is refused), or by a
    listener that never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        if request.param == "listener":
            s.listen()
        yield s.getsockname()[1]


def picks(monkeypatch: pytest.MonkeyPatch, *first: int) -> list[int]:
    """free_port() returns ``first`` in order, then free ports; the list
    collects every port it returned."""
    queue, given, real = list(first), [], embedded.free_port

    def pick() -> int:
        given.append(queue.pop(0) if queue else real())
        return given[-1]

    monkeypatch.setattr(embedded, "free_port", pick)
    return given


def test_a_server_whose_port_was_taken_starts_on_another(monkeypatch, taken):
    # given a port that free_port() picks but something else binds first
    given = picks(monkeypatch, taken)
    # when a server is started on a port of its own choosing
    server = start_server("redis")
    try:
        # then it answers on another port
        assert given[0] == taken and server.port != taken
        assert redis.Redis(port=server.port).ping()
    finally:
        server.stop()


def test_a_server_on_a_port_it_was_given_does_not_move(taken):
    # given a port taken by something else
    # when a server is told to start on it
    with pytest.raises(RQueueError, match=rf"(?s)did not start on port {taken}:.*Address already in use"):
        start_server("redis", port=taken)


def test_a_cluster_node_whose_bus_port_was_taken_gets_another(monkeypatch, taken):
    # given a bus port that free_port() picks (the first pick of a cluster)
    # but something else binds first
    given = picks(monkeypatch, taken)
    # when a one-node cluster starts
    cluster = start_cluster(primaries=1, replicas=0)
    try:
        # then its node runs with another bus port, and the cluster serves
        [node] = cluster.nodes
        assert given[0] == taken and taken not in cluster.bus_ports.values()
        with redis.Redis(port=node.port) as r:
            assert b"cluster_state:ok" in r.execute_command("CLUSTER", "INFO")
    finally:
        cluster.stop()

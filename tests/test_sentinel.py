"""Redis Sentinel URLs (redis+sentinel://): connecting through the sentinels,
failover after kill -9 of the primary, and the URLs that are refused.

Each group of servers (a primary, replicas, three sentinels) runs on free
loopback ports with its own directories (rqueue.embedded.EmbeddedSentinelGroup).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from support.servers import missing_binary, server_binary, wait_for

import rqueue
from rqueue.embedded import EmbeddedSentinelGroup, free_port

SECRET = "s3cret-pw"  # must never appear in an error message


def start_group(**options: object) -> EmbeddedSentinelGroup:
    """A new private sentinel group of redis-server processes; the caller stops it."""
    binary = server_binary("redis")
    if binary is None:
        missing_binary("redis")
    return EmbeddedSentinelGroup(binary=binary, **options).start()  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def group() -> Iterator[EmbeddedSentinelGroup]:
    """A primary, one replica and three sentinels shared by the tests that do not break them."""
    started = start_group()
    try:
        yield started
    finally:
        started.stop()


# -- connecting --------------------------------------------------------------


def test_publish_consume_and_ack_through_a_sentinel_url(group, prefix):
    # given a client connected through the sentinels' URL
    with rqueue.connect(group.url + "/0", prefix=prefix) as client:
        q = client.queue("orders")
        consumer = q.consumer("g")
        # when a consumer waits for a message and one is published
        fetched: list[rqueue.Delivery] = []
        waiter = threading.Thread(target=lambda: fetched.extend(consumer.fetch(1, timeout=10)))
        waiter.start()
        wait_for(lambda: q.keys.wake_channel.encode() in client.redis.pubsub_channels(), timeout=5)
        q.publish(b"hello", id="order-1")
        waiter.join(15)
        # then it gets it, acks it, and the work went to the primary the sentinels name
        assert [d.data for d in fetched] == [b"hello"]
        fetched[0].ack()
        stats = q.stats().group("g")
        assert (stats.acked, stats.pending) == (1, 0)
        assert client.redis.connection_pool.get_master_address()[1] == group.primary().port == group.servers[0].port


def test_passwords_of_the_servers_and_of_the_sentinels(prefix):
    # given servers and sentinels that want different passwords
    secured = start_group(password=SECRET, sentinel_password=SECRET + "-sentinel")
    try:
        # when the URL has both, then the client works
        with rqueue.connect(secured.url, prefix=prefix) as client:
            assert client.queue("orders").publish(b"x").seq == 1
        # when the sentinels' password is missing, or the servers' is wrong,
        # then ConnectionFailed says so without showing a password
        no_sentinel_password = secured.url.split("?")[0]
        wrong_password = secured.url.replace(f":{SECRET}@", ":wrong-pw@")
        for url, why in ((no_sentinel_password, "?sentinel_password="), (wrong_password, "authentication failed")):
            with pytest.raises(rqueue.ConnectionFailed) as exc:
                rqueue.connect(url, prefix=prefix)
            assert why in str(exc.value)
            assert SECRET not in str(exc.value) and "wrong-pw" not in str(exc.value)
    finally:
        secured.stop()


# -- failover ----------------------------------------------------------------

CONFIRMED = 300  # durably confirmed messages the producer aims for
KILL_AFTER = 100  # confirmed messages before the primary is killed


def test_kill_of_the_primary_loses_no_durably_confirmed_message(prefix, capsys):
    # given a primary with two replicas (so that the promoted one still has a
    # replica to confirm durable publishes), three sentinels, a worker on a
    # queue and a producer publishing durably with ids, retrying on errors
    failing = start_group(replicas=2)
    client = worker = producer = None
    stop = threading.Event()
    try:
        client = rqueue.connect(failing.url, prefix=prefix, durable_timeout=1)
        client.configure("orders", ack_wait=2)
        q = client.queue("orders")
        handled: dict[bytes, float] = {}  # body -> when first handled
        lock = threading.Lock()

        def handler(d: rqueue.Delivery) -> None:
            with lock:
                handled.setdefault(d.data, time.monotonic())

        worker = rqueue.Worker(q, "g", handler, concurrency=4, heartbeat_timeout=3, reconnect_timeout=30)
        worker.start()
        confirmed: list[bytes] = []
        failures: list[str] = []

        def produce() -> None:
            with rqueue.connect(failing.url, prefix=prefix, durable_timeout=1) as publisher:
                i = 0
                while len(confirmed) < CONFIRMED and not stop.is_set():
                    body = f"m{i}".encode()
                    try:
                        publisher.queue("orders").publish(body, id=body.decode(), durable=True)
                    except Exception as exc:  # NotDurable, connection errors: the same id again
                        failures.append(type(exc).__name__)
                        time.sleep(0.05)
                        continue
                    confirmed.append(body)
                    i += 1

        producer = threading.Thread(target=produce)
        producer.start()
        wait_for(lambda: len(confirmed) >= KILL_AFTER, timeout=10)
        # when the primary is killed (SIGKILL) mid-run
        victim = failing.primary()
        victim.kill()
        killed_at, confirmed_before = time.monotonic(), len(confirmed)
        promoted = failing.wait_for_failover(victim, timeout=15)
        promoted_after = time.monotonic() - killed_at
        producer.join(15)
        assert not producer.is_alive(), f"the producer did not finish ({len(confirmed)} confirmed)"
        # then a replica was promoted, the worker resumed, and every durably confirmed message is handled
        wait_for(lambda: handled.keys() >= set(confirmed), timeout=15)
        assert promoted is not victim
        # m<confirmed_before + 1> and later were first sent after the kill
        resumed = min(handled[m] for m in confirmed[confirmed_before + 1 :]) - killed_at
        with capsys.disabled():
            print(
                f"\nsentinel failover: promoted {promoted_after:.1f} s after the kill, first message sent after "
                f"the kill handled {resumed:.1f} s after it; {len(confirmed)} confirmed, all handled; "
                f"{len(failures)} publish attempts retried ({sorted(set(failures))})"
            )
    finally:
        stop.set()
        if producer is not None:
            producer.join(10)
        if worker is not None:
            worker.stop()
            worker.join(10)
        if client is not None:
            client.close()
        failing.stop()


# -- refused URLs --------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "why"),
    [
        pytest.param(f"redis+sentinel://u:{SECRET}@127.0.0.1:26379", "no service name", id="no-path"),
        pytest.param(f"redis+sentinel://u:{SECRET}@127.0.0.1:26379/", "no service name", id="empty-service"),
        pytest.param(
            f"redis+sentinel://u:{SECRET}@127.0.0.1:port/mymaster",
            "bad sentinel address '127.0.0.1:port'",
            id="port-not-a-number",
        ),
        pytest.param(
            f"redis+sentinel://u:{SECRET}@127.0.0.1:0/mymaster", "bad sentinel address '127.0.0.1:0'", id="port-0"
        ),
        pytest.param(
            f"redis+sentinel://u:{SECRET}@127.0.0.1:70000/mymaster", "a port from 1 to 65535", id="port-too-high"
        ),
        pytest.param(f"redis+sentinel://u:{SECRET}@a:1,,b:2/mymaster", "bad sentinel address ''", id="empty-entry"),
        pytest.param(f"redis+sentinel://u:{SECRET}@/mymaster", "bad sentinel address ''", id="no-host"),
        pytest.param(f"redis+sentinel://u:{SECRET}@a b:1/mymaster", "bad sentinel address 'a b:1'", id="space"),
        pytest.param(
            f"redis+sentinel://u:{SECRET}@a:1/mymaster/x", "the database 'x' is not a number", id="db-not-a-number"
        ),
        pytest.param(
            f"redis+sentinel://u:{SECRET}@a:1/mymaster/0/1", "the database '0/1' is not a number", id="path-too-long"
        ),
        pytest.param(
            f"redis+sentinel://a:1/mymaster?sentinel_password={SECRET}&bogus=1",
            "unknown query argument 'bogus'",
            id="unknown-argument",
        ),
        pytest.param(
            f"redis+sentinel://a:1/mymaster?socket_timeout=soon&sentinel_password={SECRET}",
            "bad value for the query argument 'socket_timeout'",
            id="bad-argument",
        ),
        pytest.param(f"redis+sentinal://u:{SECRET}@a:1/mymaster", "scheme must be one of", id="misspelt-scheme"),
    ],
)
def test_malformed_urls_are_refused_naming_the_problem(url, why):
    # given a malformed sentinel URL with a password in it
    # when connecting
    with pytest.raises(rqueue.InvalidURL) as exc:
        rqueue.connect(url)
    # then InvalidURL names the problem, with the password masked
    assert why in str(exc.value)
    assert SECRET not in str(exc.value) and "***" in str(exc.value)


def test_unknown_service_is_a_connection_failure(group):
    # given sentinels that monitor "mymaster"
    # when the URL names another service (with a password, to see it masked)
    url = group.url.replace("redis+sentinel://", f"redis+sentinel://:{SECRET}@").replace("/mymaster", "/billing")
    with pytest.raises(rqueue.ConnectionFailed) as exc:
        rqueue.connect(url)
    # then ConnectionFailed names the sentinels asked and the service
    hosts = ", ".join(f"127.0.0.1:{s.port}" for s in group.sentinels)
    assert f"no sentinel at {hosts} knows service 'billing'" in str(exc.value)
    assert SECRET not in str(exc.value)


def test_addresses_without_a_sentinel_are_connection_failures(group):
    # given a closed port and a plain Redis server (not a sentinel)
    closed, plain = free_port(), group.servers[0].port
    # when the URL names only them
    with pytest.raises(rqueue.ConnectionFailed) as exc:
        rqueue.connect(f"redis+sentinel://:{SECRET}@127.0.0.1:{closed},127.0.0.1:{plain}/mymaster")
    # then ConnectionFailed says why each did not answer
    text = str(exc.value)
    assert text.startswith("cannot use redis+sentinel://:***@") and "no sentinel answered" in text
    assert f"127.0.0.1:{closed}: " in text and f"127.0.0.1:{plain} is not a sentinel" in text
    assert SECRET not in text


def test_rediss_sentinel_speaks_tls_to_the_sentinels(group):
    # given sentinels that speak plain text
    # when the URL asks for TLS (short timeouts: a TLS handshake with them never completes)
    url = group.url.replace("redis+", "rediss+") + "?socket_connect_timeout=0.3&socket_timeout=0.3"
    with pytest.raises(rqueue.ConnectionFailed) as exc:
        rqueue.connect(url)
    # then none of them answers
    assert "no sentinel answered" in str(exc.value)

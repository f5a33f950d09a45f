"""Failover on Redis Cluster: kill -9 of the primary that serves a queue
while a producer publishes durably and a worker consumes. A replica takes
over (cluster-node-timeout 2000 ms); the worker resumes, and every durably
confirmed message is handled. Each primary has two replicas, so that the
promoted one still has a replica to confirm durable publishes to."""

from __future__ import annotations

import threading
import time

import pytest
import redis
from support.servers import start_cluster, wait_for

import rqueue

CONFIRMED = 600  # durably confirmed messages the producer aims for
KILL_AFTER = 200  # confirmed messages before the primary is killed


@pytest.mark.slow
@pytest.mark.parametrize("partitions", [None, 3], ids=["plain", "partitioned"])
def test_kill_of_a_primary_loses_no_durably_confirmed_message(prefix, capsys, partitions):
    # given a cluster of 3 primaries with 2 replicas each, a worker on a queue (plain, or of 3 partitions),
    # and a producer publishing durably with ids
    cluster = start_cluster(replicas=2)
    try:
        client = rqueue.connect(cluster.url, prefix=prefix, failover_timeout=30, durable_timeout=2)
        client.configure("orders", ack_wait=5)
        q = client.queue("orders", partitions=partitions)
        watched = q.parts[0] if partitions else q  # the (partition) queue whose primary is killed
        handled: set[bytes] = set()
        handled_at: list[float] = []
        lock = threading.Lock()

        def handler(d: rqueue.Delivery) -> None:
            with lock:
                handled.add(d.data)
                handled_at.append(time.monotonic())

        worker = rqueue.Worker(q, "g", handler, concurrency=4, heartbeat_timeout=3, reconnect_timeout=60)
        worker.start()
        confirmed: list[bytes] = []
        failures: list[str] = []
        killed_at: list[float] = []

        def produce() -> None:
            producer = rqueue.connect(cluster.url, prefix=prefix, failover_timeout=30, durable_timeout=2)
            i = 0
            while len(confirmed) < CONFIRMED:
                body = f"m{i}".encode()
                try:
                    producer.queue("orders").publish(body, id=body.decode(), durable=True)
                except (rqueue.NotDurable, rqueue.RQueueError, OSError) as exc:
                    failures.append(type(exc).__name__)
                    continue  # the same id again: at-least-once, de-duplicated
                except Exception as exc:  # redis-py errors outside the retried set
                    failures.append(type(exc).__name__)
                    time.sleep(0.05)
                    continue
                confirmed.append(body)
                i += 1
            producer.close()

        producer = threading.Thread(target=produce)
        producer.start()
        # when the primary of the queue's slot is killed mid-run
        wait_for(lambda: len(confirmed) >= KILL_AFTER, timeout=60)
        victim = cluster.primary_of(watched.keys.msgs)
        victim.kill()
        killed_at.append(time.monotonic())
        producer.join(120)
        assert not producer.is_alive(), "the producer did not finish"
        # then every durably confirmed message is handled
        wait_for(lambda: handled.issuperset(confirmed), timeout=90)
        resumed = min(t for t in handled_at if t > killed_at[0]) - killed_at[0]
        worker.stop()
        worker.join(30)
        with capsys.disabled():
            kind = "3 partitions" if partitions else "plain queue"
            print(
                f"\nfailover ({kind}): {len(confirmed)} confirmed, all handled; "
                f"first handled {resumed:.1f} s after the kill; "
                f"{len(failures)} publish attempts retried ({sorted(set(failures))})"
            )
        assert cluster.primary_of(watched.keys.msgs) is not victim
        client.close()
    finally:
        cluster.stop()


@pytest.mark.slow
def test_a_worker_rides_out_a_cluster_that_is_down_for_seconds(prefix):
    # given a cluster of 3 primaries without replicas and a worker on a queue, whose client gives up on
    # cluster errors after 0.5 s (so the worker's own retries must carry it through)
    cluster = start_cluster(replicas=0)
    try:
        client = rqueue.connect(cluster.url, prefix=prefix, failover_timeout=0.5)
        q = client.queue("orders")
        keep = {cluster.primary_of(q.keys.msgs), cluster.primary_of(f"{prefix}:settings")}
        victim = next(n for n in cluster.nodes if n not in keep)
        handled: list[bytes] = []
        worker = rqueue.Worker(q, "g", lambda d: handled.append(d.data), concurrency=2, reconnect_timeout=60)
        worker.start()
        q.publish_many([b"before"] * 5)
        wait_for(lambda: len(handled) == 5)
        # when a primary dies: its slots are uncovered and every node answers CLUSTERDOWN
        victim.kill()
        wait_for(lambda: not cluster.is_ready(), timeout=20)
        wait_for(lambda: _answers_clusterdown(cluster, victim), timeout=20)
        # and comes back a few seconds later
        victim.start()
        wait_for(cluster.is_ready, timeout=30)
        q.publish_many([b"after"] * 5)
        # then the worker is still there and handles the new messages
        wait_for(lambda: len(handled) == 10, timeout=30)
        assert worker.join(0) is False
        worker.stop()
        assert worker.join(30)
        client.close()
    finally:
        cluster.stop()


def _answers_clusterdown(cluster, dead) -> bool:
    live = next(n for n in cluster.nodes if n is not dead)
    with redis.Redis(port=live.port) as r:
        return b"cluster_state:fail" in r.execute_command("CLUSTER", "INFO")

"""Live resharding: the slots of a busy queue, and of a partitioned queue's
partitions, move to a new primary (CLUSTER SETSLOT IMPORTING / MIGRATING,
MIGRATE of the keys a few at a time, SETSLOT NODE: what
`redis-cli --cluster reshard` does) while a worker and a durable producer
run. Every guarantee holds: no confirmed message lost, none run twice
(so none after its ack), and the longest stall is printed."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
import redis
from support.servers import start_cluster, wait_for

import rqueue
from rqueue.connection.cluster import slot_of


@pytest.fixture(scope="module")
def grown_cluster():
    cluster = start_cluster(replicas=1)
    try:
        target = cluster.add_primary(replicas=1)
        yield cluster, target
    finally:
        cluster.stop()


def move_slot(cluster, slot: int, target, pause: float = 0.02) -> None:
    """Moves ``slot`` to ``target`` as redis-cli --cluster reshard does, a
    few keys per MIGRATE with a pause between, so the migration lasts."""
    source = next(n for n in cluster.nodes if n.process and _owns(n, slot))
    if source is target:
        return
    src_id, dst_id = cluster.node_id(source), cluster.node_id(target)
    with redis.Redis(port=source.port) as src, redis.Redis(port=target.port) as dst:
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 3):
            src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "REPLACE", "KEYS", *keys)
            time.sleep(pause)
        for node in [target, source] + [n for n in cluster.nodes if n.process and n not in (target, source)]:
            with redis.Redis(port=node.port) as r:
                if r.info("replication")["role"] == "master":
                    r.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)


def _owns(node, slot: int) -> bool:
    with redis.Redis(port=node.port) as r:
        if r.info("replication")["role"] != "master":
            return False
        return any(
            low <= slot <= high and p[1] == node.port for low, high, p, *_ in r.execute_command("CLUSTER", "SLOTS")
        )


def run_under_resharding(cluster, target, prefix, partitions, capsys) -> None:
    client = rqueue.connect(cluster.url, prefix=prefix, failover_timeout=30, durable_timeout=3)
    producer = rqueue.connect(cluster.url, prefix=prefix, failover_timeout=30, durable_timeout=3)
    client.configure("busy", ack_wait=10)
    q = client.queue("busy", partitions=partitions)
    runs: Counter[bytes] = Counter()
    at: list[float] = []
    lock = threading.Lock()

    def handle(d: rqueue.Delivery) -> None:
        with lock:
            runs[d.data] += 1
            at.append(time.monotonic())

    w = rqueue.Worker(q, "g", handle, concurrency=4, heartbeat_timeout=10, reconnect_timeout=60)
    w.start()
    confirmed: list[bytes] = []
    retried: Counter[str] = Counter()
    latencies: list[float] = []
    stop = threading.Event()

    def produce() -> None:
        pq = producer.queue("busy")
        i = 0
        while not stop.is_set():
            body = f"m{i}".encode()
            started = time.monotonic()
            try:
                pq.publish(body, id=body.decode(), durable=True)
            except Exception as exc:  # the same id again: de-duplicated
                retried[type(exc).__name__] += 1
                continue
            latencies.append(time.monotonic() - started)
            confirmed.append(body)
            i += 1

    t = threading.Thread(target=produce)
    t.start()
    try:
        wait_for(lambda: len(confirmed) >= 100, timeout=60)
        parts = q.parts if partitions else [q]
        moved = sorted({slot_of(p.keys.base) for p in parts[:2]})
        started = time.monotonic()
        for slot in moved:
            move_slot(cluster, slot, target)
        took = time.monotonic() - started
        assert all(cluster.primary_of(p.keys.msgs) is target for p in parts[:2])
        count = len(confirmed)
        wait_for(lambda: len(confirmed) >= count + 100, timeout=60)
    finally:
        stop.set()
        t.join(60)
    try:
        wait_for(lambda: set(runs) >= set(confirmed), timeout=60)
    except BaseException:
        missing = sorted(set(confirmed) - set(runs))
        print("missing", len(missing), missing[:10], client.queue("busy").stats(), w.stats, flush=True)  # noqa: T201
        raise
    w.stop()
    assert w.join(30)
    lost = set(confirmed) - set(runs)
    twice = [m for m, n in runs.items() if n > 1]
    gaps = [b - a for a, b in zip(at, at[1:], strict=False)]
    with capsys.disabled():
        kind = f"{partitions} partitions" if partitions else "plain queue"
        print(
            f"\nresharding ({kind}): {len(moved)} slot(s) moved in {took:.2f} s; {len(confirmed)} confirmed, "
            f"{len(lost)} lost, {len(twice)} run twice; longest gap between handler runs {max(gaps):.2f} s, "
            f"slowest durable publish {max(latencies):.2f} s; publish retries {dict(retried)}"
        )
    assert not lost and not twice
    assert max(gaps) < 5.0 and max(latencies) < 5.0
    client.close()
    producer.close()


@pytest.mark.slow
def test_a_busy_queue_keeps_its_guarantees_while_its_slot_moves(grown_cluster, prefix, capsys):
    cluster, target = grown_cluster
    run_under_resharding(cluster, target, prefix, None, capsys)


@pytest.mark.slow
def test_a_partitioned_queue_keeps_its_guarantees_while_two_partitions_move(grown_cluster, prefix, capsys):
    cluster, target = grown_cluster
    run_under_resharding(cluster, target, prefix, 3, capsys)


def test_a_call_waits_out_a_slot_whose_keys_are_split_instead_of_failing(grown_cluster, prefix):
    # given a queue with messages and a group, on a cluster
    cluster, target = grown_cluster
    client = rqueue.connect(cluster.url, prefix=prefix, failover_timeout=10)
    # (a name whose slot an earlier test did not move to the new node already)
    q = next(
        q for q in (client.queue(f"split{i}") for i in range(1000)) if cluster.primary_of(q.keys.msgs) is not target
    )
    q.publish_many([b"m"] * 5)
    q.consumer("g")
    slot = slot_of(q.keys.base)
    source = cluster.primary_of(q.keys.msgs)
    # when its slot is mid-migration, one of its keys moved (scripts get TRYAGAIN on both nodes) for 1.5 s
    with redis.Redis(port=source.port) as src, redis.Redis(port=target.port) as dst:
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", cluster.node_id(source))
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", cluster.node_id(target))
        src.execute_command("MIGRATE", "127.0.0.1", target.port, q.keys.msgs, 0, 5000)
        got: list[object] = []
        t = threading.Thread(target=lambda: got.append(_outcome(q.publish, b"during")))
        started = time.monotonic()
        t.start()
        time.sleep(1.5)  # the migration's length is the scenario, not a wait for a condition
        assert t.is_alive(), f"the publish did not wait for the migration: {got}"
    move_slot(cluster, slot, target)
    t.join(15)
    # then the publish went through once the slot had moved, and nothing was stored twice
    assert isinstance(got[0], rqueue.PublishResult), got
    assert time.monotonic() - started >= 1.5
    assert q.stats().last_seq == 6
    client.close()


def _outcome(call, *args):
    try:
        return call(*args)
    except Exception as exc:
        return exc


def test_a_call_follows_ask_to_a_primary_the_client_has_never_seen(grown_cluster, prefix):
    # given a client that knows the cluster before a new primary joins, and a queue with a group
    cluster, _ = grown_cluster
    client = rqueue.connect(cluster.url, prefix=prefix, failover_timeout=10)
    q = client.queue("ask")
    q.publish_many([b"m"] * 3)
    q.consumer("g")
    fresh = cluster.add_primary()  # serves no slot: the client's slot map does not name it
    slot = slot_of(q.keys.base)
    source = cluster.primary_of(q.keys.msgs)
    # when every key of the queue's slot has moved to it but the slot is not handed over yet (the old node answers ASK)
    with redis.Redis(port=source.port) as src, redis.Redis(port=fresh.port) as dst:
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", cluster.node_id(source))
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", cluster.node_id(fresh))
        while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
            src.execute_command("MIGRATE", "127.0.0.1", fresh.port, "", 0, 5000, "KEYS", *keys)
        got: list[object] = []
        t = threading.Thread(target=lambda: got.append(_outcome(q.publish, b"asked")))
        t.start()
        time.sleep(0.8)  # the call meets ASK (and TRYAGAIN behind it) for this long: the scenario
        assert t.is_alive(), f"the publish did not wait: {got}"
    move_slot(cluster, slot, fresh)  # hands the slot over
    t.join(15)
    # then the publish went through on the new primary, once
    assert isinstance(got[0], rqueue.PublishResult), got
    assert cluster.primary_of(q.keys.msgs) is fresh and q.stats().last_seq == 4
    client.close()

"""Group positions and results across groups and partitions, on both
clients: a partitioned queue's group create/reset/delete in every partition
(a seq refused: each partition has its own), results kept per group and
found in their partition, and the trim step run by every publisher
(docs/retention.md, docs/results.md)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from datetime import UTC, datetime

import pytest
from click.testing import CliRunner
from support.aio_bridge import connect_as, parametrize_api
from support.servers import wait_for
from test_aio_worker import BACKENDS, BOTH, run_worker

import rqueue
from rqueue.cli import cli
from rqueue.partitions import partition_of
from rqueue.stored_results import encode_value

pytest_generate_tests = parametrize_api  # every test of a client runs against both (aio_bridge.py)

KEYS = [f"k{i}" for i in range(9)]  # spread over the partitions of a queue of 3


@pytest.fixture
def pq(client):
    return client.queue("orders", partitions=3)


def drain(consumer) -> list[bytes]:
    out: list[bytes] = []
    while batch := consumer.fetch(100):
        out += [d.data for d in batch]
        consumer.ack(batch)
    return sorted(out)


def floors(pq, group: str) -> list[int]:
    return [part.stats().group(group).ack_floor for part in pq.parts]


def publish(pq, n: int = 9, start: int = 0) -> list[rqueue.PublishResult]:
    return pq.publish_many([b"m%d" % i for i in range(start, start + n)], keys=KEYS[:n])


# -- group positions on a partitioned queue ---------------------------------------------


def test_a_partitioned_queues_group_is_created_reset_and_deleted_in_every_partition(client, pq):
    # given 9 messages over 3 partitions, kept by retention, that group g settled
    client.configure("orders", max_length=100)
    pq.trim()
    assert {r.partition for r in publish(pq)} == {0, 1, 2}
    everything = drain(pq.consumer("g"))
    assert len(everything) == 9
    # when a late group is created at "first", then it gets everything, from every partition
    after = pq.create_group("late", "first")
    assert after == [0, 0, 0]
    assert drain(pq.consumer("late")) == everything
    # when g is reset to "first", then each partition's reset is reported and g gets it all again
    reset = pq.reset_group("g", "first")
    assert [(r.partition, r.floor, r.cancelled) for r in reset] == [(0, 0, 0), (1, 0, 0), (2, 0, 0)]
    assert sum(r.previous for r in reset) == 9
    assert drain(pq.consumer("g")) == everything
    # and a group deleted from every partition is gone from each
    assert pq.delete_group("late") == 0
    assert pq.groups() == ["g"] and all(part.groups() == ["g"] for part in pq.parts)


def test_bad_group_positions_on_a_partitioned_queue_change_nothing(client, pq):
    # given a group in every partition
    publish(pq)
    drain(pq.consumer("g"))
    before = floors(pq, "g")
    # then a seq (each partition has its own), an existing group, a missing one are refused
    with pytest.raises(rqueue.InvalidInput, match=r"seq 3 names no position of a partitioned queue"):
        pq.create_group("late", 3)
    with pytest.raises(rqueue.InvalidInput, match=r"seq 2 names no position of a partitioned queue"):
        pq.reset_group("g", 2)
    with pytest.raises(rqueue.InvalidInput, match=r"has group 'g' already \(in partitions \[0, 1, 2\]\)"):
        pq.create_group("g", "first")
    with pytest.raises(rqueue.InvalidInput, match=r"has no group 'nope'"):
        pq.reset_group("nope", "first")
    with pytest.raises(rqueue.InvalidInput, match=r"has no group 'nope'"):
        pq.delete_group("nope")
    assert pq.groups() == ["g"] and floors(pq, "g") == before


@BACKENDS
def test_a_create_one_partition_refuses_is_undone_in_the_others(client, clock):
    # given two partitions, retention keeping one message: partition 0 stores its only
    # message, partition 1 trimmed the older of its two
    client.configure("parted", max_length=1)
    parted = client.queue("parted", partitions=2)
    two = [next(k for k in KEYS if partition_of(k, 2) == p) for p in range(2)]
    long_ago = datetime.fromtimestamp((clock.now_ms - 3_600_000) / 1000, UTC)
    parted.publish_many([b"a", b"b", b"c"], keys=[two[0], two[1], two[1]])
    drain(parted.consumer("g"))
    parted.trim()
    # when a group is created at a time older than partition 1 stores
    with pytest.raises(rqueue.InvalidInput, match=r"before the oldest message stored") as refused:
        parted.create_group("late", long_ago)
    # then the refusal changes nothing: partition 0's create is undone, and the note says so
    assert all(part.groups() == ["g"] for part in parted.parts)
    assert "undone" in " ".join(getattr(refused.value, "__notes__", []))
    assert parted.create_group("late", "first") == [0, 1]


def test_time_positions_apply_in_each_partition(client, pq, clock):
    # given 9 messages published at t0 and 9 at t0 + 10 s, over 3 partitions, retained
    client.configure("orders", max_age=3600)
    pq.trim()
    t0 = clock.now_ms
    publish(pq)
    clock.advance(10)
    publish(pq, start=9)
    drain(pq.consumer("g"))
    # when a group is created at t0 + 5 s, then it is handed the later 9 from each partition
    pq.create_group("later", datetime.fromtimestamp((t0 + 5_000) / 1000, UTC))
    assert drain(pq.consumer("later")) == sorted(b"m%d" % i for i in range(9, 18))


def test_a_reset_of_a_partitioned_queue_while_a_consumer_holds_deliveries(client, pq):
    # given a consumer of g holding deliveries in every partition
    client.configure("orders", max_length=100)
    publish(pq)
    c = pq.consumer("g", "w1")
    held = c.fetch(9)
    assert len(held) == 9
    before = floors(pq, "g")
    # when the group is reset without force, then it is refused and nothing changes
    with pytest.raises(rqueue.GroupInUse, match=r"9 deliveries in flight"):
        pq.reset_group("g", "first")
    with pytest.raises(rqueue.GroupInUse):
        pq.delete_group("g")
    assert floors(pq, "g") == before
    assert sum(part.stats().group("g").in_flight for part in pq.parts) == 9
    c.ack(held[:3])  # the held deliveries still settle: nothing was taken
    # when it is reset with force, then the rest are taken back
    reset = pq.reset_group("g", "first", force=True)
    assert sum(r.cancelled for r in reset) == 6
    # and their late acks change nothing, while every message is handed out again: nothing lost
    with pytest.raises(rqueue.DeliveryError):
        c.ack(held[3:])
    assert drain(pq.consumer("g", "w2")) == sorted(b"m%d" % i for i in range(9))
    assert sum(floors(pq, "g")) == 9


# -- results kept per group, and found in their partition --------------------------------


def test_two_groups_keep_their_own_results_through_a_redelivery(client, queue):
    # given two groups settling the same message, b only on its second delivery
    client.configure("orders", results=True)
    queue.publish(b"x")
    a, b = queue.consumer("a", "ca"), queue.consumer("b", "cb")
    (da,) = a.fetch(1)
    (db,) = b.fetch(1)
    b.nack(db, delay=0, error="once")
    a.ack_result(da, encode_value({"by": "a"}), event=False)
    (db,) = b.fetch(1)
    assert db.delivery_count == 2
    b.ack_result(db, encode_value({"by": "b"}), event=False)
    # then each group's result is kept, the last settle overwriting nothing
    assert queue.result(1, group="a").value == {"by": "a"}
    assert queue.result(1, group="b", timeout=1).value == {"by": "b"}
    # and without a group, or with one the queue lacks, the error says so at once
    with pytest.raises(rqueue.InvalidInput, match=r"has groups 'a', 'b', each keeps its own result: name one"):
        queue.result(1)
    started = time.monotonic()
    with pytest.raises(rqueue.InvalidInput, match=r"has no group 'c' and no result of it \(its groups: 'a', 'b'\)"):
        queue.result(1, timeout=30, group="c")
    assert time.monotonic() - started < 5
    with pytest.raises(rqueue.InvalidName):
        queue.result(1, group="")
    with pytest.raises(rqueue.ResultTimeout, match=r"seq 2 of queue 'orders' for group 'a'"):
        queue.result(2, group="a")


def test_a_partitioned_queue_finds_the_result_in_its_partition(client, pq):
    # given results on and one message per partition, each acked with its own result
    client.configure("orders", results=True)
    published = publish(pq, 3)
    c = pq.consumer("g")
    for d in c.fetch(3):
        c.ack_result(d, encode_value(d.data), event=False)
    # then the result of each is found from its PublishResult, or its seq and partition
    for i, r in enumerate(published):
        assert pq.result(r, timeout=1).value == b"m%d" % i
        assert pq.result(r.seq, partition=r.partition, group="g").value == b"m%d" % i
    # and a bare seq (every partition has a seq 1), or a partition that is not one, is refused
    with pytest.raises(rqueue.InvalidInput, match=r"is partitioned: a seq names a message of one partition"):
        pq.result(1)
    with pytest.raises(rqueue.InvalidInput, match=r"partition 3 is not one of queue 'orders' \(it has 3\)"):
        pq.result(1, partition=3)
    other = (published[0].partition + 1) % 3
    with pytest.raises(rqueue.InvalidInput, match=r"names partition"):
        pq.result(published[0], partition=other)


def test_a_partitioned_consumer_acks_with_results_in_each_partition(client, pq):
    # given results on, one message per partition, and one of them acked already
    client.configure("orders", results=True)
    published = publish(pq, 3)
    c = pq.consumer("g")
    ds = c.fetch(3)
    c.ack(ds[1])
    # when all three are acked with a result each, leniently
    statuses = c.ack_results([(d, encode_value(d.data)) for d in ds], event=False)
    # then the one acked before is refused and keeps none; the others keep theirs, in their partitions
    assert [type(s).__name__ for s in statuses] == ["NoneType", "AlreadyAcked", "NoneType"]
    published_as = {b"m%d" % i: r for i, r in enumerate(published)}
    for d in (ds[0], ds[2]):
        assert pq.result(published_as[d.data], timeout=1).value == d.data
    with pytest.raises(rqueue.ResultTimeout):
        pq.result(published_as[ds[1].data], timeout=0.05)


@pytest.mark.parametrize("backend", ["memory"], indirect=True)  # an error raised before any call
def test_a_partitioned_queue_sends_the_result_of_an_alternates_message_there(client):
    # given a partitioned queue with no group, whose mandatory publish went to its alternate queue
    client.configure("parted", results=True, alternate="spill")
    pq = client.queue("parted", partitions=3)
    taken = pq.publish(b"x", mandatory=True)
    assert (taken.alternate, taken.partition) == ("spill", None)
    # then asking the partitioned queue for its result names the queue that has it
    with pytest.raises(rqueue.InvalidInput, match=r"seq 1 is a seq of the alternate queue 'spill'"):
        pq.result(taken)


def test_a_result_is_found_by_message_id_in_a_plain_or_partitioned_queue(client, queue):
    # given results on, a plain message and a partitioned one published with an id,
    # the latter routed by a key to a partition other than its id's
    client.configure("orders", results=True)
    client.configure("parted", results=True)
    pq = client.queue("parted", partitions=3)
    queue.publish(b"plain", id="order-1")
    key = next(k for k in KEYS if partition_of(k, 3) != partition_of("order-2", 3))
    routed = pq.publish(b"parted", id="order-2", key=key)
    for q in (queue, pq):
        c = q.consumer("g")
        for d in c.fetch(10):
            c.ack_result(d, encode_value(d.data), event=False)
    # then each is found by its id, the partitioned one in the partition that took it
    assert queue.result("order-1", timeout=1).value == b"plain"
    found = pq.result("order-2", timeout=1, group="g")
    assert (found.value, found.seq, found.partition) == (b"parted", routed.seq, routed.partition)
    assert queue.result(1).partition is None
    # and an id never published is refused at once, naming it
    for q in (queue, pq):
        with pytest.raises(rqueue.InvalidInput, match=rf"message id 'nope' is not known to queue '{q.name}'"):
            q.result("nope", timeout=30)


# -- the trim step from every publisher --------------------------------------------------


@BACKENDS
def test_every_publisher_runs_the_trim_step(client, queue, backend, api):
    # given a queue keeping 2 messages, and a group that settled 10; and a
    # partitioned queue keeping 1, whose group settled 2 in each partition
    client.configure("orders", max_length=2)
    queue.publish_many([b"m"] * 10)
    drain(queue.consumer("g"))
    client.configure("parted", max_length=1)
    two = [next(k for k in KEYS if partition_of(k, 2) == p) for p in range(2)]
    parted = client.queue("parted", partitions=2)
    parted.publish_many([b"p"] * 4, keys=two * 2)
    drain(parted.consumer("g"))
    # when another client of the same kind publishes to each (its first publish runs a step)
    other = connect_as(api, client.url, prefix=client.prefix, settings_ttl=0)
    try:
        other.queue("orders").publish(b"m11")
        other.queue("parted").publish_many([b"p"] * 2, keys=two)
    finally:
        other.close()
    # then what retention does not keep is gone
    assert [m.seq for m in queue.peek(100)] == [10, 11]
    kept = [[m.seq for m in part.peek(100)] for part in client.queue("parted").parts]
    assert kept == [[3], [3]]


# -- the command line --------------------------------------------------------------------


def cli_run(client, *args):
    return CliRunner().invoke(cli, ["--url", client.url, "--prefix", client.prefix, *args])


# A memory:// server lives in one client: the command's own client would see another.
@pytest.mark.sync_only("the command line runs the sync client")
@pytest.mark.parametrize("backend", ["redis"], indirect=True)
def test_group_and_result_commands_on_a_partitioned_queue(client):
    # (on the wall clock, as the commands are: an id is known by its expiry in server time)
    live = rqueue.connect(client.url, prefix=client.prefix, settings_ttl=0)
    pq = live.queue("orders", partitions=3)
    client.configure("orders", max_length=100, results=True)
    published = pq.publish_many([b"m0", b"m1", b"m2"], keys=KEYS[:3], ids=["o-0", "o-1", "o-2"])
    c = pq.consumer("g")
    for d in c.fetch(3):
        c.ack_result(d, encode_value({"n": 1}), event=False)
    made = cli_run(client, "group", "create", "orders", "late", "--from", "first", "--json")
    assert made.exit_code == 0, made.output
    assert json.loads(made.stdout) == {
        "queue": "orders",
        "group": "late",
        "partitions": [{"partition": p, "after": 0} for p in range(3)],
    }
    reset = cli_run(client, "group", "reset", "orders", "g", "--to", "last", "--json")
    assert sum(p["floor"] for p in json.loads(reset.stdout)["partitions"]) == 3
    refused = cli_run(client, "group", "reset", "orders", "g", "--to", "seq:1")
    assert refused.exit_code != 0 and "each partition has its own seqs" in refused.output
    gone = cli_run(client, "group", "delete", "orders", "late", "--json")
    assert json.loads(gone.stdout) == {"queue": "orders", "group": "late", "cancelled": 0}
    r = published[1]
    found = cli_run(client, "result", "orders", str(r.seq), "--partition", str(r.partition), "--json")
    assert found.exit_code == 0, found.output
    assert json.loads(found.stdout) == {
        "queue": "orders",
        "seq": r.seq,
        "group": "g",
        "partition": r.partition,
        "ok": True,
        "value": {"n": 1},
    }
    by_id = cli_run(client, "result", "orders", "--id", "o-1", "--json")
    assert by_id.exit_code == 0, by_id.output
    assert (json.loads(by_id.stdout)["seq"], json.loads(by_id.stdout)["partition"]) == (r.seq, r.partition)
    bare = cli_run(client, "result", "orders", "1")
    assert bare.exit_code != 0 and "is partitioned" in bare.output
    neither = cli_run(client, "result", "orders")
    assert neither.exit_code == 2 and "not both and not neither" in neither.output
    live.close()


@BACKENDS
@BOTH
def test_a_forced_reset_of_a_partitioned_queue_under_a_running_worker_loses_nothing(kind, backend, prefix):
    # given a worker whose handler is held on its first message, 9 messages over 3 partitions, retained
    live = rqueue.connect(backend, prefix=prefix, settings_ttl=0)
    live.configure("orders", max_age=3600)
    pq = live.queue("orders", partitions=3)
    publish(pq)
    started, release = threading.Event(), threading.Event()
    seen: list[bytes] = []

    def handler(d):
        seen.append(d.data)
        if not started.is_set():
            started.set()
            release.wait(10)

    async def async_handler(d):
        seen.append(d.data)
        if not started.is_set():
            started.set()
            await asyncio.to_thread(release.wait, 10)

    w = run_worker(kind, backend, prefix, pq, handler if kind == "threaded" else async_handler, concurrency=1)
    try:
        assert started.wait(10)
        # when the group is reset to "first": refused while the worker holds deliveries, then forced
        with pytest.raises(rqueue.GroupInUse):
            pq.reset_group("g", "first")
        handled_before = len(seen)
        reset = pq.reset_group("g", "first", force=True)
        assert sum(r.cancelled for r in reset) >= 1
        release.set()
        # then the worker goes on, its old ack changing nothing, and every message is handled after the reset
        wait_for(lambda: sum(floors(pq, "g")) == 9 and pq.stats().groups[0].in_flight == 0, timeout=20)
        assert sorted(set(seen[handled_before:])) == sorted(b"m%d" % i for i in range(9))
        assert all(part.stats().group("g").pending == 0 for part in pq.parts)
    finally:
        release.set()
        w.stop()
        assert w.join(10)
        live.close()


@pytest.mark.sync_only("the refusal is injected into the sync client's engine call")
@pytest.mark.parametrize("backend", ["memory"], indirect=True)
def test_a_partition_refusing_after_others_changed_names_them(client, pq, monkeypatch):
    # given a group in every partition, messages retained, and partition 1's reset refused by its script
    client.configure("orders", max_length=100)
    pq.trim()
    publish(pq)
    drain(pq.consumer("g"))
    real = rqueue.engine.commands.group_reset

    def refuse_in_partition_1(call, *args):
        if call.where == pq.parts[1].keys.base:
            raise rqueue.InvalidInput("position refused")
        return real(call, *args)

    monkeypatch.setattr(rqueue.engine.commands, "group_reset", refuse_in_partition_1)
    # when the group is reset, then the error says which partitions changed and which did not
    with pytest.raises(rqueue.InvalidInput, match="position refused") as refused:
        pq.reset_group("g", "first")
    assert refused.value.__notes__ == [
        "group 'g': reset applied in partitions [0] already, not in [1, 2]; "
        "do it in those partitions' queues (queue.parts[i]) once the cause is fixed"
    ]
    first, *rest = floors(pq, "g")
    assert first == 0 and all(f > 0 for f in rest)


@pytest.mark.sync_only("the refusal is injected into the sync client's engine call")
@pytest.mark.parametrize("backend", ["memory"], indirect=True)
def test_a_delete_refused_part_way_names_only_the_partitions_with_the_group(client, pq, monkeypatch):
    # given group g in partitions 0 and 2 only, and partition 2's delete refused by its script
    for p in (0, 2):
        pq.parts[p].create_group("g", "first")
    real = rqueue.engine.commands.group_delete

    def refuse_in_partition_2(call, *args):
        if call.where == pq.parts[2].keys.base:
            raise rqueue.InvalidInput("delete refused")
        return real(call, *args)

    monkeypatch.setattr(rqueue.engine.commands, "group_delete", refuse_in_partition_2)
    # when the group is deleted, then the note names partition 2 as left, not partition 1, which never had it
    with pytest.raises(rqueue.InvalidInput, match="delete refused") as refused:
        pq.delete_group("g")
    assert refused.value.__notes__ == [
        "group 'g': delete applied in partitions [0] already, not in [2]; "
        "do it in those partitions' queues (queue.parts[i]) once the cause is fixed"
    ]

"""Retention (max_age, max_length) and group positions: create at a
position, reset, delete (docs/retention.md)."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime

import pytest
from support import logview
from support.refusals import names_input, nothing_changes
from support.servers import wait_for

import rqueue


def drain(consumer: rqueue.Consumer) -> list[bytes]:
    """Fetches and acks until nothing is left; the payloads, in order."""
    out: list[bytes] = []
    while batch := consumer.fetch(100):
        out += [d.data for d in batch]
        consumer.ack(batch)
    return out


def stored(queue: rqueue.Queue) -> list[int]:
    return [m.seq for m in queue.peek(1000)]


def payloads(n: int, start: int = 1) -> list[bytes]:
    return [b"m%d" % i for i in range(start, start + n)]


def test_without_retention_a_late_group_gets_nothing_settled(queue):
    # given a group that settled everything
    queue.publish_many(payloads(5))
    drain(queue.consumer("g"))
    # when a group is created afterwards, then it finds nothing stored
    assert queue.create_group("late") == 5
    assert drain(queue.consumer("late")) == []
    assert stored(queue) == []


def test_max_length_keeps_the_newest_settled_messages_for_a_late_group(client, queue):
    # given a queue that keeps the last 3 messages, and a group that settled 6
    client.configure("orders", max_length=3)
    queue.trim()
    queue.publish_many(payloads(6))
    drain(queue.consumer("g"))
    # when a trim step runs
    step = queue.trim()
    # then the 3 newest stay, and a late group from "first" gets them
    assert step.retained and step.trimmed == 3 and step.passed == 3
    assert stored(queue) == [4, 5, 6]
    queue.create_group("late", rqueue.Start.FIRST)
    assert drain(queue.consumer("late")) == payloads(3, 4)
    # and a consumer's join without a position starts there too
    assert drain(queue.consumer("later")) == payloads(3, 4)


def test_max_age_keeps_settled_messages_until_they_are_older(client, queue, clock):
    # given a queue that keeps settled messages 60 s, 2 published 100 s ago and 2 now
    client.configure("orders", max_age=60)
    queue.publish_many(payloads(2))
    clock.advance(100)
    queue.publish_many(payloads(2, 3))
    drain(queue.consumer("g"))
    # when a trim step runs, then only the 2 older than 60 s go
    assert queue.trim().trimmed == 2
    assert stored(queue) == [3, 4]
    # and after 60 s more the rest go
    clock.advance(61)
    assert queue.trim().trimmed == 4 and stored(queue) == []


def test_retention_never_deletes_what_a_group_has_not_settled(client, queue):
    # given a queue keeping nothing extra, a group that acks and one that never does
    client.configure("orders", max_length=0)
    queue.trim()
    queue.publish_many(payloads(5))
    c = queue.consumer("never")
    held = c.fetch(2)
    drain(queue.consumer("fast"))
    # when trim steps run
    for _ in range(3):
        queue.trim()
    # then every message the slow group has not settled is stored
    assert stored(queue) == [1, 2, 3, 4, 5]
    c.ack(held)
    assert queue.trim().trimmed == 2
    assert drain(c) == payloads(3, 3)
    assert queue.trim().trimmed == 5 and stored(queue) == []


def test_publishers_run_the_trim_step(client, queue):
    # given a queue keeping 2 messages, and a group that settles 10
    client.configure("orders", max_length=2)
    queue.publish_many(payloads(10))
    drain(queue.consumer("g"))
    # when another client publishes (its first publish to the queue runs a step)
    other = rqueue.connect(client.url, prefix=client.prefix, settings_ttl=0)
    try:
        other.queue("orders").publish(b"m11")
    finally:
        other.close()
    # then what retention does not keep is gone
    assert stored(queue) == [10, 11]


def test_create_group_at_last_seq_and_time(client, queue, clock):
    # given 6 retained messages, 3 published at t0 and 3 at t0 + 10 s
    client.configure("orders", max_age=3600)
    queue.trim()
    t0 = clock.now_ms
    queue.publish_many(payloads(3))
    clock.advance(10)
    queue.publish_many(payloads(3, 4))
    drain(queue.consumer("g"))
    # when groups are created at each kind of position
    assert queue.create_group("at-last", "last") == 6
    assert queue.create_group("at-seq", 5) == 4
    assert queue.create_group("at-time", datetime.fromtimestamp((t0 + 5_000) / 1000, UTC)) == 3
    assert queue.create_group("at-start", datetime.fromtimestamp(t0 / 1000, UTC)) == 0
    assert queue.create_group("after-last", 7) == 6
    # then each is handed what lies after its position
    assert drain(queue.consumer("at-last")) == []
    assert drain(queue.consumer("at-seq")) == payloads(2, 5)
    assert drain(queue.consumer("at-time")) == payloads(3, 4)
    assert drain(queue.consumer("at-start")) == payloads(6)
    queue.publish(b"new")
    assert drain(queue.consumer("at-last")) == [b"new"]
    assert drain(queue.consumer("after-last")) == [b"new"]


@pytest.mark.parametrize(
    ("position", "fragments"),
    [
        (9, ("seq 9 is beyond the last published seq, 6",)),
        (2, ("seq 2 is no longer stored", "the oldest seq stored is 4")),
        (0, ("seq 0 is not a seq",)),
        ("middle", ("position 'middle' is not one",)),
        (True, ("position True is not one",)),
        (datetime(2020, 1, 1), ("has no timezone",)),
    ],
)
def test_bad_positions_are_refused_and_change_nothing(client, queue, position, fragments):
    # given 6 messages of which the first 3 were trimmed
    client.configure("orders", max_length=3)
    queue.trim()
    queue.publish_many(payloads(6))
    drain(queue.consumer("g"))
    queue.trim()
    # when a group is created or reset at a bad position, then nothing changes
    with nothing_changes(client, queue), pytest.raises(rqueue.InvalidInput) as exc:
        queue.create_group("late", position)
    names_input(exc.value, *fragments)
    with nothing_changes(client, queue), pytest.raises(rqueue.InvalidInput) as exc:
        queue.reset_group("g", position)
    names_input(exc.value, *fragments)


def test_a_time_before_the_oldest_stored_message_is_refused(client, queue, clock):
    # given messages of which the oldest were trimmed
    client.configure("orders", max_length=2)
    queue.trim()
    early = clock.now_ms
    queue.publish_many(payloads(4))
    drain(queue.consumer("g"))
    queue.trim()
    # when a group is created from a time before the oldest stored message
    with nothing_changes(client, queue), pytest.raises(rqueue.InvalidInput) as exc:
        queue.create_group("late", datetime.fromtimestamp((early - 1000) / 1000, UTC))
    # then it is refused, naming the oldest stored message
    names_input(exc.value, "is before the oldest message stored (seq 3")


def test_existing_and_unknown_groups_are_refused(client, queue):
    queue.publish(b"a")
    queue.consumer("g").close()
    with nothing_changes(client, queue), pytest.raises(rqueue.InvalidInput) as exc:
        queue.create_group("g")
    names_input(exc.value, "group g exists")
    for call in (lambda: queue.reset_group("nope", "first"), lambda: queue.delete_group("nope")):
        with nothing_changes(client, queue), pytest.raises(rqueue.InvalidInput) as exc:
            call()
        names_input(exc.value, "group nope does not exist")


def test_reset_back_hands_settled_messages_again(client, queue):
    # given retained messages a group settled
    client.configure("orders", max_age=3600)
    queue.trim()
    queue.publish_many(payloads(4))
    c = queue.consumer("g")
    assert drain(c) == payloads(4)
    # when the group is reset to seq 2
    reset = queue.reset_group("g", 2)
    # then it is handed seq 2 on again, and its figures follow
    assert (reset.previous, reset.floor, reset.cancelled) == (4, 1, 0)
    assert queue.stats().group("g").pending == 3
    assert drain(c) == payloads(3, 2)
    assert queue.stats().group("g").ack_floor == 4
    assert [e["event"] for e in queue.events()][-1:] == ["reset"]


def test_reset_forward_skips_and_the_skipped_records_are_trimmed(queue):
    # given one group with 5 unread messages (no retention)
    queue.publish_many(payloads(5))
    c = queue.consumer("g")
    # when it is reset to the last seq
    assert queue.reset_group("g", "last").floor == 5
    # then it is handed nothing of them, and a trim step deletes them
    assert drain(c) == []
    assert queue.trim().trimmed == 5 and stored(queue) == []
    # and the queue leaves retention mode: acks delete records again
    queue.publish(b"next")
    assert drain(c) == [b"next"] and stored(queue) == []


def test_reset_refuses_while_deliveries_are_in_flight(client, queue):
    queue.publish_many(payloads(3))
    c = queue.consumer("g")
    c.fetch(2)
    with nothing_changes(client, queue), pytest.raises(rqueue.GroupInUse) as exc:
        queue.reset_group("g", "first")
    assert exc.value.in_flight == 2 and exc.value.group == "g"
    with nothing_changes(client, queue), pytest.raises(rqueue.GroupInUse):
        queue.delete_group("g")


def test_forced_reset_fences_the_deliveries_it_took_back(client, queue):
    # given a consumer holding 2 deliveries, one nacked to wait, and one acked
    client.configure("orders", max_age=3600)
    queue.trim()
    queue.publish_many(payloads(5))
    c = queue.consumer("g")
    d1, d2, d3, d4 = c.fetch(4)
    d4.ack()
    d3.nack(delay=60)
    # when the group is reset to the start with force
    reset = queue.reset_group("g", "first", force=True)
    assert reset.cancelled == 2
    # then the old deliveries settle nothing
    with pytest.raises(rqueue.UnknownDeliveryTag):
        d1.ack()
    with pytest.raises((rqueue.UnknownDeliveryTag, rqueue.StaleDelivery)):
        d2.nack()
    # and everything is handed again, once, with fresh tags
    again = c.fetch(10)
    assert [d.data for d in again] == payloads(5)
    with pytest.raises(rqueue.UnknownDeliveryTag):
        d1.ack()  # its token names no delivery of the new round
    c.ack(again)
    # and an old ack after the new one is refused as acked
    with pytest.raises(rqueue.AlreadyAcked):
        d2.ack()
    g = queue.stats().group("g")
    assert (g.ack_floor, g.in_flight, g.pending, g.delayed) == (5, 0, 0, 0)
    assert drain(c) == []


def test_reset_of_one_group_loses_nothing_for_another(queue):
    # given two groups without retention: one settled all 4, the other none
    queue.publish_many(payloads(4))
    fast, slow = queue.consumer("fast"), queue.consumer("slow")
    drain(fast)
    # when the fast group is reset to the start and settles all again
    queue.reset_group("fast", "first")
    assert drain(fast) == payloads(4)
    # then the slow group still gets every message (settled counts are not trusted after a reset)
    assert drain(slow) == payloads(4)
    assert queue.trim().trimmed == 4 and stored(queue) == []


def test_delete_group_loses_nothing_for_the_others(client, queue):
    # given three groups without retention; "gone" and "fast" settled 1..3
    queue.publish_many(payloads(3))
    gone, fast, slow = queue.consumer("gone"), queue.consumer("fast"), queue.consumer("slow")
    drain(gone)
    gone.close()
    # when "gone" is deleted and "fast" settles everything
    assert queue.delete_group("gone") == 0
    drain(fast)
    # then "slow" still gets every message, and the group's keys are gone
    assert drain(slow) == payloads(3)
    assert queue.groups() == ["fast", "slow"]
    left = [k for k in client.redis.scan_iter(match=f"{client.prefix}:*") if k.endswith(b":gone")]
    assert left == []


def test_forced_delete_takes_back_deliveries(queue):
    queue.publish_many(payloads(2))
    c = queue.consumer("g")
    held = c.fetch(2)
    assert queue.delete_group("g", force=True) == 2
    with pytest.raises((rqueue.UnknownDeliveryTag, rqueue.NotMember)):
        c.ack(held[0])
    assert queue.groups() == []
    assert stored(queue) == [1, 2]  # a queue without groups keeps everything


def test_a_missing_record_does_not_make_a_time_position_skip(client, queue, clock):
    # given retained messages at t0 .. t0 + 3 s, one record deleted by hand
    client.configure("orders", max_age=3600)
    queue.trim()
    t0 = clock.now_ms
    for i in range(4):
        queue.publish(b"m%d" % (i + 1))
        clock.advance(1)
    logview.delete(client.redis, queue.keys, 2)
    # when a group starts from t0 + 1 s (seq 2's time)
    floor = queue.create_group("late", datetime.fromtimestamp((t0 + 1000) / 1000, UTC))
    # then it skips nothing stored at or after that time
    assert floor in (1, 2)
    assert drain(queue.consumer("late")) == [b"m3", b"m4"]


def cli_run(client, *args):
    from click.testing import CliRunner

    from rqueue.cli import cli

    return CliRunner().invoke(cli, ["--url", client.url, "--prefix", client.prefix, *args])


# A memory:// server lives in one client: the command's own client would see another.
@pytest.mark.parametrize("backend", ["redis", "valkey", "cluster"], indirect=True)
def test_group_commands_with_json(client, queue):
    # given 4 messages a group settled, kept by retention
    client.configure("orders", max_length=10)
    queue.publish_many(payloads(4))
    drain(queue.consumer("g"))
    # when groups are created, reset and deleted from the command line
    made = cli_run(client, "group", "create", "orders", "late", "--from", "seq:3", "--json")
    assert json.loads(made.stdout) == {"queue": "orders", "group": "late", "after": 2}
    reset = cli_run(client, "group", "reset", "orders", "g", "--to", "first", "--json")
    assert json.loads(reset.stdout) == {"queue": "orders", "group": "g", "previous": 4, "floor": 0, "cancelled": 0}
    text = cli_run(client, "group", "create", "orders", "now", "--from", "2020-01-01T00:00:00Z")
    assert text.exit_code == 0 and "after seq 0" in text.stdout
    gone = cli_run(client, "group", "delete", "orders", "now", "--json")
    assert json.loads(gone.stdout) == {"queue": "orders", "group": "now", "cancelled": 0}
    # then each took effect
    assert drain(queue.consumer("late")) == payloads(2, 3)
    assert drain(queue.consumer("g")) == payloads(4)
    assert queue.groups() == ["g", "late"]
    # and bad input is refused with a message naming it
    for args, fragment in [
        (("create", "orders", "x", "--from", "soon"), "position 'soon' is not one"),
        (("create", "orders", "x", "--from", "2020-01-01T00:00:00"), "has no timezone"),
        (("create", "orders", "x", "--from", "99"), "seq 99 is beyond the last published seq, 4"),
        (("reset", "orders", "nope", "--to", "last"), "group nope does not exist"),
    ]:
        bad = cli_run(client, "group", *args)
        assert bad.exit_code != 0 and fragment in bad.output, bad.output


def test_a_worker_holding_deliveries_through_a_forced_reset(backend, prefix):
    # given a worker whose handler is running seq 1, with 3 messages kept by retention
    live = rqueue.connect(backend, prefix=prefix, settings_ttl=0)
    live.configure("orders", max_age=3600)
    q = live.queue("orders")
    q.publish_many(payloads(3))
    started, release = threading.Event(), threading.Event()
    seen: list[tuple[int, int]] = []
    lock = threading.Lock()

    def handler(d: rqueue.Delivery) -> None:
        with lock:
            seen.append((d.seq, len(seen)))
        if d.seq == 1 and not started.is_set():
            started.set()
            release.wait(10)

    w = rqueue.Worker(q, "g", handler, concurrency=1, prefetch=1)
    w.start()
    try:
        assert started.wait(10)
        # when the group is reset to the start with force while the handler runs, then the handler ends
        reset = q.reset_group("g", "first", force=True)
        assert reset.cancelled >= 1
        release.set()
        # then the worker goes on: every message is handled again after the reset, and its old ack changed nothing
        wait_for(lambda: q.stats().group("g").ack_floor == 3 and q.stats().group("g").in_flight == 0)
        with lock:
            after = [s for s, _ in seen[1:]]
        assert sorted(set(after)) == [1, 2, 3]
        g = q.stats().group("g")
        assert (g.pending, g.ready, g.delayed) == (0, 0, 0)
    finally:
        release.set()
        w.stop()
        assert w.join(10)  # its threads done with the client before it closes
        live.close()


def test_the_doctor_finds_nothing_wrong_with_retained_and_reset_queues(client, queue):
    from rqueue import doctor

    # given a queue keeping settled messages, a group reset with force while it held some, and one deleted
    client.configure("orders", max_length=100)
    queue.trim()
    queue.publish_many(payloads(6))
    a, b = queue.consumer("a"), queue.consumer("b")
    drain(a)
    b.fetch(2)
    queue.reset_group("a", 3)
    queue.reset_group("b", "first", force=True)
    queue.consumer("c").close()
    queue.delete_group("c")
    # when the doctor examines it, then it finds nothing
    assert doctor.examine(queue) == []


def test_max_age_passes_seqs_whose_records_went_before_retention(client, queue, clock):
    # given two groups that settled seqs 2 and 3 (deleted: every group settled
    # them) while holding seq 1, before retention applied
    queue.publish_many(payloads(3))
    g, h = queue.consumer("g"), queue.consumer("h")
    held_g, held_h = g.fetch(3), h.fetch(3)
    g.ack(held_g[1:])
    h.ack(held_h[1:])
    # A stream log keeps a record settled above the lowest floor until the
    # floor passes it (docs/layout-d-plan.md, "Step 3, first part (built)"):
    # there, 2 and 3 are still stored, and retention keeps them with seq 1.
    kept = [1, 2, 3] if logview.is_stream(queue.keys) else [1]
    assert stored(queue) == kept
    # when retention applies, seq 1 is settled and kept, and later a trim step runs
    client.configure("orders", max_age=60)
    queue.trim()
    g.ack(held_g[0])
    h.ack(held_h[0])
    assert stored(queue) == kept
    clock.advance(61)
    # then the seqs without records do not stop it
    assert queue.trim().trimmed == 3 and stored(queue) == []


def test_a_reset_hands_out_priority_messages_again_and_a_delete_leaves_no_flow_keys(client, queue):
    # given a group that pulled priority messages into its priority set and settled one of them
    client.configure("orders", max_length=100, rate_limit=1000)
    queue.publish_many(payloads(3), priority=[5, 5, 0])
    c = queue.consumer("g")
    [first] = c.fetch(1)
    first.ack()
    # when the group is reset back to its first stored message
    queue.reset_group("g", "first")
    # then every message is handed out again, priority ones first, none stalled
    assert drain(c) == [b"m1", b"m2", b"m3"]
    # and a deleted group leaves neither its priority set, its pull position nor its rate window
    queue.delete_group("g")
    gk = queue.keys.group("g")
    assert client.redis.exists(*gk.group_only()) == 0


def test_a_reset_leaves_no_count_that_could_delete_what_another_group_needs(client, queue):
    # given two groups without retention; "fast" settled 1..3, "slow" none
    queue.publish_many(payloads(3))
    fast, slow = queue.consumer("fast"), queue.consumer("slow")
    drain(fast)
    # when fast is reset, the retention mode's field is deleted by hand, and fast settles all again
    queue.reset_group("fast", "first")
    client.redis.hdel(queue.keys.meta, "retain")
    drain(fast)
    # then the slow group still gets every message
    assert drain(slow) == payloads(3)


def test_a_replay_after_a_reset_back_hands_a_message_out_once(client, queue):
    # given a dead letter, and its group reset back before it
    client.configure("orders", max_length=100)
    queue.publish_many(payloads(2))
    c = queue.consumer("g")
    first, second = c.fetch(2)
    first.reject()
    second.ack()
    queue.reset_group("g", "first")
    # when it is replayed, then it is skipped: the group reads it again anyway
    assert (queue.replay_dead_letters().replayed, len(queue.dead_letters())) == (0, 1)
    # and the group's fetch hands each message out once
    assert [d.seq for d in c.fetch(10)] == [1, 2]


def test_a_forced_reset_over_a_deleted_priority_message_settles_it(client, queue):
    # given a priority message acked (and so deleted) while an older plain one is still in flight
    queue.publish(b"plain")
    queue.publish(b"urgent", priority=5)
    c = queue.consumer("g")
    urgent, plain = c.fetch(2)
    assert (urgent.seq, plain.seq) == (2, 1)
    urgent.ack()
    # when the group is reset back over both, taking the in-flight one back
    queue.reset_group("g", "first", force=True)
    # then the plain one comes again, and the deleted one is settled, not dead-lettered as missing.
    # A stream log keeps the acked one (settled above the lowest floor) and a
    # forced reset back over settled messages hands them out again
    # (docs/layout-d-plan.md, "Step 3, first part (built)"): it comes again
    # too, first, as its priority says.
    assert [d.seq for d in c.fetch(10)] == ([2, 1] if logview.is_stream(queue.keys) else [1])
    assert queue.dead_letters() == []


@pytest.mark.parametrize("backend", ["memory"], indirect=True)  # the client's decision, no script involved
def test_publishers_of_one_client_run_one_trim_step_while_one_is_under_way(client, monkeypatch):
    # given an asyncio client whose trim step is held until every publish below is done
    import asyncio

    import rqueue.aio
    import rqueue.aio.publishing as aio_publishing

    steps = []
    gate: list[asyncio.Event] = []
    retain = aio_publishing.acmd.retain

    async def held_retain(*args, **kwargs):
        steps.append(1)
        await gate[0].wait()
        return await retain(*args, **kwargs)

    monkeypatch.setattr(aio_publishing.acmd, "retain", held_retain)

    async def burst() -> None:
        gate.append(asyncio.Event())
        ac = await rqueue.aio.connect(client.url, prefix=client.prefix, settings_ttl=0)
        try:
            await ac.configure("orders", max_length=5)
            q = ac.queue("orders")

            async def publish(i: int) -> None:
                await asyncio.sleep(i * 0.01)  # spread over 0.2 s, past the step interval
                await q.publish(b"m")

            # when 20 publishes complete while the first one's step is under way
            await asyncio.gather(*(publish(i) for i in range(20)))
        finally:
            gate[0].set()
            await ac.close()

    asyncio.run(burst())
    # then that step is the only one: the others find it taken, not due, however long it takes
    assert len(steps) == 1


@pytest.mark.parametrize("backend", ["memory", "redis"], indirect=True)
def test_an_asyncio_publish_returns_once_stored_while_its_trim_step_runs_on(client, monkeypatch):
    # given an asyncio client whose trim step waits until it is let go
    import asyncio

    import rqueue.aio
    import rqueue.aio.publishing as aio_publishing

    retain = aio_publishing.acmd.retain
    gate: list[asyncio.Event] = []
    ran = []

    async def held_retain(*args, **kwargs):
        await gate[0].wait()
        ran.append(await retain(*args, **kwargs))
        return ran[-1]

    monkeypatch.setattr(aio_publishing.acmd, "retain", held_retain)

    async def main() -> int:
        gate.append(asyncio.Event())
        ac = await rqueue.aio.connect(client.url, prefix=client.prefix, settings_ttl=0)
        try:
            await ac.configure("orders", max_length=2)
            q = ac.queue("orders")
            # when a caller gives each publish 1 s, and the first one's step is held
            for _ in range(3):
                await asyncio.wait_for(q.publish(b"m"), 1)
            return len(ran)
        finally:
            gate[0].set()
            await ac.close()  # waits for the step

    ran_before_close = asyncio.run(main())
    # then every publish returned (none timed out on the held step), and the
    # step ran once it was let go, before the client closed
    assert ran_before_close == 0
    assert len(ran) == 1
    assert client.queue("orders").stats().depth == 3


@pytest.mark.parametrize("backend", ["memory"], indirect=True)  # the client's decision, no script involved
def test_an_asyncio_trim_step_that_fails_with_a_bug_logs_its_traceback(client, monkeypatch, caplog):
    # given an asyncio client whose trim step raises a programming error
    import asyncio

    import rqueue.aio
    import rqueue.aio.publishing as aio_publishing

    async def broken_retain(*args, **kwargs):
        raise TypeError("a bug in the step")

    monkeypatch.setattr(aio_publishing.acmd, "retain", broken_retain)

    async def main() -> None:
        ac = await rqueue.aio.connect(client.url, prefix=client.prefix, settings_ttl=0)
        try:
            await ac.configure("orders", max_length=2)
            # when a publish runs the step
            await ac.queue("orders").publish(b"m")
        finally:
            await ac.close()  # waits for the step

    with caplog.at_level("WARNING", logger="rqueue.retention"):
        asyncio.run(main())
    # then the publish stood, and the warning carries the bug's traceback
    failed = [r for r in caplog.records if "trim step" in r.getMessage()]
    assert failed and failed[0].exc_info is not None and failed[0].exc_info[0] is TypeError
    assert client.queue("orders").stats().depth == 1


@pytest.mark.parametrize("backend", ["memory"], indirect=True)  # the client's decision, no script involved
def test_a_trim_by_hand_does_not_end_the_asyncio_publishers_step_under_way(client, monkeypatch):
    # given an asyncio client whose publisher's trim step is held
    import asyncio

    import rqueue.aio
    import rqueue.aio.publishing as aio_publishing

    steps = []
    gate: list[asyncio.Event] = []
    retain = aio_publishing.acmd.retain

    async def first_held(*args, **kwargs):
        steps.append(1)
        if len(steps) == 1:
            await gate[0].wait()
        return await retain(*args, **kwargs)

    monkeypatch.setattr(aio_publishing.acmd, "retain", first_held)

    async def main() -> None:
        gate.append(asyncio.Event())
        ac = await rqueue.aio.connect(client.url, prefix=client.prefix, settings_ttl=0)
        try:
            await ac.configure("orders", max_length=5)
            q = ac.queue("orders")
            await q.publish(b"m")
            await asyncio.sleep(0)  # the publisher's step starts, and waits
            # when a step is run by hand meanwhile, then 20 publishes follow over 0.2 s
            await q.trim()
            for _ in range(20):
                await asyncio.sleep(0.01)
                await q.publish(b"m")
        finally:
            gate[0].set()
            await ac.close()

    asyncio.run(main())
    # then the publishers still found their step under way: the held one and the one by hand ran
    assert len(steps) == 2


@pytest.mark.parametrize("backend", ["memory"], indirect=True)
def test_a_trim_by_hand_does_not_end_the_sync_publishers_step_under_way(client, monkeypatch):
    # given a sync client whose publisher's trim step (in another thread) is held
    import rqueue.retention as retention

    steps = []
    gate, holding = threading.Event(), threading.Event()
    retain = retention.commands.retain

    def first_held(*args, **kwargs):
        steps.append(1)
        if len(steps) == 1:
            holding.set()
            gate.wait(10)
        return retain(*args, **kwargs)

    monkeypatch.setattr(retention.commands, "retain", first_held)
    c = rqueue.connect(client.url, prefix=client.prefix, settings_ttl=0)
    try:
        c.configure("orders", max_length=5)
        q = c.queue("orders")
        first = threading.Thread(target=q.publish, args=(b"m",))
        first.start()
        try:
            assert holding.wait(10)
            # when a step is run by hand meanwhile, then 20 publishes follow over 0.2 s
            q.trim()
            for _ in range(20):
                c.clock.sleep(0.01)
                q.publish(b"m")
        finally:
            gate.set()
            first.join(10)
    finally:
        c.close()
    # then the publishers still found their step under way: the held one and the one by hand ran
    assert len(steps) == 2


@pytest.mark.parametrize("backend", ["memory", "redis"], indirect=True)
def test_an_asyncio_delete_right_after_a_publish_leaves_no_key_of_the_queue(client):
    # given an asyncio client publishing to a queue with retention (its trim step runs on after the publish)
    import asyncio

    import rqueue.aio

    async def main() -> None:
        ac = await rqueue.aio.connect(client.url, prefix=client.prefix, settings_ttl=0)
        try:
            await ac.configure("orders", max_length=2)
            q = ac.queue("orders")
            # when the queue is deleted as soon as the publish returns
            await q.publish(b"m")
            assert await q.delete(force=True) > 0
        finally:
            await ac.close()

    asyncio.run(main())
    # then no key of the queue is left: the step did not write its meta hash again after the delete
    assert client.redis.keys(f"{client.prefix}:{{orders}}*") == []

"""The result store: a handler's return value kept with its ack (or its
failure after the settle), q.result waiting for it, nothing kept for an ack
Redis refuses, and ack_result.lua's raw contract."""

from __future__ import annotations

import asyncio
import json

import pytest
import redis
from support.counting import count_calls
from support.refusals import nothing_changes
from support.servers import wait_for
from test_aio_worker import BACKENDS, BOTH, floor_reaches, run_worker
from test_scripts import NOW, group_argv, publish

import rqueue
import rqueue.aio
from rqueue.stored_results import Failure, encode_value

ALL_BACKENDS = "backend"  # the conftest fixture: every backend


@pytest.fixture
def live(backend, prefix):
    c = rqueue.connect(backend, prefix=prefix, settings_ttl=0)
    yield c
    c.close()


@BACKENDS
@BOTH
def test_a_worker_keeps_each_handlers_result_and_failure(kind, live, backend, prefix):
    # given results on and handlers that return bytes, JSON, None, and fail
    live.configure("orders", results=True, max_deliveries=1)
    q = live.queue("orders")
    q.publish_many([b"bytes", b"json", b"none", b"fail", b"reject", b"odd"])

    def handler(d):
        if d.data == b"bytes":
            return b"\x00raw"
        if d.data == b"json":
            return {"total": 3, "items": ["a"]}
        if d.data == b"fail":
            raise ValueError("boom")
        if d.data == b"reject":
            raise rqueue.Reject("not ours")
        if d.data == b"odd":
            return object()  # neither bytes nor JSON
        return None

    async def async_handler(d):
        return handler(d)

    w = run_worker(kind, backend, prefix, q, handler if kind == "threaded" else async_handler)
    try:
        wait_for(floor_reaches(q, "g", 6), timeout=10)
        # then q.result returns each outcome
        assert q.result(1, timeout=5).value == b"\x00raw"
        assert q.result(2, timeout=5).value == {"total": 3, "items": ["a"]}
        none = q.result(3, timeout=5)
        assert none.ok and none.value is None
        failed = q.result(4, timeout=5)
        assert not failed.ok and failed.failure == Failure("max-deliveries", "ValueError: boom")
        assert q.result(5, timeout=5).failure == Failure("rejected", "not ours")
        odd = q.result(6, timeout=5)
        assert odd.failure is not None and odd.failure.reason == "bad-result"
        assert q.stats().group("g").acked == 4  # the odd result's work was done: acked
    finally:
        w.stop()
        assert w.join(10)


@BACKENDS
@BOTH
def test_a_batch_handler_keeps_the_results_it_returns(kind, live, backend, prefix):
    # given results on and a batch handler that acks with a value, acks
    # plainly and fails one
    live.configure("orders", results=True, max_deliveries=1)
    q = live.queue("orders")
    q.publish_many([b"a", b"b", b"c"])

    @rqueue.batch_handler(size=10)
    def handler(ds):
        answers = {b"a": rqueue.worker.Acked({"n": 1}), b"b": True, b"c": ValueError("boom")}
        return [answers[d.data] for d in ds]

    w = run_worker(kind, backend, prefix, q, handler)
    try:
        wait_for(floor_reaches(q, "g", 3), timeout=10)
        # then each keeps what its entry said
        assert q.result(1, timeout=5).value == {"n": 1}
        plain = q.result(2, timeout=5)
        assert plain.ok and plain.value is None
        assert q.result(3, timeout=5).failure == Failure("max-deliveries", "ValueError: boom")
    finally:
        w.stop()
        assert w.join(10)


@BACKENDS
@BOTH
def test_a_worker_keeps_the_results_of_a_round_in_one_call(kind, live, backend, prefix, monkeypatch):
    # given results on, 100 messages, and a batch handler of 20 returning each message's seq
    import rqueue.engine.async_commands as acmd
    import rqueue.engine.commands as commands

    live.configure("orders", results=True)
    q = live.queue("orders")
    q.publish_many([b"m"] * 100)
    calls = count_calls(monkeypatch, commands if kind == "threaded" else acmd, "ack_results", "fetch")
    handler = rqueue.BatchHandler(lambda ds: [rqueue.worker.Acked(d.seq) for d in ds], size=20)
    if kind == "async":
        handler = rqueue.BatchHandler(_async_seqs, size=20)
    # when a worker handles them
    w = run_worker(kind, backend, prefix, q, handler)
    try:
        wait_for(floor_reaches(q, "g", 100), timeout=20)
    finally:
        w.stop()
        assert w.join(10)
    # then each message keeps its own result, and the acks of a round went in one
    # call (one more at the stop), not one per message
    assert [q.result(seq, timeout=5).value for seq in (1, 37, 100)] == [1, 37, 100]
    assert 1 <= calls["ack_results"] <= calls["fetch"] + 1 < 100


def test_large_results_are_kept_in_calls_of_bounded_size(client, queue, monkeypatch):
    # given results on, five deliveries, and calls bounded to 20 bytes of results
    import rqueue.engine.commands as commands

    client.configure("orders", results=True)
    queue.publish_many([b"m"] * 5)
    c = queue.consumer("g")
    ds = c.fetch(5)
    monkeypatch.setattr(commands, "RESULTS_PER_CALL_BYTES", 20)
    sizes = []
    real = commands.ack_results

    def counted(call, tags, keys, ttl_ms, results, event, strict):
        sizes.append([len(r) for r in results])
        return real(call, tags, keys, ttl_ms, results, event, strict)

    monkeypatch.setattr(commands, "ack_results", counted)
    values = [encode_value(b"x" * n) for n in (8, 8, 30, 1, 1)]
    # when they are acked with their results
    assert c.ack_results(list(zip(ds, values, strict=True)), event=False) == [None] * 5
    # then the calls carry at most 20 bytes each (a larger result alone), and every result is kept
    assert sizes == [[9, 9], [31], [2, 2]]
    assert [queue.result(d.seq, timeout=1).value for d in ds] == [b"x" * n for n in (8, 8, 30, 1, 1)]


async def _async_seqs(ds):
    return [rqueue.worker.Acked(d.seq) for d in ds]


@BACKENDS
def test_results_are_off_by_default_and_q_result_times_out(live):
    q = live.queue("orders")
    q.publish(b"x")
    w = rqueue.Worker(q, "g", lambda d: b"ignored")
    w.start()
    try:
        wait_for(floor_reaches(q, "g", 1))
    finally:
        w.stop()
        assert w.join(10)
    with pytest.raises(
        rqueue.ResultTimeout, match=r"no result for seq 1 of queue 'orders' for group 'g' within 0\.2 s"
    ):
        q.result(1, timeout=0.2)
    assert w.stats.acked == 1


@BACKENDS
def test_q_result_waits_for_a_result_stored_later(live):
    # given results on, and a worker started only after the wait began
    live.configure("orders", results=True)
    q = live.queue("orders")
    q.publish(b"x")
    w = rqueue.Worker(q, "g", lambda d: {"n": 1})
    found = []
    import threading

    waiter = threading.Thread(target=lambda: found.append(q.result(1, timeout=10)))
    waiter.start()
    w.start()
    try:
        waiter.join(10)
        assert found and found[0].value == {"n": 1}
    finally:
        w.stop()
        assert w.join(10)


def test_a_refused_ack_keeps_no_result(client, queue, clock):
    # given results on, c1's delivery taken back (lease ran out) and acked by c2
    client.configure("orders", results=True, ack_wait=10)
    queue.publish(b"x")
    c1, c2 = queue.consumer("g", "c1"), queue.consumer("g", "c2")
    (d1,) = c1.fetch(1)
    clock.advance(11)
    (d2,) = c2.fetch(1)
    c2.ack_result(d2, encode_value(b"from c2"), event=False)
    # when c1's late ack comes, with its own result
    with pytest.raises(rqueue.AlreadyAcked):
        c1.ack_result(d1, encode_value(b"from c1"), event=False)
    # then the result is c2's
    assert queue.result(1).value == b"from c2"


def test_a_nacked_delivery_cannot_store_a_result(client, queue):
    client.configure("orders", results=True)
    queue.publish(b"x")
    c1 = queue.consumer("g", "c1")
    (d,) = c1.fetch(1)
    c1.nack(d, delay=60)
    with nothing_changes(client), pytest.raises(rqueue.StaleDelivery):
        c1.ack_result(d, encode_value(b"late"), event=False)
    with pytest.raises(rqueue.ResultTimeout):
        queue.result(1)


def test_the_result_of_a_run_before_a_replay_is_not_the_answer_for_the_replayed_run(client, queue):
    # given results on, a message acked with a result by group audit, and
    # dead-lettered by group g, which kept its failure
    client.configure("orders", results=True)
    audit, c = queue.consumer("audit", "a1"), queue.consumer("g", "c1")
    seq = queue.publish(b"x").seq
    (da,) = audit.fetch(1)
    audit.ack_result(da, encode_value(b"audited"), event=False)
    (d,) = c.fetch(1)
    c.reject(d, reason="bad")
    c.keep_failure(d, "rejected", "bad")
    assert queue.result(seq, group="g").failure == Failure("rejected", "bad")
    # when the dead letter is replayed: the message is pending again in group g
    assert queue.replay_dead_letters().replayed == 1
    # then the failure of the run before the replay no longer answers for g
    with pytest.raises(rqueue.ResultTimeout):
        queue.result(seq, group="g", timeout=0.05)
    # and the other group's result, of a settle the replay did not undo, stands
    assert queue.result(seq, group="audit").value == b"audited"
    # when the replayed run is acked with a result, then that is the answer
    (d2,) = c.fetch(1)
    assert d2.seq == seq and d2.replayed
    c.ack_result(d2, encode_value({"ok": 1}), event=False)
    r = queue.result(seq, group="g")
    assert r.ok and r.value == {"ok": 1}, r


def test_an_asyncio_replay_deletes_the_result_of_the_run_before_it(backend, prefix, client, queue):
    # given results on, a message dead-lettered by group g with its failure kept
    client.configure("orders", results=True)
    c = queue.consumer("g", "c1")
    seq = queue.publish(b"x").seq
    (d,) = c.fetch(1)
    c.reject(d, reason="bad")
    c.keep_failure(d, "rejected", "bad")

    # when the asyncio client replays it
    async def main() -> int:
        aclient = await rqueue.aio.connect(backend, prefix=prefix, clock=client.clock)
        try:
            return (await aclient.queue("orders").replay_dead_letters()).replayed
        finally:
            await aclient.close()

    assert asyncio.run(main()) == 1
    # then the failure of the run before the replay answers no more
    with pytest.raises(rqueue.ResultTimeout):
        queue.result(seq, timeout=0.05)


@pytest.mark.parametrize("keeper", ["sync", "async"])
def test_a_late_failure_result_does_not_overwrite_the_result_of_the_ack_after_a_replay(
    keeper, backend, prefix, client, queue
):
    # given results on, worker a's delivery rejected, its failure not kept yet
    client.configure("orders", results=True)
    a, b = queue.consumer("g", "a"), queue.consumer("g", "b")
    seq = queue.publish(b"x").seq
    (d,) = a.fetch(1)
    a.reject(d, reason="first try failed")
    # and meanwhile the operator replays it and worker b acks it with a result
    assert queue.replay_dead_letters().replayed == 1
    (d2,) = b.fetch(1)
    b.ack_result(d2, encode_value({"ok": 1}), event=False)

    # when a's failure is kept late, by the sync consumer or an asyncio one
    async def keep_late() -> None:
        aclient = await rqueue.aio.connect(backend, prefix=prefix, clock=client.clock)
        try:
            await aclient.queue("orders").consumer("g", name="late").keep_failure(d, "rejected", "first try failed")
        finally:
            await aclient.close()

    if keeper == "sync":
        a.keep_failure(d, "rejected", "first try failed")
    else:
        asyncio.run(keep_late())
    # then the result of the ack that settled the message stands
    r = queue.result(seq)
    assert r.ok and r.value == {"ok": 1}, r


def test_a_failure_replaces_a_result_of_an_earlier_incarnation(client, queue):
    # given a result kept, then the queue deleted and made anew: seq 1 is another message
    client.configure("orders", results=True)
    queue.publish(b"old")
    c = queue.consumer("g", "c1")
    (d,) = c.fetch(1)
    c.ack_result(d, encode_value(b"old result"), event=False)
    c.close()
    queue.delete()
    client.configure("orders", results=True)
    c = queue.consumer("g", "c1")
    queue.publish(b"new")
    # when the new message fails for good and its failure is kept
    (d,) = c.fetch(1)
    c.reject(d, reason="bad")
    assert client.redis.exists(queue.keys.result(1, "g"))  # the old incarnation's
    c.keep_failure(d, "rejected", "bad")
    # then the old incarnation's result did not keep it out
    assert queue.result(1).failure == Failure("rejected", "bad")


def test_a_result_of_an_earlier_incarnation_is_not_returned(client, queue):
    # given a kept result, then the queue deleted and made anew: seq 1 is another message
    client.configure("orders", results=True)
    queue.publish(b"old")
    c = queue.consumer("g", "c1")
    (d,) = c.fetch(1)
    c.ack_result(d, encode_value(b"old result"), event=False)
    assert queue.result(1).value == b"old result"
    c.close()
    queue.delete()
    queue.publish(b"new")
    # then q.result(1) does not answer with the old message's result
    with pytest.raises(rqueue.ResultTimeout):
        queue.result(1)


def test_a_publish_result_of_a_lost_incarnation_gets_no_later_messages_result(client, queue):
    # given a message published, then the queue lost (deleted and made anew) and
    # a new message under the same seq, whose result is kept
    client.configure("orders", results=True)
    old = queue.publish(b"old")
    queue.delete()
    new = queue.publish(b"new")
    assert new.seq == old.seq and new.incarnation != old.incarnation
    c = queue.consumer("g", "c1")
    (d,) = c.fetch(1)
    c.ack_result(d, encode_value(b"new result"), event=False)
    # when the old message's result is asked for by its PublishResult, then it is lost, named
    with pytest.raises(rqueue.ResultLost, match=f"message {old.seq} of queue 'orders' was published to incarnation"):
        queue.result(old, timeout=5)
    # and the new one's result, and by the bare seq, is the new message's
    assert queue.result(new).value == b"new result"
    assert queue.result(new.seq).value == b"new result"
    assert queue.result(new.seq).group == "g"  # the group whose worker kept it

    # and so for the asyncio client
    async def main():
        ac = await rqueue.aio.connect(client.url, prefix=client.prefix)
        try:
            q = ac.queue("orders")
            with pytest.raises(rqueue.ResultLost):
                await q.result(old, timeout=5)
            return (await q.result(new)).value
        finally:
            await ac.close()

    assert asyncio.run(main()) == b"new result"


def test_a_publish_result_of_a_lost_incarnation_is_named_lost_before_any_group_joins(client, queue):
    # given a message published, then the queue's state lost (deleted), with no group since
    client.configure("orders", results=True)
    old = queue.publish(b"old")
    queue.delete()
    assert queue.groups() == []
    # when its result is asked for by its PublishResult, then it is lost at once, not waited for
    with pytest.raises(rqueue.ResultLost, match="but the queue is gone now"):
        queue.result(old, timeout=30)
    # and so once a message of the new incarnation is there, still without a group
    queue.publish(b"new")
    with pytest.raises(rqueue.ResultLost, match=r"but the queue is (?!gone)\S+ now"):
        queue.result(old, timeout=30)

    # and so for the asyncio client
    async def main():
        ac = await rqueue.aio.connect(client.url, prefix=client.prefix)
        try:
            with pytest.raises(rqueue.ResultLost):
                await asyncio.wait_for(ac.queue("orders").result(old, timeout=30), 10)
        finally:
            await ac.close()

    asyncio.run(main())
    # while a message of this incarnation, without a group, is waited for as before
    fresh = queue.publish(b"fresh")
    with pytest.raises(rqueue.ResultTimeout):
        queue.result(fresh, timeout=0.2)


def test_the_result_lives_for_result_ttl(client, queue, backend):
    client.configure("orders", results=True, result_ttl=30)
    queue.publish(b"x")
    c = queue.consumer("g", "c1")
    (d,) = c.fetch(1)
    c.ack_result(d, encode_value([1, 2]), event=False)
    ttl = client.redis.pttl(queue.keys.result(1, "g"))
    assert 0 < ttl <= 30_000


def test_bad_result_arguments(client, queue):
    for bad in (0, -1, 1.5, True, None):
        with pytest.raises(rqueue.InvalidInput, match="seq"):
            queue.result(bad)
    with pytest.raises(rqueue.InvalidInput, match=r"message id '1' is not known to queue 'orders'"):
        queue.result("1")  # a str is a message id
    with pytest.raises(rqueue.InvalidInput, match=r"message id must not be empty: give the id"):
        queue.result("")
    with pytest.raises(rqueue.InvalidInput, match="timeout"):
        queue.result(1, timeout=-1)
    for setting, value in (("results", "yes"), ("result_ttl", 0), ("result_ttl", -5)):
        with pytest.raises(rqueue.InvalidSetting, match=setting):
            client.configure("orders", **{setting: value})


def test_the_async_client_waits_for_a_result(client, queue, backend, prefix):
    client.configure("orders", results=True)
    queue.publish(b"x")
    c = queue.consumer("g", "c1")
    (d,) = c.fetch(1)
    c.ack_result(d, encode_value({"ok": True}), event=False)

    async def main():
        ac = await rqueue.aio.connect(backend, prefix=prefix)
        try:
            q = ac.queue("orders")
            found = await q.result(1, timeout=2)
            with pytest.raises(rqueue.ResultTimeout):
                await q.result(2, timeout=0.05)
            return found
        finally:
            await ac.close()

    assert asyncio.run(main()).value == {"ok": True}


# -- ack_result.lua, raw --------------------------------------------------------------


@pytest.fixture
def raw(client, queue):
    return client.redis, queue.keys, queue.keys.group("g").as_list(), client.scripts


def packed(*values):
    """ack_result.lua's ARGV[9]: each result as <length>:<bytes>."""
    return b"".join(b"%d:%s" % (len(v), v) for v in values)


def ack_result_argv(ttl, value, event, seq, count, token):
    return group_argv("g", "c1", NOW, None, ttl, packed(value) if ttl else b"", event, seq, count, token)


def test_ack_result_acks_keeps_the_result_and_records_the_event(raw, queue):
    r, qk, gk, s = raw
    publish(raw, b"a")
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 1, "t1"))
    reply = s.ack_result(keys=[*gk, qk.result(1, "g")], args=ack_result_argv("5000", b"jtrue", "1", 1, 1, "t1"))
    assert reply == [b"ok"]
    assert r.get(qk.result(1, "g")) == b"itest\njtrue"
    assert 0 < r.pttl(qk.result(1, "g")) <= 5000
    assert [e["event"] for e in queue.events()] == ["completed"]
    assert queue.stats().group("g").acked == 1


def test_ack_result_without_a_ttl_keeps_nothing_and_a_refusal_changes_nothing(raw, client):
    r, qk, gk, s = raw
    publish(raw, b"a", b"b")
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 2, "t1"))
    assert s.ack_result(keys=[*gk, qk.result(1, "g")], args=ack_result_argv("", b"", "0", 1, 1, "t1")) == [b"ok"]
    assert r.exists(qk.result(1, "g")) == 0
    # an ack of a settled message, a bad time to live, two tags: refused, nothing changed
    with nothing_changes(client), pytest.raises(redis.ResponseError, match=r"^RQ_ACKED 1\.1\.t1"):
        s.ack_result(keys=[*gk, qk.result(1, "g")], args=ack_result_argv("5000", b"jx", "1", 1, 1, "t1"))
    with nothing_changes(client), pytest.raises(redis.ResponseError, match=r"^RQ_BAD_ARGUMENT .*time to live"):
        s.ack_result(keys=[*gk, qk.result(2, "g")], args=ack_result_argv("0", b"jx", "1", 2, 1, "t1"))
    with nothing_changes(client), pytest.raises(redis.ResponseError, match=r"^RQ_BAD_ARGUMENT .*one result per tag"):
        s.ack_result(keys=[*gk, qk.result(2, "g")], args=[*ack_result_argv("5", b"jx", "1", 2, 1, "t1"), 3, 1, "t1"])
    # a call whose result key is not the tag's (built for another layout): refused, nothing written
    for wrong in (list(gk), [*gk, qk.result(3, "g")], [*gk, qk.result(2, "other")], [*gk, qk.result(2, "g") + "x"]):
        with nothing_changes(client), pytest.raises(redis.ResponseError, match=r"^RQ_BAD_ARGUMENT key \d+ is not the"):
            s.ack_result(keys=wrong, args=ack_result_argv("5000", b"jx", "1", 2, 1, "t1"))


def test_ack_result_acks_many_tags_with_events_strict_or_lenient(raw, queue, client):
    # given four deliveries of c1
    r, qk, gk, s = raw
    publish(raw, b"a", b"b", b"c", b"d")
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 4, "t1"))
    tags = lambda *seqs: [x for seq in seqs for x in (seq, 1, "t1")]  # noqa: E731
    # when two are acked strictly, with a completed event each (no result: the last key is not written)
    assert s.ack_result(keys=[*gk, qk.meta], args=group_argv("g", "c1", NOW, None, "", "", "1", *tags(1, 2))) == [b"ok"]
    # then a strict call with a settled tag changes nothing, a lenient one settles the rest
    with nothing_changes(client), pytest.raises(redis.ResponseError, match=r"^RQ_ACKED 1\.1\.t1"):
        s.ack_result(keys=[*gk, qk.meta], args=group_argv("g", "c1", NOW, None, "", "", "1", *tags(3, 1)))
    lenient = s.ack_result(keys=[*gk, qk.meta], args=group_argv("g", "c1", NOW, None, "", "", "1l", *tags(3, 1, 4)))
    assert lenient == [b"ok", b"RQ_ACKED", b"ok"]
    assert [(e["event"], e["seq"]) for e in queue.events()] == [("completed", str(n)) for n in (1, 2, 3, 4)]
    assert queue.stats().group("g").acked == 4
    assert r.exists(qk.meta) and not r.exists(qk.result(1, "g"))


def test_ack_result_refuses_a_bad_mode_a_result_for_many_tags_or_an_empty_one(raw, client):
    r, qk, gk, s = raw
    publish(raw, b"a", b"b")
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 2, "t1"))
    for mode in ("l", "2", "", "1x"):
        with nothing_changes(client), pytest.raises(redis.ResponseError, match=r"^RQ_BAD_ARGUMENT the mode"):
            s.ack_result(keys=[*gk, qk.result(1, "g")], args=ack_result_argv("", b"", mode, 1, 1, "t1"))
    # one result for two tags, two results for one, a length past the end, results without a time to live
    bad = [
        [*ack_result_argv("5000", b"jx", "1", 1, 1, "t1"), 2, 1, "t1"],
        group_argv("g", "c1", NOW, None, "5000", packed(b"jx", b"jy"), "1", 1, 1, "t1"),
        group_argv("g", "c1", NOW, None, "5000", b"9:jx", "1", 1, 1, "t1"),
        group_argv("g", "c1", NOW, None, "5000", b"2:jx~", "1", 1, 1, "t1"),
    ]
    for args in bad:
        with nothing_changes(client), pytest.raises(redis.ResponseError, match=r"^RQ_BAD_ARGUMENT ARGV\[9\]"):
            s.ack_result(keys=[*gk, qk.result(1, "g"), qk.result(2, "g")], args=args)
    # an empty result (it would read as lost), alone or beside a good one
    one, two = [*gk, qk.result(1, "g")], [*gk, qk.result(1, "g"), qk.result(2, "g")]
    empty = [
        (one, ack_result_argv("5000", b"", "1", 1, 1, "t1")),
        (two, group_argv("g", "c1", NOW, None, "5000", packed(b"jx", b""), "1", 1, 1, "t1", 2, 1, "t1")),
    ]
    for keys, args in empty:
        with nothing_changes(client), pytest.raises(redis.ResponseError, match=r"^RQ_BAD_ARGUMENT the result of tag"):
            s.ack_result(keys=keys, args=args)
    with nothing_changes(client), pytest.raises(redis.ResponseError, match=r"^RQ_BAD_ARGUMENT results .* without"):
        s.ack_result(keys=[*gk, qk.meta], args=group_argv("g", "c1", NOW, None, "", packed(b"jx"), "1", 1, 1, "t1"))
    with nothing_changes(client), pytest.raises(redis.ResponseError, match=r"^RQ_BAD_ARGUMENT .*in threes"):
        s.ack_result(keys=[*gk, qk.meta], args=[*ack_result_argv("", b"", "1", 1, 1, "t1"), 2, 1])


def test_ack_result_refuses_a_result_for_a_seq_not_written_as_one(raw, client):
    # given a delivery of seq 1 held by c1
    r, qk, gk, s = raw
    publish(raw, b"a")
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 1, "t1"))
    base = qk.result(1, "g").removesuffix(":1:g")
    # when its ack keeps a result under the seq written "01" or "1.0", with the key
    # named after that spelling or after seq 1, strictly or leniently
    for seq in ("01", "1.0"):
        for key in (f"{base}:{seq}:g", qk.result(1, "g")):
            for mode in ("0", "0l"):
                args = group_argv("g", "c1", NOW, None, "5000", packed(b"jx"), mode, seq, 1, "t1")
                # then it is refused, naming the seq, and nothing is acked or kept
                refused = pytest.raises(redis.ResponseError, match=rf"^RQ_BAD_ARGUMENT the seq .*: {seq}$")
                with nothing_changes(client), refused:
                    s.ack_result(keys=[*gk, key], args=args)
    # and written as a seq, it is acked with its result under the key a reader asks for
    assert s.ack_result(keys=[*gk, qk.result(1, "g")], args=ack_result_argv("5000", b"jx", "0", 1, 1, "t1")) == [b"ok"]
    assert r.get(qk.result(1, "g")) == b"itest\njx"


def test_ack_result_keeps_a_result_per_tag_settled_strict_or_lenient(raw, queue, client):
    # given three deliveries of c1, the second already acked
    r, qk, gk, s = raw
    publish(raw, b"a", b"b", b"c")
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 3, "t1"))
    assert s.ack_result(keys=[*gk, qk.meta], args=group_argv("g", "c1", NOW, None, "", "", "0", 2, 1, "t1")) == [b"ok"]
    keys = [*gk, qk.result(1, "g"), qk.result(2, "g"), qk.result(3, "g")]
    results = packed(b"jone", b"jtwo", b"j" + b"\n3:" * 50)
    args = lambda mode: group_argv("g", "c1", NOW, None, "5000", results, mode, 1, 1, "t1", 2, 1, "t1", 3, 1, "t1")  # noqa: E731
    # when all three are acked strictly, with a result each: refused, nothing kept
    with nothing_changes(client), pytest.raises(redis.ResponseError, match=r"^RQ_ACKED 2\.1\.t1"):
        s.ack_result(keys=keys, args=args("1"))
    # and leniently: the two held are settled, each with its own result (one that looks like
    # the packing kept whole) and event; the refused one keeps none
    assert s.ack_result(keys=keys, args=args("1l")) == [b"ok", b"RQ_ACKED", b"ok"]
    assert r.get(qk.result(1, "g")) == b"itest\njone"
    assert r.exists(qk.result(2, "g")) == 0
    assert r.get(qk.result(3, "g")) == b"itest\nj" + b"\n3:" * 50
    assert 0 < r.pttl(qk.result(3, "g")) <= 5000
    assert [(e["event"], e["seq"]) for e in queue.events()] == [("completed", "1"), ("completed", "3")]
    assert queue.stats().group("g").acked == 3


# -- rqueue result --------------------------------------------------------------------


def run_cli(*args):
    from click.testing import CliRunner

    from rqueue.cli import cli

    return CliRunner().invoke(cli, list(args))


def test_rqueue_result_prints_a_value_a_failure_and_times_out(client, queue, backend, prefix):
    # given a kept JSON result for seq 1, a kept failure for seq 2, nothing for seq 3
    client.configure("orders", results=True)
    queue.publish_many([b"a", b"b", b"c"])
    c = queue.consumer("g", "c1")
    d1, d2, _ = c.fetch(3)
    c.ack_result(d1, encode_value(b"\xffbytes"), event=False)
    c.reject(d2, reason="nope")
    c.keep_failure(d2, "rejected", "nope")
    base = ["--url", backend, "--prefix", prefix, "result", "orders"]
    # then each prints as such, --json included
    out = run_cli(*base, "1", "--json")
    assert out.exit_code == 0, out.output
    assert json.loads(out.output) == {
        "queue": "orders",
        "seq": 1,
        "group": "g",
        "partition": None,
        "ok": True,
        "value": {"base64": "/2J5dGVz"},
    }
    out = run_cli(*base, "2")
    assert (out.exit_code, out.output.strip()) == (0, "failed (rejected): nope")
    out = run_cli(*base, "2", "--json")
    assert json.loads(out.output)["failure"] == {"reason": "rejected", "error": "nope"}
    out = run_cli(*base, "3", "--timeout", "0.05")
    assert out.exit_code == 1 and "no result for seq 3" in out.output
    assert run_cli(*base, "0").exit_code == 2


def test_ack_result_of_another_consumers_delivery_keeps_nothing(raw, client):
    r, qk, gk, s = raw
    publish(raw, b"a")
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 1, "t1"))
    argv = group_argv("g", "c2", NOW, None, "5000", packed(b"jx"), "1", 1, 1, "t1")
    with nothing_changes(client), pytest.raises(redis.ResponseError, match=r"^RQ_NOT_HELD 1\.1\.t1"):
        s.ack_result(keys=[*gk, qk.result(1, "g")], args=argv)


def test_a_lenient_ack_result_refused_for_its_tag_keeps_no_result(raw, client, queue):
    # given c1 holding seq 1
    r, qk, gk, s = raw
    publish(raw, b"a")
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 1, "t1"))
    # when c2 sends a lenient ack of it with a result and a completed event
    argv = group_argv("g", "c2", NOW, None, "5000", packed(b"jx"), "1l", 1, 1, "t1")
    reply = s.ack_result(keys=[*gk, qk.result(1, "g")], args=argv)
    # then the tag's refusal is its status, and no result or event is kept for it
    assert reply == [b"RQ_NOT_HELD"]
    assert r.exists(qk.result(1, "g")) == 0
    assert queue.events() == []
    assert queue.stats().group("g").acked == 0

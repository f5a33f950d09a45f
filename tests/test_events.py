"""Lifecycle events: completed, failed, timeout and scheduled entries in a
queue's events stream, each recorded only when the queue's events setting
names its kind; the setting; rqueue events --kind/--follow; the dashboard."""

from __future__ import annotations

import json
import re
import threading
import warnings
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner
from support.refusals import nothing_changes
from support.servers import wait_for
from test_aio_worker import BACKENDS, BOTH, floor_reaches, run_worker
from test_scripts import NOW, group_argv, publish

import rqueue
from rqueue.cli import cli
from rqueue.events import EVENT_KINDS, EventKind
from rqueue.worker.scheduler import Scheduler

ALWAYS = {"dead-lettered", "dropped", "replayed", "purged", "state-lost"}


@pytest.fixture
def live(backend, prefix):
    c = rqueue.connect(backend, prefix=prefix, settings_ttl=0)
    yield c
    c.close()


def kinds_of(q: rqueue.Queue) -> list[tuple[str, str]]:
    return [(e["event"], e["seq"]) for e in q.events(100)]


@BACKENDS
@BOTH
def test_a_worker_records_completed_failed_and_timeout_when_asked(kind, live, backend, prefix):
    # given every lifecycle kind on, and a handler that acks, fails and overruns
    live.configure("orders", events="all", max_deliveries=1)
    q = live.queue("orders")
    q.publish_many([b"ok", b"fail", b"slow"])
    release = threading.Event()

    def handler(d):
        if d.data == b"fail":
            raise ValueError("boom")
        if d.data == b"slow":
            release.wait(5)

    w = run_worker(kind, backend, prefix, q, handler, time_limit=0.3)
    try:
        wait_for(floor_reaches(q, "g", 3), timeout=10)
    finally:
        release.set()
        w.stop()
        assert w.join(10)
    # then each outcome left its event, with its error as the reason
    events = {e["seq"]: e for e in q.events(100) if e["event"] not in ALWAYS}
    assert (events["1"]["event"], events["1"]["group"]) == ("completed", "g")
    assert (events["2"]["event"], events["2"]["reason"]) == ("failed", "ValueError: boom")
    assert events["2"]["dlq_seq"] == "1"  # it was the last delivery: dead-lettered
    assert events["3"]["event"] == "timeout"
    assert events["3"]["reason"] == "timeout: the handler ran past its time limit of 0.3 s"


@BACKENDS
def test_kinds_that_are_off_are_not_recorded(live):
    # given the default setting (no lifecycle kind), and only "failed" on elsewhere
    live.configure("other", events=["failed"])
    q = live.queue("orders")
    q.publish_many([b"ok", b"fail"])
    live.configure("orders", max_deliveries=2)

    def handler(d):
        if d.data == b"fail" and d.delivery_count == 1:
            raise ValueError("once")

    w = rqueue.Worker(q, "g", handler)
    w.start()
    try:
        wait_for(floor_reaches(q, "g", 2))
    finally:
        w.stop()
        assert w.join(10)
    assert kinds_of(q) == []
    # when only failed is on, a completed message records nothing and a nack records failed
    live.configure("orders", events=["failed"])
    q.publish_many([b"ok", b"fail"])
    w = rqueue.Worker(q, "g", handler)
    w.start()
    try:
        wait_for(floor_reaches(q, "g", 4))
    finally:
        w.stop()
        assert w.join(10)
    assert kinds_of(q) == [("failed", "4")]


def test_a_schedule_records_scheduled_events_when_asked(client, clock):
    client.configure("orders", events=["scheduled"])
    client.schedule("beat", "orders", every=10, payload=b"tick")
    client.schedule("quiet", "other", every=10, payload=b"tick")
    clock.advance(10)
    assert Scheduler(client).run_once().published == 2
    assert [(e["event"], e["seq"], e["reason"]) for e in client.queue("orders").events()] == [
        ("scheduled", "1", "beat")
    ]
    assert client.queue("other").events() == []


@pytest.mark.parametrize("name", ["billing:schedule:eu", "a:b"])
def test_a_scheduled_event_names_its_schedule_whole(client, clock, name):
    # given a schedule whose name holds colons, even ":schedule:"
    client.configure("orders", events=["scheduled"])
    client.schedule(name, "orders", every=10, payload=b"tick")
    # when it fires
    clock.advance(10)
    assert Scheduler(client).run_once().published == 1
    # then its event names the schedule whole
    assert [e["reason"] for e in client.queue("orders").events()] == [name]


def test_the_events_setting(client):
    assert rqueue.Settings().events == ()
    client.configure("a", events="all")
    assert client.queue("a").settings().events == tuple(k.value for k in EventKind)
    client.configure("b", events=["timeout", "completed", "completed"])
    assert client.queue("b").settings().events == ("completed", "timeout")  # in the kinds' order, once
    for bad in ("completed", ["done"], [1], None, 3):
        with pytest.raises(rqueue.InvalidSetting, match="events"):
            client.configure("c", events=bad)


def test_nack_refuses_an_event_it_does_not_record(client, queue):
    r, gk, s = client.redis, queue.keys.group("g").as_list(), client.scripts
    raw = (r, queue.keys, gk, s)
    publish(raw, b"a")
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 1, "t1"))
    with nothing_changes(client), pytest.raises(redis.ResponseError, match=r"^RQ_BAD_ARGUMENT nack records no event"):
        s.nack(keys=gk, args=group_argv("g", "c1", NOW, None, 1, 1, "t1", "", "err", "completed"))
    # and with no ARGV[13] at all (an older client) it records nothing
    assert s.nack(keys=gk, args=group_argv("g", "c1", NOW, None, 1, 1, "t1", "", "err"))[0] == b"requeued"
    assert queue.events() == []


def test_a_reject_records_failed_beside_its_dead_letter(client, queue):
    client.configure("orders", events=["failed"])
    queue.publish_many([b"a", b"b"])
    c = queue.consumer("g", "c1")
    d1, d2 = c.fetch(2)
    d1.reject(reason="bad input")
    d2.term(reason="never")
    got = [(e["event"], e["seq"], e["reason"], e["dlq_seq"]) for e in queue.events()]
    assert got == [
        ("dead-lettered", "1", "rejected", "1"),
        ("failed", "1", "bad input", "1"),
        ("dead-lettered", "2", "terminated", "2"),
        ("failed", "2", "never", "2"),
    ]


def test_reject_refuses_an_event_it_does_not_record(client, queue):
    r, gk, s = client.redis, queue.keys.group("g").as_list(), client.scripts
    publish((r, queue.keys, gk, s), b"a")
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 1, "t1"))
    with nothing_changes(client), pytest.raises(redis.ResponseError, match=r"^RQ_BAD_ARGUMENT reject records no event"):
        s.reject(keys=gk, args=group_argv("g", "c1", NOW, None, 1, 1, "t1", "rejected", "x", "timeout"))


# -- every ack of a consumer --------------------------------------------------------------


class Counted:
    """A script of the client, counting its calls."""

    def __init__(self, script):
        self.script, self.calls = script, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.script(*args, **kwargs)


def count_scripts(client, monkeypatch, *names):
    counted = {n: Counted(getattr(client.scripts, n)) for n in names}
    for n, c in counted.items():
        monkeypatch.setattr(client.scripts, n, c)
    return counted


def every_ack_path(c):
    """Acks six deliveries of ``c`` by each of a consumer's ack paths."""
    d1, d2, d3, d4, d5, d6 = c.fetch(6)
    c.ack(d1)
    c.ack([d2, d3])
    statuses = c.ack_available([d4, d1])
    assert statuses[0] is None and isinstance(statuses[1], rqueue.AlreadyAcked)
    acked, got, _ = c.ack_and_fetch([d5], 1)
    assert acked == [None] and got == []
    c.ack(d6, multiple=True)


@BACKENDS
def test_every_ack_of_a_consumer_records_completed_when_it_is_on(client, queue, monkeypatch):
    # given completed events on and a consumer of its own (no worker)
    client.configure("orders", events=["completed"])
    queue.publish_many([b"m"] * 6)
    c = queue.consumer("g", "c1")
    counted = count_scripts(client, monkeypatch, "ack", "ack_result")
    # when it acks by each of its paths (one, a list, available, with a fetch, multiple)
    every_ack_path(c)
    # then each message settled has exactly one completed event, and a refused ack none
    assert kinds_of(queue) == [("completed", str(seq)) for seq in range(1, 7)]
    assert queue.stats().group("g").acked == 6
    assert counted["ack"].calls == 0  # every ack went through the script that records


@BACKENDS
def test_acks_with_completed_off_write_no_event_and_ride_as_before(client, queue, monkeypatch):
    # given lifecycle events on but completed off
    client.configure("orders", events=["failed", "timeout"])
    queue.publish_many([b"m"] * 6)
    c = queue.consumer("g", "c1")
    counted = count_scripts(client, monkeypatch, "ack", "ack_result", "fetch")
    # when it acks by each path
    every_ack_path(c)
    # then no event key is written, and the acks cost what they did: one ack.lua call
    # per ack, ack_and_fetch's ack riding on its fetch, ack_result.lua never
    assert client.redis.exists(queue.keys.events) == 0
    assert (counted["ack"].calls, counted["ack_result"].calls, counted["fetch"].calls) == (4, 0, 2)
    assert queue.stats().group("g").acked == 6


@BACKENDS
def test_a_worker_sends_the_acks_of_a_round_in_one_call_with_completed_on(live, monkeypatch):
    # given completed events on, results off, and 100 messages for a batch handler of 20
    live.configure("orders", events=["completed"])
    q = live.queue("orders")
    q.publish_many([b"m"] * 100)
    counted = count_scripts(live, monkeypatch, "ack_result", "fetch")
    # when a worker handles them
    w = rqueue.Worker(q, "g", rqueue.BatchHandler(lambda ds: [True] * len(ds), size=20), concurrency=1)
    w.start()
    try:
        wait_for(floor_reaches(q, "g", 100), timeout=20)
    finally:
        w.stop()
        assert w.join(10)
    # then every message has its event, and the acks of each round went in one
    # call ahead of that round's fetch (one more at the stop), not a call per message
    assert sorted(kinds_of(q), key=lambda k: int(k[1])) == [("completed", str(seq)) for seq in range(1, 101)]
    assert 1 <= counted["ack_result"].calls <= counted["fetch"].calls + 1 < 100


@BACKENDS
def test_the_async_consumer_records_completed_on_each_ack_path(backend, prefix):
    import asyncio

    import rqueue.aio

    async def main():
        ac = await rqueue.aio.connect(backend, prefix=prefix, settings_ttl=0)
        try:
            await ac.configure("orders", events=["completed"])
            q = ac.queue("orders")
            await q.publish_many([b"m"] * 5)
            async with q.consumer("g", "c1") as c:
                d1, d2, d3, d4, d5 = await c.fetch(5)
                await c.ack(d1)
                await c.ack([d2, d3])
                assert await c.ack_available([d4]) == [None]
                acked, got, _ = await c.ack_and_fetch([d5], 1)
                assert acked == [None] and got == []
            return [(e["event"], e["seq"]) for e in await q.events(100)]
        finally:
            await ac.close()

    assert asyncio.run(main()) == [("completed", str(seq)) for seq in range(1, 6)]


# -- every kind the stream can hold ------------------------------------------------------

LUA = Path(rqueue.__file__).parent / "engine" / "lua"


def recorded_kinds() -> set[str]:
    """The kinds the Lua scripts and the Python code write to an events
    stream: literal kinds of recordEvent and of an XADD's 'event' field,
    the kinds a script takes from its caller (``event ~= 'failed'``), and
    the "event" field of the entries written from Python."""
    found: set[str] = set()
    for path in LUA.rglob("*.lua"):
        code = path.read_text()
        found |= set(re.findall(r"recordEvent\('([a-z-]+)'", code))
        found |= set(re.findall(r"'event', '([a-z-]+)'", code))
        found |= set(re.findall(r"(?:event|ARGV\[i \+ 5\]) ~= '([a-z-]+)'", code))
        # a kind not written out is the caller's, checked by the guard above
        assert set(re.findall(r"recordEvent\(([a-z]\w*)", code)) <= {"event", "kind"}, path
    for path in Path(rqueue.__file__).parent.rglob("*.py"):
        found |= set(re.findall(r'"event": "([a-z-]+)"', path.read_text()))
    return found


def test_every_kind_the_events_stream_can_hold_is_listed():
    # the list the CLI checks --kind against is what the scripts and the client record, no more and no less
    assert set(EVENT_KINDS) == recorded_kinds()
    assert len(EVENT_KINDS) == len(set(EVENT_KINDS))
    assert {k.value for k in EventKind} <= set(EVENT_KINDS)


# -- the command line and the dashboard -----------------------------------------------


def test_rqueue_events_kind_and_follow_json_lines(client, queue, backend, prefix):
    client.configure("orders", events="all")
    queue.publish_many([b"a", b"b"])
    c = queue.consumer("g", "c1")
    d1, d2 = c.fetch(2)
    c.ack_result(d1, None, event=True)
    c.nack(d2, error="boom")
    base = ["--url", backend, "--prefix", prefix, "events", "orders"]
    out = CliRunner().invoke(cli, [*base, "--kind", "failed", "--json"])
    assert out.exit_code == 0, out.output
    [failed] = json.loads(out.output)["events"]
    assert (failed["event"], failed["seq"], failed["reason"]) == ("failed", 2, "boom")
    out = CliRunner().invoke(cli, [*base, "--follow", "--json", "--seconds", "0"])
    lines = [json.loads(line) for line in out.output.splitlines()]
    assert [(e["event"], e["seq"]) for e in lines] == [("completed", 1), ("failed", 2)]
    # and configure takes the kinds as a comma-separated list
    configure = ["--url", backend, "--prefix", prefix, "configure", "x"]
    out = CliRunner().invoke(cli, [*configure, "--events", "failed,timeout"])
    assert out.exit_code == 0, out.output
    assert client.queue("x").settings().events == ("failed", "timeout")
    out = CliRunner().invoke(cli, [*configure, "--events", "nope"])
    assert out.exit_code == 2 and "nope" in out.output


def test_the_dashboard_shows_lifecycle_events():
    import uuid

    from rqueue.dashboard import app

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient
    mem = rqueue.connect(f"memory://{uuid.uuid4().hex}", prefix="dash", settings_ttl=0)
    try:
        mem.configure("orders", events="all")
        q = mem.queue("orders")
        q.publish(b"a")
        c = q.consumer("g", "c1")
        (d,) = c.fetch(1)
        c.nack(d, error="went wrong")
        (d,) = c.fetch(1)
        c.ack_result(d, None, event=True)
        web = TestClient(app(mem))
        page = web.get("/queue", params={"name": "orders"})
        assert page.status_code == 200
        assert "<td>failed</td>" in page.text and "<td>went wrong</td>" in page.text
        assert "<td>completed</td>" in page.text
        # and the view filters by kind, on the page and in its live fragment
        for path in ("/queue", "/fragment/queue"):
            only = web.get(path, params={"name": "orders", "event": "completed"})
            assert only.status_code == 200
            assert "<td>completed</td>" in only.text and "<td>failed</td>" not in only.text
        bad = web.get("/queue", params={"name": "orders", "event": "<b>"})
        assert bad.status_code == 400 and "<b>" not in bad.text
    finally:
        mem.close()

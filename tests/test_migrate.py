"""`rqueue migrate` (rqueue/migration.py, lua/migrate.lua): a prefix in
use in the hash layout moves to the stream layout with every message each
group had not settled, its dead letters, its replays and its deliveries in
flight; a move cut off is finished by the next run; a level refuses both
layouts' calls while it moves; every bad step is refused naming the
problem, with nothing changed."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from click.testing import CliRunner
from support.aio_bridge import connect_as
from support.servers import start_server

import rqueue
from rqueue import doctor
from rqueue.cli import cli
from rqueue.engine.keys import LAYOUT_ENV, LogLayout, QueueKeys, layout_key
from rqueue.engine.migration import level_keys, migrate_level
from rqueue.errors import InvalidInput, LayoutMismatch, OutOfMemory
from rqueue.migration import migrate_prefix

ACK_WAIT = 30.0


def client_of(backend: str, prefix: str, default: str, clock: Any) -> Any:
    """A sync client whose default layout (for a new prefix) is ``default``."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(LAYOUT_ENV, default)
        return connect_as("sync", backend, prefix=prefix, clock=clock, settings_ttl=0)


def drain(consumer: Any, clock: Any, advance: float = ACK_WAIT * 2) -> list[bytes]:
    """Every payload the consumer is handed until it is handed none, each
    acked; the clock is moved by ``advance`` first (past every lease)."""
    clock.advance(advance)
    got: list[bytes] = []
    while batch := consumer.fetch(50):
        got += [d.data for d in batch]
        consumer.ack(batch)
    return got


@pytest.fixture
def old(backend: str, prefix: str, clock: Any) -> Any:
    c = client_of(backend, prefix, "hash", clock)
    c.configure("orders", ack_wait=ACK_WAIT)
    yield c
    c.close()


@pytest.fixture
def private(prefix: str, clock: Any) -> Any:
    """A hash-layout client of a private Redis, whose memory limit a test sets."""
    server = start_server("redis")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(LAYOUT_ENV, "hash")
        c = connect_as("sync", server.url, prefix=prefix, clock=clock, settings_ttl=0)
    try:
        yield server, c
    finally:
        c.close()
        server.stop()


def test_a_prefix_in_use_moves_and_each_group_gets_what_it_had_not_settled(old, backend, prefix, clock):
    # given a hash-layout queue with two groups: plain, header, delayed, priority and keyed
    # messages; g1 acked two out of order, rejected one and holds one in flight; g2 settled
    # everything due
    q = old.queue("orders")
    g1, g2 = q.consumer("g1"), q.consumer("g2")
    plain = [f"m{i}".encode() for i in range(8)]
    q.publish_many(plain)
    q.publish(b"headed", headers={"trace": "x"})
    q.publish(b"urgent", priority=5)
    q.publish_many([b"k1", b"k2"], key="a")
    q.publish(b"later", delay=ACK_WAIT * 100)
    assert old.log_layout is LogLayout.HASH
    got = g1.fetch(4)
    g1.ack([got[0], got[2]])
    g1.reject(got[1])
    held = got[3]
    settled_by_g2 = Counter(drain(g2, clock))
    everything = Counter([*plain, b"headed", b"urgent", b"k1", b"k2", b"later"])
    assert settled_by_g2 == everything - Counter([b"later"])
    # when the prefix is migrated by an administrator's client
    admin = client_of(backend, prefix, "hash", clock)
    try:
        report = migrate_prefix(admin)
    finally:
        admin.close()
    # then the marker names the stream layout, the queue and its dead-letter queue are stream
    # levels, and no hash log is left
    r = old.redis
    base = q.keys.base
    assert r.get(layout_key(prefix)) == b"stream"
    assert [(lv.base, lv.before) for lv in report.levels] == [(base, "hash"), (f"{base}:dlq", "hash")]
    assert report.left == []
    for level in (base, f"{base}:dlq"):
        assert r.hget(f"{level}:meta", "layout") == b"stream"
        assert r.exists(f"{level}:msgs", f"{level}:settled") == 0
        assert r.hget(f"{level}:meta", "migrated") is None
    # and a client whose default is the hash layout follows the marker; each group is handed,
    # once each, what it had not settled: g1 its held delivery again and the rest, g2 the
    # delayed message once due
    new = client_of(backend, prefix, "hash", clock)
    try:
        assert new.log_layout is LogLayout.STREAM
        nq = new.queue("orders")
        expected_g1 = everything - Counter([got[0].data, got[1].data, got[2].data, b"later"])
        assert held.data in expected_g1
        assert Counter(drain(nq.consumer("g1"), clock)) == expected_g1
        assert drain(nq.consumer("g2"), clock) == []
        assert drain(nq.consumer("g1"), clock, ACK_WAIT * 100) == [b"later"]
        assert drain(nq.consumer("g2"), clock, 0) == [b"later"]
        # and the dead letter is there, and replayed to g1 alone
        (letter,) = nq.dead_letters()
        assert letter.data == got[1].data
        assert nq.replay_dead_letters().replayed == 1
        assert drain(nq.consumer("g1"), clock) == [got[1].data]
        assert drain(nq.consumer("g2"), clock) == []
        # and the doctor finds nothing wrong, and new messages flow
        assert doctor.examine(nq) == []
        nq.publish(b"after")
        assert drain(nq.consumer("g1"), clock) == [b"after"]
    finally:
        new.close()


def test_a_replayed_record_below_the_trim_point_is_kept_for_the_group_that_reopened_it(old, backend, prefix, clock):
    # given a message g1 rejected, every other acked (the floor, and the trim point, passed it),
    # then replayed from the dead-letter queue: its record is pinned
    q = old.queue("orders")
    g1 = q.consumer("g1")
    q.publish_many([b"a", b"b", b"c"])
    a, b, c = g1.fetch(3)
    g1.reject(b)
    g1.ack([a, c])
    assert q.replay_dead_letters().replayed == 1
    assert int(old.redis.hget(q.keys.meta, "trimmed")) >= 3
    # when the prefix is migrated
    report = migrate_prefix(old)
    # then the record is kept beside the pins, and g1 is handed it once
    (top, _dlq) = report.levels
    assert top.pinned == 1
    new = client_of(backend, prefix, "hash", clock)
    try:
        assert drain(new.queue("orders").consumer("g1"), clock) == [b"b"]
        assert doctor.examine(new.queue("orders")) == []
    finally:
        new.close()


def test_a_migration_cut_off_is_finished_by_the_next_run(old, backend, prefix, clock):
    # given a queue of 25 messages, one group, and a migration that stops after its second copy
    q = old.queue("orders")
    g = q.consumer("g")
    payloads = [f"m{i}".encode() for i in range(25)]
    q.publish_many(payloads)
    g.ack(g.fetch(3))
    calls: list[int] = []

    class Cut(Exception):
        pass

    def stop_after_two(base: str, done: int, total: int) -> None:
        calls.append(done)
        if len(calls) == 2:
            raise Cut

    with pytest.raises(Cut):
        migrate_level(old.scripts, old.redis, q.keys.base, stop_after_two, step=5)
    # then the level refuses the hash client meanwhile, and holds records in both logs
    r = old.redis
    assert r.hget(q.keys.meta, "layout") == b"migrating"
    assert r.hget(q.keys.meta, "migrated") is not None
    assert r.hlen(q.keys.msgs) == 12
    with pytest.raises(LayoutMismatch, match="being migrated"):
        g.fetch(1)
    # and the doctor says the move was cut off, and checks nothing else of the level
    (finding,) = doctor.examine(q)
    assert finding.kind is doctor.Kind.MIGRATION_UNFINISHED
    assert "copying records up to seq 13" in finding.detail
    # when the prefix is migrated again
    report = migrate_prefix(old)
    # then the level's migration is finished, and the group gets the 22 messages once each
    assert [lv.before for lv in report.levels] == ["migrating"]
    new = client_of(backend, prefix, "hash", clock)
    try:
        assert drain(new.queue("orders").consumer("g"), clock) == payloads[3:]
    finally:
        new.close()


def test_a_level_being_migrated_refuses_both_layouts_calls_and_changes_nothing(old, backend, prefix, clock):
    # given a hash queue with a message, marked by the migration's first step
    q = old.queue("orders")
    q.publish(b"a")
    keys = level_keys(q.keys.base)
    assert old.scripts.migrate(keys, ["begin"]) == [b"begun"]
    r = old.redis
    before = (r.hgetall(q.keys.meta), r.hgetall(q.keys.msgs))
    stream_client = client_of(backend, prefix, "stream", clock)
    stream_client.log_layout = LogLayout.STREAM
    try:
        # when a hash client and a stream client publish and fetch, then each is refused, naming
        # the migration
        for c in (old, stream_client):
            sq = c.queue("orders")
            with pytest.raises(LayoutMismatch, match="being migrated to the stream layout"):
                sq.publish(b"b")
            with pytest.raises(LayoutMismatch, match="being migrated to the stream layout"):
                sq.consumer("g").fetch(1)
        # and nothing was written
        assert (r.hgetall(q.keys.meta), r.hgetall(q.keys.msgs)) == before
        assert r.exists(QueueKeys(q.keys.base, LogLayout.STREAM).msgs) == 0
        # and a second begin says the level is marked already
        assert old.scripts.migrate(keys, ["begin"]) == [b"migrating"]
    finally:
        stream_client.close()


def test_a_second_run_changes_nothing(old, backend, prefix, clock):
    # given a migrated prefix
    old.queue("orders").publish_many([b"a", b"b"])
    migrate_prefix(old)
    r = old.redis
    written = {key: r.dump(key) for key in r.scan_iter(match=f"{prefix}:*")}
    # when it is migrated again, then every level says it was a stream level already, and no
    # key changed
    report = migrate_prefix(old)
    assert [lv.before for lv in report.levels] == ["stream"]
    assert report.moved == 0
    assert {key: r.dump(key) for key in r.scan_iter(match=f"{prefix}:*")} == written


@pytest.mark.parametrize(
    "args, problem",
    [
        (["sideways"], 'the migration step is "begin", "copy" or "finish", not "sideways"'),
        (["copy"], "a copy takes 1 to 5000 seqs, not 0"),
        (["copy", *range(1, 5002)], "a copy takes 1 to 5000 seqs, not 5001"),
        (["copy", "4", "3"], "3 follows 4"),
        (["copy", "4", "x"], "a seq to copy is a whole number above 0, not x"),
        (["copy", "0"], "a seq to copy is a whole number above 0, not 0"),
        (["copy", "2"], r"each above the last copied \(2, meta field migrated\): 2 follows 2"),
    ],
)
def test_a_bad_copy_is_refused_naming_the_problem_and_changes_nothing(old, args, problem):
    # given a queue marked for migration, seqs up to 2 copied
    q = old.queue("orders")
    q.publish_many([b"a", b"b", b"c"])
    keys = level_keys(q.keys.base)
    old.scripts.migrate(keys, ["begin"])
    old.scripts.migrate(keys, ["copy", "1", "2"])
    r = old.redis
    stream_key = QueueKeys(q.keys.base, LogLayout.STREAM).msgs
    before = (r.hgetall(q.keys.meta), r.hgetall(q.keys.msgs), r.xlen(stream_key))
    # when a bad step is sent, then it is refused naming the problem, and nothing changes
    with pytest.raises(Exception, match=problem) as refused:
        old.scripts.migrate(keys, args)
    assert isinstance(refused.value, InvalidInput) or "RQ_BAD_ARGUMENT" in str(refused.value)
    assert (r.hgetall(q.keys.meta), r.hgetall(q.keys.msgs), r.xlen(stream_key)) == before


def test_a_copy_or_finish_before_begin_is_refused(old):
    # given a hash queue that no migration marked
    q = old.queue("orders")
    q.publish(b"a")
    keys = level_keys(q.keys.base)
    # when a copy or a finish is sent, then each is refused naming the missing mark
    for step in (["copy", "1"], ["finish"]):
        with pytest.raises(Exception, match='needs it marked "migrating" by the step "begin"'):
            old.scripts.migrate(keys, step)
    assert old.redis.hget(q.keys.meta, "layout") is None
    assert old.redis.hlen(q.keys.msgs) == 1


def test_finish_waits_for_every_record_to_be_copied(old):
    # given a marked queue of two records, one copied
    q = old.queue("orders")
    q.publish_many([b"a", b"b"])
    keys = level_keys(q.keys.base)
    old.scripts.migrate(keys, ["begin"])
    assert old.scripts.migrate(keys, ["copy", "1"]) == [1, 0, 0, 0]
    # when it is finished, then it says one record is left and stays marked
    assert old.scripts.migrate(keys, ["finish"]) == [0, 1]
    assert old.redis.hget(q.keys.meta, "layout") == b"migrating"


def test_begin_refuses_a_hash_level_whose_stream_log_holds_entries(old):
    # given a hash queue beside a stream log of the same base that holds an entry
    q = old.queue("orders")
    q.publish(b"a")
    stream_key = QueueKeys(q.keys.base, LogLayout.STREAM).msgs
    old.redis.xadd(stream_key, {"p": "stray"}, id="9-0")
    # when the migration begins, then it is refused naming both keys, and nothing is marked
    with pytest.raises(Exception, match=f"RQ_CORRUPT|{stream_key}"):
        old.scripts.migrate(level_keys(q.keys.base), ["begin"])
    assert old.redis.hget(q.keys.meta, "layout") is None


@pytest.mark.parametrize("backend", ["redis", "memory"], indirect=True)
def test_the_command_asks_first_and_prints_json(backend, prefix, clock, monkeypatch):
    # given a hash prefix with a queue of two messages
    monkeypatch.setenv(LAYOUT_ENV, "hash")
    c = rqueue.connect(backend, prefix=prefix)
    try:
        c.queue("orders").publish_many([b"a", b"b"])
        runner = CliRunner()
        base = ["--url", backend, "--prefix", prefix, "migrate", "--to", "stream"]
        # when it is answered no, then nothing changes
        refused = runner.invoke(cli, base, input="n\n")
        assert refused.exit_code != 0
        assert c.redis.get(layout_key(prefix)) == b"hash"
        # when it runs with --yes --json, then it prints what it moved
        ran = runner.invoke(cli, [*base, "--yes", "--json"])
        assert ran.exit_code == 0, ran.output
        report = json.loads(ran.stdout)
        assert report["layout"] == "stream" and report["moved"] == 1 and report["left"] == []
        (level,) = report["levels"]
        assert level["before"] == "hash" and level["logged"] == 2
        assert c.redis.get(layout_key(prefix)) == b"stream"
        # and the text form says a second run found nothing to move
        again = runner.invoke(cli, [*base, "--yes"])
        assert again.exit_code == 0, again.output
        assert "in the stream layout already" in again.output
        assert "0 level(s) moved" in again.output
    finally:
        c.close()


def test_a_migration_near_maxmemory_takes_smaller_steps_and_loses_nothing(private, clock):
    # given a private Redis whose maxmemory leaves less room than one step of copies needs
    server, c = private
    q = c.queue("orders")
    payloads = [b"%06d" % i + b"x" * 100 for i in range(20_000)]
    q.publish_many(payloads)
    r = c.redis
    r.config_set("maxmemory-policy", "noeviction")
    r.config_set("maxmemory", int(r.info("memory")["used_memory"]) + 200_000)
    # when the prefix is migrated, then it completes, and every message is there once
    report = migrate_prefix(c)
    assert [(lv.before, lv.logged) for lv in report.levels] == [("hash", 20_000)]
    r.config_set("maxmemory", 0)
    new = connect_as("sync", server.url, prefix=c.prefix, clock=clock, settings_ttl=0)
    try:
        assert drain(new.queue("orders").consumer("g"), clock) == payloads
    finally:
        new.close()


def test_a_partitioned_queue_moves_with_each_partition_and_its_dead_letters(old, backend, prefix, clock):
    # given a queue of three partitions, keyed messages over them, one rejected
    pq = old.queue("orders", partitions=3)
    keys = [f"k{i}" for i in range(12)]
    for k in keys:
        pq.publish(k.encode(), key=k)
    c = pq.consumer("g")
    got = c.fetch(12)
    c.reject(got[0])
    # when the prefix is migrated
    report = migrate_prefix(old)
    # then every partition, and the dead-letter level of the one that has dead letters, moved
    bases = [lv.base for lv in report.levels]
    assert all(lv.before == "hash" for lv in report.levels)
    assert sum(1 for b in bases if ":part:" in b and not b.endswith(":dlq")) == 3
    assert sum(1 for b in bases if b.endswith(":dlq")) == 1
    # and a new client is handed the 11 held deliveries again once their leases ran out, and
    # replays the dead letter
    new = client_of(backend, prefix, "hash", clock)
    try:
        nq = new.queue("orders")
        assert sorted(drain(nq.consumer("g"), clock)) == sorted(d.data for d in got[1:])
        assert nq.replay_dead_letters().replayed == 1
        assert drain(nq.consumer("g"), clock) == [got[0].data]
    finally:
        new.close()


@pytest.mark.parametrize("backend", ["redis", "valkey", "memory"], indirect=True)  # the cluster refuses the setting
def test_a_dead_letter_queue_named_by_the_setting_moves_too(old, backend, prefix, clock):
    # given a queue whose dead letters go to a queue named by the dead_letter setting, which
    # dead-lettering makes without listing it, and one message there
    old.configure("orders", dead_letter="graveyard")
    q = old.queue("orders")
    q.publish_many([b"a", b"b"])
    g = q.consumer("g")
    a, _b = g.fetch(2)
    g.reject(a)
    assert old.redis.sismember(f"{prefix}:queues", "graveyard") == 0
    # when the prefix is migrated, then the named dead-letter queue moved with the queue
    report = migrate_prefix(old)
    assert sorted(lv.base for lv in report.levels) == sorted([q.keys.base, f"{prefix}:{{graveyard}}"])
    assert report.marked and report.left == []
    # and a new client rejects into it and reads it
    new = client_of(backend, prefix, "hash", clock)
    try:
        nq = new.queue("orders")
        clock.advance(ACK_WAIT * 2)  # b's lease runs out
        (b,) = nq.consumer("g").fetch(1)
        b.reject()
        assert sorted(m.data for m in new.queue("graveyard").peek()) == [b"a", b"b"]
    finally:
        new.close()


def test_a_run_refused_before_any_level_moved_leaves_the_prefix_as_it_was(private, prefix, clock):
    # given a private Redis at maxmemory, and a hash prefix with a queue
    _server, c = private
    q = c.queue("orders")
    q.publish_many([b"a", b"b"])
    r = c.redis
    r.config_set("maxmemory-policy", "noeviction")
    # (in small writes: one of 2 MB leaves a query buffer that Redis frees a moment later, taking
    # used memory back under the limit set from it)
    for i in range(40):
        r.set(f"filler{i}", b"x" * 50_000)
    r.config_set("maxmemory", int(r.info("memory")["used_memory"]) - 1_000_000)
    # when the prefix is migrated, then it is refused for memory
    with pytest.raises(OutOfMemory):
        migrate_prefix(c)
    # and the marker and the queue are as they were: a hash client still consumes it
    r.config_set("maxmemory", 0)
    assert r.get(layout_key(prefix)) == b"hash"
    assert r.hget(q.keys.meta, "layout") is None
    assert drain(q.consumer("g"), clock) == [b"a", b"b"]
    # and a run with room moves it
    assert migrate_prefix(c).marked


def test_a_hash_clients_ack_of_a_replayed_delivery_after_the_move_leaves_no_record_behind(old, backend, prefix, clock):
    # given a replayed message a hash-layout consumer holds again, and the prefix migrated
    # under that consumer (it was not stopped)
    q = old.queue("orders")
    g = q.consumer("g")
    q.publish_many([b"a", b"b"])
    a, b = g.fetch(2)
    g.reject(a)
    g.ack(b)
    assert q.replay_dead_letters().replayed == 1
    (again,) = g.fetch(1)
    admin = client_of(backend, prefix, "hash", clock)
    try:
        migrate_prefix(admin)
    finally:
        admin.close()
    assert old.redis.hexists(q.keys.pinned, "r1")
    # when the old consumer acks it (a hash-layout ack is not refused)
    g.ack(again)
    # then neither the pin nor the record kept beside it is left
    assert old.redis.hgetall(q.keys.pinned) == {}

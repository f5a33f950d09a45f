"""Storage-layout prototypes of issue 24, measured against raw Streams and the
current rqueue in one run on a private redis-server (docs/storage-prototypes.md).

usage: PYTHONPATH=. python benchmarks/prototypes/bench.py [--runs 3] [--messages 20000]
           [--memory-messages 100000] [--layouts a,b] [--fetch-size 100] [--direct]
           [--direct-prototypes] [--ack-group G [--shuffle-window W]] [--vs rqueue] [--json FILE]
           [--breakdown] [--check-only]

Starts redis-server on a free loopback port (never 6379) in a temp dir without
persistence, checks the prototypes' semantics (--check-only stops there), then
per run, every layout in turns (10 turns each, on one server): publish_many(100)
msg/s, fetch(n)+ack(list) msg/s and its Redis CPU (n: --fetch-size); then per
layout: Redis CPU per message of publish / fetch / ack (INFO commandstats usec,
fetch(n) and ack in a pass of their own with the counters read between calls),
used_memory per queued message and per message in flight (--memory-messages 0:
not measured). Prints the medians and the per-run ratios to Streams (--vs: also
to that layout; --breakdown: Redis time per command of a fetch+ack loop); stops
the server by its PID. --direct: Streams and the prototypes send their calls
without redis-py's per-call bookkeeping (Layout.go_direct).

A layout named stream_calls:E, stream_calls_2rt:E or stream_calls_2rt_dlv:E
(E a whole number) is prototype (d) with every seq that is a multiple of E
handed out by its per-message path, as flow control would (E 10: 10% of the
deliveries, 2: 50%, 1: all of them); rqueue:E is the current layout with every
E-th message published with a priority, its flow-control path.
--direct-prototypes: only the prototypes skip that bookkeeping; Streams goes
through redis-py as in benchmarks/run.sh. --ack-group G: the timed loop acks
each fetch's deliveries G at a time, in an order shuffled within windows of
--shuffle-window W (a worker's pattern).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import redis
from layouts import (
    ACK_WAIT_MS,
    IN_SPAN,
    LAYOUTS,
    Layout,
    Rqueue,
    Scripted,
    StreamCalls,
    StreamCallsClaim,
    StreamPel,
    WideHash,
)

BATCH = 100  # publish_many's batch, and fetch(n)'s n unless --fetch-size says otherwise
FILL = 1000  # messages per call when filling for the memory figures (untimed)
PAYLOAD = 100


def payloads(start: int, n: int) -> list[bytes]:
    return [(b"%010d" % i).ljust(PAYLOAD, b"x") for i in range(start, start + n)]


class Server:
    """A private redis-server: free port, own dir, no persistence."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="rq-proto-")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        assert self.port != 6379
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                self.dir,
                "--save",
                "",
                "--appendonly",
                "no",
                "--logfile",
                os.path.join(self.dir, "redis.log"),
            ],  # fmt: skip
            stdout=subprocess.DEVNULL,
        )
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.r = redis.Redis(port=self.port)
        deadline = time.monotonic() + 10
        while True:
            try:
                self.r.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self.version = self.r.info("server")["redis_version"]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def usec(r: redis.Redis, commands: tuple[str, ...]) -> int:
    stats = r.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("usec", 0)) for c in commands)


def used_memory(r: redis.Redis) -> int:
    return int(r.info("memory")["used_memory"])


DIRECT = False  # --direct: the timed calls skip redis-py's per-call bookkeeping (Layout.go_direct)
DIRECT_PROTOTYPES = False  # --direct-prototypes: the same for the prototypes only, Streams through redis-py


def make(kind: str, r: redis.Redis, url: str, queue: str) -> Layout:
    """A layout by its name; "<(d)>:<E>" is (d) with every E-th seq on its
    per-message path."""
    name, _, every = kind.partition(":")
    layout = LAYOUTS[name](r, url, queue)
    if DIRECT or (DIRECT_PROTOTYPES and isinstance(layout, Scripted)):
        layout.go_direct()
    if every:
        assert isinstance(layout, StreamCalls | Rqueue), kind
        layout.every = int(every)
        layout.name = kind
    return layout


def fresh(server: Server, kind: str, label: str) -> Layout:
    server.r.flushall()
    layout = make(kind, server.r, server.url, f"q-{label}")
    layout.join()
    return layout


ACK_GROUP = 0  # --ack-group: each fetch's deliveries acked G at a time (0: all in one call)
SHUFFLE_WINDOW = 1  # --shuffle-window: ... in an order shuffled within windows of W


def drain(layout: Layout, n: int, size: int = BATCH) -> None:
    """fetch(size) + ack until n are settled. With --ack-group G, each
    fetch's deliveries are acked G at a time, in an order shuffled within
    windows of --shuffle-window W (the same order for every layout): a
    worker's handlers finishing out of order, their acks sent a few at a
    time."""
    done = 0
    shuffle = random.Random(n).shuffle
    while done < n:
        ds = layout.fetch(size)
        if not ds:
            raise RuntimeError(f"{layout.name}: fetch came back empty after {done} of {n}")
        if not ACK_GROUP:
            layout.ack(ds)
        else:
            order = []
            for w in range(0, len(ds), SHUFFLE_WINDOW):
                window = ds[w : w + SHUFFLE_WINDOW]
                shuffle(window)
                order += window
            for g in range(0, len(order), ACK_GROUP):
                layout.ack(order[g : g + ACK_GROUP])
        done += len(ds)


TURNS = 10  # the timed figures: each layout does its messages in this many turns, taking turns


def measure_run(
    server: Server, kinds: list[str], n: int, mem_n: int, run: int, size: int = BATCH
) -> dict[str, dict[str, float]]:
    """One run of every figure for every layout. The timed figures
    interleave the layouts (TURNS turns each, on one server holding all
    their queues), so that every layout meets the same background load:
    on 2 shared cores a figure timed alone swings by 2-4x."""
    r = server.r
    r.flushall()
    out: dict[str, dict[str, float]] = {k: {} for k in kinds}
    layouts = {}
    for k in kinds:
        layouts[k] = make(k, r, server.url, f"q-{run}-{k}")
        layouts[k].join()
    chunk = n // TURNS
    spent = {k: [0.0, 0, 0.0, 0.0, 0] for k in kinds}  # publish s, publish usec, consume s, client cpu s, usec
    for turn in range(TURNS):
        for k in kinds[turn % len(kinds) :] + kinds[: turn % len(kinds)]:
            layout = layouts[k]
            u0, t0 = usec(r, layout.publish_cmds), time.perf_counter()
            for start in range(turn * chunk, (turn + 1) * chunk, BATCH):
                layout.publish_many(payloads(start, BATCH))
            spent[k][0] += time.perf_counter() - t0
            spent[k][1] += usec(r, layout.publish_cmds) - u0
    for turn in range(TURNS):
        for k in kinds[turn % len(kinds) :] + kinds[: turn % len(kinds)]:
            cmds = tuple({*layouts[k].fetch_cmds, *layouts[k].ack_cmds})
            u0 = usec(r, cmds)
            c0, t0 = time.process_time(), time.perf_counter()
            drain(layouts[k], chunk, size)
            spent[k][2] += time.perf_counter() - t0
            spent[k][3] += time.process_time() - c0
            spent[k][4] += usec(r, cmds) - u0
    for k in kinds:
        settled_all(r, layouts[k])
    for k in kinds:
        total = chunk * TURNS
        out[k]["publish_rate"] = total / spent[k][0]
        out[k]["publish_us"] = spent[k][1] / total
        out[k]["consume_rate"] = total / spent[k][2]
        out[k]["client_us"] = spent[k][3] / total * 1e6
        out[k]["consume_us"] = spent[k][4] / total
        out[k].update(split_cpu(server, layouts[k], n, size))
        layouts[k].close()
    for k in kinds:
        if mem_n:
            out[k].update(memory(server, k, mem_n, run))
    r.flushall()
    return out


def settled_all(r: redis.Redis, layout: Layout) -> None:
    """After a timed loop, (d)'s group is where a settled queue's is: its
    floor at its cursor, no acked runs stored above it, and its log
    trimmed to nothing. A figure of a group left behind compares unlike
    states."""
    if not isinstance(layout, StreamCalls):
        return
    group, acked = layout.fetch_keys[1], layout.ack_keys[5]
    floor, cursor = r.hmget(group, "floor", "cursor")
    assert floor == cursor and r.zcard(acked) == 0 and r.xlen(layout.stream_key) == 0, (
        f"{layout.name}: floor {floor!r}, cursor {cursor!r}, {r.zcard(acked)} runs stored, "
        f"{r.xlen(layout.stream_key)} entries left"
    )


def split_cpu(server: Server, layout: Layout, n: int, size: int = BATCH) -> dict[str, float]:
    """Redis usec per message of fetch(size) and of ack, the counters read
    between the calls (untimed)."""
    r = server.r
    for start in range(0, n, FILL):
        layout.publish_many(payloads(start, FILL))
    fetch_us = ack_us = 0
    done = 0
    # The counters are read around a group of calls of about 100 messages
    # (fetch(100): every call, as before): INFO commandstats between two
    # fetch(1) calls flushes the CPU caches, and the script calls after it
    # took 1.5x their time in a loop without it.
    calls = max(1, BATCH // size)
    while done < n:
        a = usec(r, layout.fetch_cmds)
        got = [layout.fetch(size) for _ in range(calls)]
        b = usec(r, layout.fetch_cmds)
        b_ack = usec(r, layout.ack_cmds)
        for ds in got:
            layout.ack(ds)
        c = usec(r, layout.ack_cmds)
        fetch_us += b - a
        ack_us += c - b_ack
        done += sum(len(ds) for ds in got)
    return {"fetch_us": fetch_us / n, "ack_us": ack_us / n}


def memory(server: Server, kind: str, mem_n: int, run: int) -> dict[str, float]:
    """used_memory per message: mem_n queued, then the same held in flight
    by one consumer (a fresh server state for each layout)."""
    r = server.r
    layout = fresh(server, kind, f"{run}m")
    m0 = used_memory(r)
    for start in range(0, mem_n, FILL):
        layout.publish_many(payloads(start, FILL))
    m1 = used_memory(r)
    held = 0
    while held < mem_n:
        got = len(layout.fetch(FILL))
        if not got:
            raise RuntimeError(f"{layout.name}: {held} of {mem_n} in flight")
        held += got
    m2 = used_memory(r)
    layout.close()
    return {"mem_queued": (m1 - m0) / mem_n, "mem_inflight": (m2 - m1) / mem_n}


# -- the semantics the prototypes keep, checked on the same server -----------------


def check(server: Server) -> list[str]:
    """Each prototype: a stale tag is refused, a repeated tag settles once,
    an expired lease is delivered again with count 2 and its old tag is
    refused while the new one settles, max_deliveries dead-letters, the ack
    floor follows out-of-order acks and the log is trimmed behind it, ids
    de-duplicate. Returns what was verified."""
    r = server.r
    said = []
    # XREADGROUP inside a script: without BLOCK it works; with BLOCK?
    r.flushall()
    r.xgroup_create("s", "g", id="0", mkstream=True)
    r.xadd("s", {"p": b"x"})
    got = r.eval("return redis.call('XREADGROUP','GROUP','g','c','COUNT',10,'STREAMS',KEYS[1],'>')", 1, "s")
    assert got and got[0][1][0][1] == [b"p", b"x"], got
    said.append("XREADGROUP COUNT without BLOCK runs inside EVAL (Redis " + server.version + ")")
    t0 = time.perf_counter()
    try:
        blocked = r.eval(
            "return redis.call('XREADGROUP','GROUP','g','c','BLOCK',1000,'COUNT',1,'STREAMS',KEYS[1],'>')", 1, "s"
        )
        said.append(f"XREADGROUP BLOCK 1000 inside EVAL returns at once ({time.perf_counter() - t0:.3f} s): {blocked}")
    except redis.ResponseError as exc:
        said.append(f"XREADGROUP BLOCK inside EVAL is refused: {exc}")
    for kind in (StreamPel, WideHash, StreamCalls, StreamCallsClaim):
        r.flushall()
        layout = kind(r, server.url, "chk")
        layout.join()
        layout.publish_many(payloads(0, 6))
        first = fetch_with(layout, 3, ack_wait=50)
        assert [d[1] for d in first] == [1, 1, 1] and first[0][3] == payloads(0, 1)[0], first
        second = layout.fetch(3)
        # out of order: ack the later call first, then a stale count, then the earlier
        layout.ack(second)
        stale = (first[0][0], 2, *first[0][2:])  # the first delivery's tag with a count it never had
        statuses = ack_raw(layout, [stale])
        assert statuses[0].startswith(b"RQ_STALE"), statuses
        layout.ack(first[:2])
        statuses = ack_raw(layout, [first[0], first[0]])
        assert all(s.startswith((b"RQ_NOT_HELD", b"RQ_PARTIAL")) for s in statuses), statuses
        # the last of the first call: its lease runs out (ack_wait 50 ms)
        lone = first[2]
        time.sleep(0.1)  # the lease must have run out on the server's clock: nothing to poll
        again = fetch_with(layout, 3, ack_wait=50)
        assert [(d[0], d[1]) for d in again] == [(lone[0], 2)], again
        statuses = ack_raw(layout, [lone])
        assert statuses[0].startswith(b"RQ_STALE"), statuses
        layout.ack(again)
        if isinstance(layout, StreamPel):
            assert r.xlen(layout.publish_keys[0]) == 0, r.xrange(layout.publish_keys[0])
            assert r.xpending(layout.publish_keys[0], "g")["pending"] == 0
        elif isinstance(layout, StreamCalls):
            assert r.xlen(layout.publish_keys[0]) == 0, r.xrange(layout.publish_keys[0])
            assert r.hget(layout.fetch_keys[1], "floor") == b"6", r.hgetall(layout.fetch_keys[1])
            assert r.hlen(layout.fetch_keys[3]) == 0, r.hgetall(layout.fetch_keys[3])
            assert r.hlen(layout.fetch_keys[4]) == 0, r.hgetall(layout.fetch_keys[4])
        else:
            assert r.hget(layout.fetch_keys[2], "floor") == b"6", r.hgetall(layout.fetch_keys[2])
            assert r.hlen(layout.fetch_keys[1]) == 0
            assert r.hkeys(layout.fetch_keys[3]) == [b"pin"]
        # max_deliveries: one message taken back until it is dead-lettered
        layout.publish_many(payloads(100, 1))
        for _ in range(5):
            got = fetch_with(layout, 1, ack_wait=1)
            assert len(got) == 1, got
            time.sleep(0.01)
        assert fetch_with(layout, 1, ack_wait=1) == []
        dlq = layout.dlq if isinstance(layout, StreamCalls) else layout.fetch_keys[-1]
        assert (r.llen(dlq) if isinstance(layout, WideHash) else r.xlen(dlq)) == 1
        # ids de-duplicate inside the window
        idkey = f"{layout.publish_keys[0]}:id:a"
        keys = [*layout.publish_keys, idkey]
        at = len(keys)
        one = r.evalsha(layout.sha["publish"], len(keys), *keys, 60000, "", at, b"m")
        two = r.evalsha(layout.sha["publish"], len(keys), *keys, 60000, "", at, b"m")
        assert one[1] == 0 and two == [one[0], 1], (one, two)
        said.append(
            f"{layout.name}: stale and repeated tags refused, out-of-order acks and the floor, expired lease "
            "delivered again (count 2, old tag refused), dead letter at max_deliveries, de-duplication: ok"
        )
    r.flushall()
    return said


def check_parked(server: Server) -> list[str]:
    """(d) with every third seq on the per-message path (stream_calls:3):
    such a seq is handed out in the same call with count 1 and a dlv
    state; a range over it is refused whole, its tag with another count is
    refused, its tag twice in one ack settles once, it is taken back with count 2 when its lease runs out (the
    old tag refused); a call handed out wholly by that path settles; the
    floor, the log, the calls and dlv hashes end empty."""
    r = server.r
    said = []
    for kind in (StreamCalls, StreamCallsClaim):
        r.flushall()
        layout = kind(r, server.url, "chk")
        layout.every = 3
        layout.join()
        dlv = layout.fetch_keys[4]
        layout.publish_many(payloads(0, 9))
        first = layout.fetch(4, ack_wait=50)
        by_seq = {d[4]: d for d in first}
        assert sorted(by_seq) == [1, 2, 3, 4] and [d[4] for d in first if d[5] is not True] == [3], first
        assert all(d[1] == 1 and d[3] == payloads(d[4] - 1, 1)[0] for d in first), first
        assert r.hget(dlv, "3") == b"1:" + first[0][2].encode(), r.hgetall(dlv)
        as_range = (*by_seq[3][:5], True)
        assert ack_raw(layout, [by_seq[2], as_range, by_seq[4]]) == [b"RQ_PARTIAL 2-4"]
        assert ack_raw(layout, [(*by_seq[3][:1], 2, *by_seq[3][2:])]) == [b"RQ_STALE 3"]
        if kind is StreamCallsClaim:  # the range spans the parked seq: 1-4, 3, 3
            got = ack_raw(layout, [*first, by_seq[3]])
            assert got == [b"ok", b"ok", b"RQ_STALE 3"], got
        else:  # 1-2, 4-4, 3, 3
            assert ack_raw(layout, [*first, by_seq[3]]) == [b"ok", b"ok", b"ok", b"RQ_STALE 3"]
        assert ack_raw(layout, [by_seq[3]]) == [b"RQ_STALE 3"]
        second = layout.fetch(4, ack_wait=50)
        assert sorted(d[4] for d in second) == [5, 6, 7, 8], second
        layout.ack([d for d in second if d[4] != 6])
        time.sleep(0.1)  # the lease must have run out on the server's clock: nothing to poll
        third = layout.fetch(4, ack_wait=50)
        assert [(d[4], d[1], d[5]) for d in third] == [(6, 2, False), (9, 1, False)], third
        assert ack_raw(layout, [d for d in second if d[4] == 6]) == [b"RQ_STALE 6"]
        layout.ack(third[:1])
        layout.ack(third[1:])
        assert r.xlen(layout.stream_key) == 0, r.xrange(layout.stream_key)
        assert r.hget(layout.fetch_keys[1], "floor") == b"9", r.hgetall(layout.fetch_keys[1])
        assert r.hlen(layout.fetch_keys[3]) == 0, r.hgetall(layout.fetch_keys[3])
        assert r.hlen(dlv) == 0, r.hgetall(dlv)
        said.append(
            f"{layout.name}:3: a parked seq goes by the per-message path in the same call (count 1, dlv "
            "state), a range over it, a wrong count and a repeated tag are refused, its expired lease is "
            "delivered again with count 2 (old tag refused), a call of parked seqs only settles, floor and log: ok"
        )
    r.flushall()
    return said


def check_ranges(server: Server) -> list[str]:
    """(d)'s ack of ranges sent out of seq order, or overlapping one
    settled in the same call: each is checked against the call's record as
    the ranges before it left it (an overlap is refused whole, the rest
    settle), and the floor then covers them all."""
    r = server.r
    said = []
    for kind in (StreamCalls, StreamCallsClaim):
        r.flushall()
        layout = kind(r, server.url, "chk")
        layout.join()
        layout.publish_many(payloads(0, 6))
        got = layout.fetch(6)
        tok = got[0][2]
        keys = layout.ack_keys
        sha = layout.sha["ack"]
        first = r.evalsha(sha, len(keys), *keys, "g", "c1", tok, "4-5,1-2,2-3", "")
        assert first == [b"ok", b"ok", b"RQ_PARTIAL 2-3"], first
        assert r.hget(layout.fetch_keys[1], "floor") == b"2", r.hgetall(layout.fetch_keys[1])
        second = r.evalsha(sha, len(keys), *keys, "g", "c1", tok, "6-6,3-3", "")
        assert second == [b"ok", b"ok"], second
        assert r.hget(layout.fetch_keys[1], "floor") == b"6", r.hgetall(layout.fetch_keys[1])
        # stored runs that touch, taken by the floor in turn: 4-5 and 6-6 stored, then 1-3
        layout.publish_many(payloads(6, 6))
        tok = layout.fetch(6)[0][2]
        for ranges in ("10-11", "12-12"):
            assert r.evalsha(sha, len(keys), *keys, "g", "c1", tok, ranges, "") == [b"ok"]
        assert r.hget(layout.fetch_keys[1], "floor") == b"6", r.hgetall(layout.fetch_keys[1])
        assert r.evalsha(sha, len(keys), *keys, "g", "c1", tok, "7-9", "") == [b"ok"]
        assert r.hget(layout.fetch_keys[1], "floor") == b"12", r.hgetall(layout.fetch_keys[1])
        assert r.zcard(layout.ack_keys[5]) == 0, r.zrange(layout.ack_keys[5], 0, -1, withscores=True)
        assert r.xlen(layout.stream_key) == 0 and r.hlen(layout.fetch_keys[3]) == 0
        said.append(
            f"{layout.name}: ranges out of order settle, an overlapping one is refused whole, the floor takes "
            "stored runs that touch in turn: ok"
        )
    r.flushall()
    return said


def check_spans(server: Server) -> list[str]:
    """(d)'s range that spans parked seqs of its call (stream_calls_2rt:3):
    accepted only when each such seq is named in the same ack with its
    count and accepted; then the seqs, the floor and the in-flight counts
    are settled once each."""
    r = server.r
    r.flushall()
    layout = StreamCallsClaim(r, server.url, "chk")
    layout.every = 3
    layout.join()
    layout.publish_many(payloads(0, 6))
    got = layout.fetch(6)
    assert sorted(d[4] for d in got if d[5] == IN_SPAN) == [3, 6], got
    tok, keys, sha, g = got[0][2], layout.ack_keys, layout.sha["ack"], layout.fetch_keys[1]

    def ack(ranges: str, again: str) -> list[bytes]:
        return r.evalsha(sha, len(keys), *keys, "g", "c1", tok, ranges, again)  # type: ignore[no-any-return]

    assert ack("1-4", "") == [b"RQ_PARTIAL 1-4"]  # 3 not named
    assert ack("1-4", "3=2") == [b"RQ_PARTIAL 1-4", b"RQ_STALE 3"]  # 3 named with a count it never had
    assert r.hget(g, "inflight") == b"6" and r.hget(g, "floor") is None, r.hgetall(g)
    assert ack("1-5", "3=1,6=1") == [b"ok", b"ok", b"ok"]
    assert r.hmget(g, "inflight", "h:c1", "floor") == [b"0", b"0", b"6"], r.hgetall(g)
    assert r.xlen(layout.stream_key) == 0 and r.hlen(layout.fetch_keys[3]) == 0 and r.hlen(layout.fetch_keys[4]) == 0
    r.flushall()
    return [
        "stream_calls_2rt:3: a range spans its call's parked seqs only when the same ack names them with their "
        "count; then each seq, the floor and the in-flight counts settle once: ok"
    ]


def ack_raw(layout: Layout, tags: list[Any]) -> list[bytes]:
    if isinstance(layout, StreamCalls):
        return layout.ack_raw(tags)
    args: list[Any] = ["g", "c1"]
    if isinstance(layout, StreamPel):
        ids = sorted((d[0] for d in tags), key=lambda i: tuple(int(x) for x in i.split(b"-")))
        args += [ids[0], ids[-1]]
    for d in tags:
        args += [d[0], d[1], d[2]]
    keys = layout.ack_keys  # type: ignore[attr-defined]
    return layout.r.evalsha(layout.sha["ack"], len(keys), *keys, *args)  # type: ignore[attr-defined,no-any-return]


def fetch_with(layout: Layout, n: int, ack_wait: int) -> list[Any]:
    assert isinstance(layout, Scripted)
    return layout.fetch(n, ack_wait)


def breakdown(server: Server, kinds: list[str], n: int, size: int = BATCH) -> str:
    """Where a fetch(size)+ack loop spends Redis time: INFO commandstats
    after CONFIG RESETSTAT, usec per message of each command (a script's
    usec includes the commands it calls: the rest is the Lua side)."""
    lines = ["| layout | command | calls | usec per message |", "|---|---|---|---|"]
    for kind in kinds:
        layout = fresh(server, kind, "bd")
        for start in range(0, n, FILL):
            layout.publish_many(payloads(start, FILL))
        server.r.config_resetstat()
        drain(layout, n, size)
        stats = server.r.info("commandstats")
        layout.close()
        rows = sorted(stats.items(), key=lambda kv: -kv[1]["usec"])
        for name, v in rows:
            if name.startswith("cmdstat_config") or v["usec"] / n < 0.005:
                continue
            lines.append(f"| {kind} | {name[len('cmdstat_') :]} | {v['calls']:,} | {v['usec'] / n:.3f} |")
    server.r.flushall()
    return "\n".join(lines)


# -- report --------------------------------------------------------------------------

COLUMNS = [
    ("publish_rate", "publish_many(100) msg/s", "{:,.0f}"),
    ("consume_rate", "fetch(n)+ack msg/s", "{:,.0f}"),
    ("publish_us", "Redis us/msg publish", "{:.2f}"),
    ("fetch_us", "Redis us/msg fetch", "{:.2f}"),
    ("ack_us", "Redis us/msg ack", "{:.2f}"),
    ("consume_us", "Redis us/msg fetch+ack, timed loop", "{:.2f}"),
    ("client_us", "client CPU us/msg fetch+ack", "{:.2f}"),
    ("mem_queued", "B per queued msg", "{:.1f}"),
    ("mem_inflight", "B per msg in flight", "{:.1f}"),
]


def table(runs: dict[str, list[dict[str, float]]], size: int = BATCH, vs: str = "streams") -> str:
    """Each cell: the median of the runs [min–max], and (the median of the
    per-run ratios to ``vs``, Streams unless told): the layouts of one run
    met the same load, the runs did not."""
    kinds = list(runs)
    ref = runs[vs]
    lines = ["| figure | " + " | ".join(kinds) + " |", "|---|" + "---|" * len(kinds)]
    for key, label, fmt in COLUMNS:
        if not all(key in r for k in kinds for r in runs[k]):
            continue  # the memory figures, with --memory-messages 0
        label = label.replace("(n)", f"({size})")
        cells = []
        for k in kinds:
            values = [r[key] for r in runs[k]]
            cell = fmt.format(statistics.median(values))
            if k != vs and all(r[key] for r in ref):
                ratio = statistics.median(r[key] / s[key] for r, s in zip(runs[k], ref))
                cell += f" ({ratio:.2f}x)"
            if len(values) > 1:
                cell += f" <br>[{fmt.format(min(values))}–{fmt.format(max(values))}]"
            cells.append(cell)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--memory-messages", type=int, default=100_000)
    ap.add_argument("--layouts", default=",".join(LAYOUTS), help="names; stream_calls[_2rt]:E as the module says")
    ap.add_argument("--fetch-size", type=int, default=BATCH, help="n of the fetch(n)+ack loops (publish stays 100)")
    ap.add_argument("--vs", help="also print the per-run ratios to this layout (e.g. rqueue)")
    ap.add_argument(
        "--direct", action="store_true", help="Streams and the prototypes send on a connection of their own"
    )
    ap.add_argument(
        "--direct-prototypes",
        action="store_true",
        help="only the prototypes send on a connection of their own (as rqueue's client does), Streams via redis-py",
    )
    ap.add_argument("--ack-group", type=int, default=0, help="ack each fetch's deliveries G at a time (timed loop)")
    ap.add_argument("--shuffle-window", type=int, default=1, help="... in an order shuffled within windows of W")
    ap.add_argument("--json", help="write the runs and medians here")
    ap.add_argument("--check-only", action="store_true")
    ap.add_argument("--breakdown", action="store_true", help="also: Redis time per command of a fetch+ack loop")
    args = ap.parse_args()
    kinds = args.layouts.split(",")
    global DIRECT
    DIRECT = args.direct
    global DIRECT_PROTOTYPES, ACK_GROUP, SHUFFLE_WINDOW
    DIRECT_PROTOTYPES = args.direct_prototypes
    ACK_GROUP, SHUFFLE_WINDOW = args.ack_group, max(1, args.shuffle_window)
    server = Server()
    try:
        print(f"redis-server {server.version} on 127.0.0.1:{server.port} (pid {server.proc.pid})", file=sys.stderr)
        for line in check(server) + check_parked(server) + check_ranges(server) + check_spans(server):
            print("check:", line, file=sys.stderr)
        if args.check_only:
            return
        runs: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
        started = time.monotonic()
        for run in range(args.runs):
            one = measure_run(server, kinds, args.messages, args.memory_messages, run, args.fetch_size)
            for k in kinds:
                runs[k].append(one[k])
                print(f"[{time.monotonic() - started:6.1f}s] run {run + 1} {k}: {one[k]}", file=sys.stderr)
        medians = {
            k: {key: statistics.median(r[key] for r in runs[k]) for key, _, _ in COLUMNS if key in runs[k][0]}
            for k in kinds
        }
        print(
            f"\nMedians of {args.runs} runs [min–max]; in (), the median of the per-run ratios to streams; "
            f"{args.messages:,} messages per "
            f"throughput figure, {args.memory_messages:,} for memory, {PAYLOAD}-byte payloads, "
            f"redis-server {server.version}, ack_wait {ACK_WAIT_MS} ms, fetch({args.fetch_size})"
            f"{', direct calls' if args.direct else ''}"
            f"{', the prototypes direct' if args.direct_prototypes else ''}"
            f"{f', acks {ACK_GROUP} at a time, shuffled in windows of {SHUFFLE_WINDOW}' if ACK_GROUP else ''}.\n"
        )
        print(table(runs, args.fetch_size))
        if args.vs:
            print(f"\nThe same, with the per-run ratios to {args.vs}:\n")
            print(table(runs, args.fetch_size, args.vs))
        if args.breakdown:
            print("\n" + breakdown(server, kinds, args.messages, args.fetch_size))
        if args.json:
            with open(args.json, "w") as f:
                meta = {
                    "version": server.version,
                    "fetch_size": args.fetch_size,
                    "messages": args.messages,
                    "direct": args.direct,
                }
                json.dump({**meta, "runs": runs, "medians": medians}, f, indent=1)
    finally:
        server.stop()


if __name__ == "__main__":
    main()

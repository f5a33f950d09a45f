"""Storage-layout prototypes of issue 24, measured against raw Streams and the
current rqueue in one run on a private redis-server (docs/storage-prototypes.md).

usage: PYTHONPATH=. python benchmarks/prototypes/bench.py [--runs 3] [--messages 20000]
           [--memory-messages 100000] [--json FILE] [--check-only]

Starts redis-server on a free loopback port (never 6379) in a temp dir without
persistence, checks the prototypes' semantics (--check-only stops there), then
per run and layout, in turns: publish_many(100) msg/s, fetch(100)+ack(list)
msg/s, Redis CPU per message of publish / fetch / ack (INFO commandstats usec,
fetch and ack in a pass of their own with the counters read between calls),
used_memory per queued message and per message in flight. Prints the medians
and the ratios to Streams; stops the server by its PID.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import redis
from layouts import ACK_WAIT_MS, LAYOUTS, Layout, Scripted, StreamCalls, StreamCallsClaim, StreamPel, WideHash

BATCH = 100
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
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir, "--save", "",
             "--appendonly", "no", "--logfile", os.path.join(self.dir, "redis.log")],  # fmt: skip
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


def fresh(server: Server, kind: str, label: str) -> Layout:
    server.r.flushall()
    layout = LAYOUTS[kind](server.r, server.url, f"q-{label}")
    layout.join()
    return layout


def drain(layout: Layout, n: int) -> None:
    done = 0
    while done < n:
        ds = layout.fetch(BATCH)
        if not ds:
            raise RuntimeError(f"{layout.name}: fetch came back empty after {done} of {n}")
        layout.ack(ds)
        done += len(ds)


def measure(server: Server, kind: str, n: int, mem_n: int, run: int) -> dict[str, float]:
    r = server.r
    out: dict[str, float] = {}
    layout = fresh(server, kind, f"{run}")
    # publish_many(100), timed, and its Redis CPU
    u0, t0 = usec(r, layout.publish_cmds), time.perf_counter()
    for start in range(0, n, BATCH):
        layout.publish_many(payloads(start, BATCH))
    out["publish_rate"] = n / (time.perf_counter() - t0)
    out["publish_us"] = (usec(r, layout.publish_cmds) - u0) / n
    # fetch(100)+ack(list) of those n, timed
    c0, t0 = time.process_time(), time.perf_counter()
    drain(layout, n)
    out["consume_rate"] = n / (time.perf_counter() - t0)
    out["client_us"] = (time.process_time() - c0) / n * 1e6
    # fetch and ack apart: counters read between the calls (untimed)
    for start in range(0, n, FILL):
        layout.publish_many(payloads(start, FILL))
    fetch_us = ack_us = 0
    done = 0
    while done < n:
        a = usec(r, layout.fetch_cmds)
        ds = layout.fetch(BATCH)
        b = usec(r, layout.fetch_cmds)
        b_ack = usec(r, layout.ack_cmds)
        layout.ack(ds)
        c = usec(r, layout.ack_cmds)
        fetch_us += b - a
        ack_us += c - b_ack
        done += len(ds)
    out["fetch_us"], out["ack_us"] = fetch_us / n, ack_us / n
    layout.close()
    # memory: mem_n queued, then the same held in flight by one consumer
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
    out["mem_queued"] = (m1 - m0) / mem_n
    out["mem_inflight"] = (m2 - m1) / mem_n
    layout.close()
    r.flushall()
    return out


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
            assert r.hlen(layout.fetch_keys[3]) == 0 and r.hlen(layout.fetch_keys[4]) == 0, r.hgetall(layout.fetch_keys[4])
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


# -- report --------------------------------------------------------------------------

COLUMNS = [
    ("publish_rate", "publish_many(100) msg/s", "{:,.0f}"),
    ("consume_rate", "fetch(100)+ack msg/s", "{:,.0f}"),
    ("publish_us", "Redis us/msg publish", "{:.2f}"),
    ("fetch_us", "Redis us/msg fetch", "{:.2f}"),
    ("ack_us", "Redis us/msg ack", "{:.2f}"),
    ("client_us", "client CPU us/msg fetch+ack", "{:.2f}"),
    ("mem_queued", "B per queued msg", "{:.1f}"),
    ("mem_inflight", "B per msg in flight", "{:.1f}"),
]


def table(medians: dict[str, dict[str, float]], spans: dict[str, dict[str, tuple[float, float]]]) -> str:
    kinds = list(medians)
    ref = medians["streams"]
    lines = ["| figure | " + " | ".join(kinds) + " |", "|---|" + "---|" * len(kinds)]
    for key, label, fmt in COLUMNS:
        cells = []
        for k in kinds:
            v = medians[k][key]
            lo, hi = spans[k][key]
            cell = fmt.format(v)
            if k != "streams" and ref[key]:
                cell += f" ({v / ref[key]:.2f}x)"
            cell += f" <br>[{fmt.format(lo)}–{fmt.format(hi)}]"
            cells.append(cell)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--memory-messages", type=int, default=100_000)
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--json", help="write the runs and medians here")
    ap.add_argument("--check-only", action="store_true")
    args = ap.parse_args()
    kinds = args.layouts.split(",")
    server = Server()
    try:
        print(f"redis-server {server.version} on 127.0.0.1:{server.port} (pid {server.proc.pid})", file=sys.stderr)
        for line in check(server):
            print("check:", line, file=sys.stderr)
        if args.check_only:
            return
        runs: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
        started = time.monotonic()
        for run in range(args.runs):
            # the order turns each run, so that no layout always goes first
            for k in kinds[run % len(kinds) :] + kinds[: run % len(kinds)]:
                runs[k].append(measure(server, k, args.messages, args.memory_messages, run))
                print(f"[{time.monotonic() - started:6.1f}s] run {run + 1} {k}: {runs[k][-1]}", file=sys.stderr)
        medians = {k: {key: statistics.median(r[key] for r in runs[k]) for key, _, _ in COLUMNS} for k in kinds}
        spans = {
            k: {key: (min(r[key] for r in runs[k]), max(r[key] for r in runs[k])) for key, _, _ in COLUMNS}
            for k in kinds
        }
        print(
            f"\nMedians of {args.runs} runs [min–max], ratio to streams in (); {args.messages:,} messages per "
            f"throughput figure, {args.memory_messages:,} for memory, {PAYLOAD}-byte payloads, "
            f"redis-server {server.version}, ack_wait {ACK_WAIT_MS} ms.\n"
        )
        print(table(medians, spans))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"version": server.version, "runs": runs, "medians": medians}, f, indent=1)
    finally:
        server.stop()


if __name__ == "__main__":
    main()

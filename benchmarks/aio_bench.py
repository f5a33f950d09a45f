"""rqueue.aio beside the sync client, in one run on one private server.

usage: .venv/bin/python benchmarks/aio_bench.py [--messages N] [--runs R] [--url URL] [--json]

Without --url a private redis-server (or valkey-server) is started on a
free loopback port, without persistence, and stopped at the end.

Figures (100-byte payloads), each as the cost of one message: wall-clock
microseconds (one call in flight at a time, so this is latency plus client
work) and client CPU microseconds (time.process_time: what the client
itself spends, which a loaded machine inflates less):

  publish_single   q.publish(payload), one message a call
  publish_batch    q.publish_many(100 payloads)
  fetch_ack_single c.fetch(1) then c.ack(d)                      (queue preloaded)
  fetch_ack_batch  c.fetch(100) then c.ack(list)                 (queue preloaded)
  worker_noop      a worker with a no-op handler, 8 handlers, until the queue is empty:
                   rqueue.Worker (threads) beside rqueue.aio.Worker (tasks)
  round_trip_floor redis-py alone: PING on one connection, sync beside asyncio (what
                   asyncio itself adds to a round trip here: the single-message
                   figures cannot come closer than this)

and, for the asyncio client alone, publish_concurrent: 50 tasks publishing
at once on one loop (what a service gains from not blocking).

The sync and async figures of each run are measured back to back, the order
alternating between runs, and the median over --runs is reported with the
ratio async / sync of the cost per message (target: at most 1.2).
arq (an asyncio job queue on Redis) is measured beside them when it is
installed: enqueue_job one a call, and its worker's no-op rate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import rqueue
import rqueue.aio
from rqueue.embedded import EmbeddedServer

PAYLOAD = b"x" * 100
BATCH = 100
TARGET = 1.2


class Cost:
    """Wall and CPU microseconds per message of one measurement."""

    def __init__(self, wall: float, cpu: float, n: int) -> None:
        self.wall = wall * 1e6 / n
        self.cpu = cpu * 1e6 / n


def timed_sync(n: int, body: Callable[[], None]) -> Cost:
    w, c = time.perf_counter(), time.process_time()
    body()
    return Cost(time.perf_counter() - w, time.process_time() - c, n)


async def timed_async(n: int, body: Callable[[], Awaitable[None]]) -> Cost:
    w, c = time.perf_counter(), time.process_time()
    await body()
    return Cost(time.perf_counter() - w, time.process_time() - c, n)


# -- the figures, sync -----------------------------------------------------------------


def sync_figures(url: str, n: int) -> dict[str, Cost]:
    prefix = f"aiobench-{uuid.uuid4().hex[:8]}"
    client = rqueue.connect(url, prefix=prefix)
    out: dict[str, Cost] = {}
    try:
        q = client.queue("single")
        q.publish(PAYLOAD)  # warm: scripts loaded, connection open
        out["publish_single"] = timed_sync(n, lambda: [q.publish(PAYLOAD) for _ in range(n)] and None)
        qb = client.queue("batch")
        out["publish_batch"] = timed_sync(
            n, lambda: [qb.publish_many([PAYLOAD] * BATCH) for _ in range(n // BATCH)] and None
        )
        with q.consumer("g") as c:

            def one_by_one() -> None:
                for _ in range(n):
                    [d] = c.fetch(1)
                    c.ack(d)

            q.purge("g")  # what publish_single left
            q.publish_many([PAYLOAD] * n)
            out["fetch_ack_single"] = timed_sync(n, one_by_one)
        with qb.consumer("g") as c:

            def batches() -> None:
                for _ in range(n // BATCH):
                    c.ack(c.fetch(BATCH))

            qb.purge("g")
            qb.publish_many([PAYLOAD] * n)
            out["fetch_ack_batch"] = timed_sync(n, batches)
        qw = client.queue("worker")
        qw.publish_many([PAYLOAD] * n)
        w = rqueue.Worker(qw, "w", lambda d: None, concurrency=8)

        def work() -> None:
            w.start()
            while w.stats.acked < n:
                time.sleep(0.005)
            w.stop()
            w.join(30)

        out["worker_noop"] = timed_sync(n, work)
        for name in ("single", "batch", "worker"):
            client.queue(name).delete(force=True)
    finally:
        client.close()
    return out


# -- the figures, async ----------------------------------------------------------------


async def async_figures(url: str, n: int) -> dict[str, Cost]:
    prefix = f"aiobench-{uuid.uuid4().hex[:8]}"
    client = await rqueue.aio.connect(url, prefix=prefix)
    sync = rqueue.connect(url, prefix=prefix)  # deleting the queues afterwards
    out: dict[str, Cost] = {}
    try:
        q = client.queue("single")
        await q.publish(PAYLOAD)

        async def singles() -> None:
            for _ in range(n):
                await q.publish(PAYLOAD)

        out["publish_single"] = await timed_async(n, singles)
        qb = client.queue("batch")

        async def publish_batches() -> None:
            for _ in range(n // BATCH):
                await qb.publish_many([PAYLOAD] * BATCH)

        out["publish_batch"] = await timed_async(n, publish_batches)

        async def concurrent() -> None:
            per = n // 50

            async def one() -> None:
                for _ in range(per):
                    await q.publish(PAYLOAD)

            await asyncio.gather(*(one() for _ in range(50)))

        out["publish_concurrent"] = await timed_async(n // 50 * 50, concurrent)
        async with q.consumer("g") as c:
            await q.purge("g")  # what the publish figures left
            await q.publish_many([PAYLOAD] * n)

            async def one_by_one() -> None:
                for _ in range(n):
                    [d] = await c.fetch(1)
                    await c.ack(d)

            out["fetch_ack_single"] = await timed_async(n, one_by_one)
        async with qb.consumer("g") as c:
            await qb.purge("g")
            await qb.publish_many([PAYLOAD] * n)

            async def batches() -> None:
                for _ in range(n // BATCH):
                    await c.ack(await c.fetch(BATCH))

            out["fetch_ack_batch"] = await timed_async(n, batches)
        qw = client.queue("worker")
        await qw.publish_many([PAYLOAD] * n)

        async def noop(d: Any) -> None:
            return None

        w = rqueue.aio.Worker(qw, "w", noop, concurrency=8)

        async def work() -> None:
            task = asyncio.create_task(w.run(install_signal_handlers=False))
            while w.stats.acked < n:
                await asyncio.sleep(0.005)
            w.stop()
            await task

        out["worker_noop"] = await timed_async(n, work)
    finally:
        for name in ("single", "batch", "worker"):
            sync.queue(name).delete(force=True)
        sync.close()
        await client.close()
    return out


# -- the floor: one round trip of redis-py's own connections ------------------------------


def floor_figures(url: str, n: int) -> tuple[Cost, Cost]:
    """PING on one connection, sent packed and read back: redis-py's sync
    connection and its asyncio one, no rqueue code. The ratio is what
    asyncio itself costs per round trip on this machine."""
    import redis
    import redis.asyncio as aioredis
    from hiredis import pack_command

    ping = pack_command(("PING",))
    r = redis.Redis.from_url(url)
    conn = r.connection_pool.get_connection()

    def sync_loop() -> None:
        for _ in range(n):
            conn.send_packed_command([ping])
            conn.read_response()

    sync = timed_sync(n, sync_loop)
    r.connection_pool.release(conn)
    r.close()

    async def async_floor() -> Cost:
        ar = aioredis.Redis.from_url(url)
        aconn = await ar.connection_pool.get_connection()

        async def loop() -> None:
            for _ in range(n):
                await aconn.send_packed_command([ping], check_health=False)
                await aconn.read_response()

        cost = await timed_async(n, loop)
        await ar.connection_pool.release(aconn)
        await ar.aclose()
        return cost

    return sync, asyncio.run(async_floor())


# -- arq, when installed ----------------------------------------------------------------


def arq_figures(url: str, n: int) -> dict[str, Cost] | None:
    try:
        from arq import create_pool
        from arq.connections import RedisSettings
        from arq.worker import Worker as ArqWorker
        from arq.worker import func
    except ImportError:
        return None
    logging.getLogger("arq").setLevel(logging.WARNING)

    async def noop(ctx: Any, payload: bytes) -> None:
        return None

    async def main() -> dict[str, Cost]:
        settings = RedisSettings.from_dsn(url)
        name = f"arqbench-{uuid.uuid4().hex[:8]}"
        pool = await create_pool(settings, default_queue_name=name)
        out: dict[str, Cost] = {}

        async def enqueue() -> None:
            for _ in range(n):
                await pool.enqueue_job("noop", PAYLOAD)

        out["publish_single"] = await timed_async(n, enqueue)
        worker = ArqWorker(
            functions=[func(noop, name="noop")],
            redis_pool=pool,
            queue_name=name,
            burst=True,
            max_jobs=8,
            keep_result=0,
            poll_delay=0.01,
        )
        out["worker_noop"] = await timed_async(n, worker.main)
        await worker.close()
        await pool.aclose()
        return out

    return asyncio.run(main())


# -- the report --------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", "-n", type=int, default=5000)
    parser.add_argument("--runs", "-r", type=int, default=3)
    parser.add_argument("--url")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    n = max(BATCH, args.messages // BATCH * BATCH)
    server = None if args.url else EmbeddedServer().start()
    url = args.url or server.url  # type: ignore[union-attr]
    runs: list[tuple[dict[str, Cost], dict[str, Cost], dict[str, Cost] | None]] = []
    try:
        for i in range(args.runs):
            print(f"run {i + 1}/{args.runs}", file=sys.stderr)
            if i % 2 == 0:
                s = sync_figures(url, n)
                a = asyncio.run(async_figures(url, n))
            else:
                a = asyncio.run(async_figures(url, n))
                s = sync_figures(url, n)
            fs, fa = floor_figures(url, n)
            s["round_trip_floor"], a["round_trip_floor"] = fs, fa
            runs.append((s, a, arq_figures(url, n)))
    finally:
        if server is not None:
            server.stop()

    def median(which: int, name: str, field: str) -> float | None:
        values = [getattr(r[which][name], field) for r in runs if r[which] is not None and name in r[which]]  # type: ignore[index, operator]
        return statistics.median(values) if values else None

    rows = []
    figures = ("round_trip_floor", "publish_single", "publish_batch")
    figures += ("fetch_ack_single", "fetch_ack_batch", "worker_noop")
    for name in figures:
        row: dict[str, Any] = {"figure": name}
        for field in ("wall", "cpu"):
            s, a = median(0, name, field), median(1, name, field)
            row[f"sync_{field}_us"], row[f"async_{field}_us"] = s, a
            row[f"ratio_{field}"] = a / s if s and a else None
        row["arq_wall_us"] = median(2, name, "wall")
        rows.append(row)
    concurrent = median(1, "publish_concurrent", "wall")
    if args.json:
        print(
            json.dumps({"messages": n, "runs": args.runs, "rows": rows, "async_publish_concurrent_wall_us": concurrent})
        )
        return
    print(f"rqueue.aio beside the sync client: {n} messages of 100 bytes, median of {args.runs} runs, µs per message")
    heads = ("sync wall", "async wall", "ratio", "sync cpu", "async cpu", "ratio", "met", "arq wall")
    print(f"{'figure':18} " + " ".join(f"{h:>{w}}" for h, w in zip(heads, (10, 11, 6, 9, 10, 6, 4, 9))))
    for row in rows:
        met = "yes" if row["ratio_wall"] is not None and row["ratio_wall"] <= TARGET else "NO"
        met = "-" if row["figure"] == "round_trip_floor" else met
        arq = f"{row['arq_wall_us']:9.1f}" if row["arq_wall_us"] is not None else f"{'-':>9}"
        print(
            f"{row['figure']:18} {row['sync_wall_us']:10.1f} {row['async_wall_us']:11.1f} {row['ratio_wall']:6.2f}"
            f" {row['sync_cpu_us']:9.1f} {row['async_cpu_us']:10.1f} {row['ratio_cpu']:6.2f} {met:>4} {arq}"
        )
    print(f"async publish, 50 tasks at once on one loop: {concurrent:.1f} µs per message (wall)")
    print("round_trip_floor: redis-py's own connections, no rqueue (not held to the target)")
    print(f"target: async cost per message within {TARGET}x of the sync client's (wall ratio)")


if __name__ == "__main__":
    main()

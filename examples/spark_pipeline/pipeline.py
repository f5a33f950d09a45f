"""A Spark pipeline feeding rqueue, and a worker consuming it.

    JSON order events in files  ->  Spark Structured Streaming (file source)
      ->  transformation (drop test orders, amounts in cents, a priority header)
      ->  rqueue.spark.sink (exactly once)  ->  queue orders.enriched
      ->  rqueue.Worker running worker.handle  ->  per-user totals
      ->  refunds dead-lettered  ->  rqueue.spark.read_dead_letters

Run from the repository root (needs Java 17):

    python3 -m venv .venv && .venv/bin/pip install -q -e '.[spark,embedded]'
    .venv/bin/python examples/spark_pipeline/pipeline.py

Without --url (or RQUEUE_URL) a private embedded server is started for the
run. The pipeline also shows exactly once: it replays its last micro-batch,
as Spark does after a crash between the sink and the batch's commit, and the
sink publishes nothing new.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # worker.py beside this file

import worker  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

import rqueue  # noqa: E402
import rqueue.spark  # noqa: E402
from rqueue.embedded import EmbeddedServer  # noqa: E402

QUEUE = "orders.enriched"
GROUP = "billing"
SCHEMA = "order_id string, user string, amount double, status string, ts timestamp"


def write_events(inbox: Path, files: int, per_file: int, seed: int = 7) -> list[dict]:
    """``files`` JSON-lines files of order events; returns the events."""
    rng = random.Random(seed)
    events = []
    for f in range(files):
        batch = [
            {
                "order_id": f"o-{f:03d}-{i:05d}",
                "user": f"user{rng.randrange(20)}",
                "amount": round(rng.uniform(1, 1000), 2),
                "status": rng.choices(["paid", "refunded", "test"], weights=[85, 5, 10])[0],
                "ts": f"2025-01-01T00:{f % 60:02d}:{i % 60:02d}",
            }
            for i in range(per_file)
        ]
        tmp = inbox.parent / f".events-{f:03d}.json"
        tmp.write_text("".join(json.dumps(e) + "\n" for e in batch))
        tmp.rename(inbox / f"events-{f:03d}.json")  # the file source never sees a half-written file
        events += batch
    return events


def run_stream(spark, inbox: Path, checkpoint: Path, sink) -> None:
    """One availableNow run of the streaming query: every new file, one micro-batch per file, then stop."""
    from pyspark.sql import functions as F

    orders = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(inbox))
    enriched = (
        orders.where(F.col("status") != "test")
        .withColumn("amount_cents", F.round(F.col("amount") * 100).cast("long"))
        .withColumn("priority", F.when(F.col("amount") >= 500, "high").otherwise("normal"))
        .select(
            "order_id",
            "priority",
            F.to_json(F.struct("order_id", "user", "amount_cents", "status", "ts")).alias("value"),
        )
    )
    query = (
        enriched.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()  # ends by itself once the files are done: never stopped mid-batch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--url",
        default=os.environ.get("RQUEUE_URL"),
        help="Redis URL [default: $RQUEUE_URL, else a private embedded server]",
    )
    parser.add_argument("--files", type=int, default=4, help="input files, one micro-batch each")
    parser.add_argument("--per-file", type=int, default=500, help="events per file")
    parser.add_argument(
        "--prefix",
        default=f"example-{int(time.time())}",
        help="key prefix [default: example-<time>, a fresh key space for each run]",
    )
    parser.add_argument("--workdir", type=Path, default=None, help="input files and checkpoint [default: a temp dir]")
    args = parser.parse_args(argv)

    # Spark's Python workers must run this interpreter, where rqueue is installed.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    server = None
    if args.url is None:
        server = EmbeddedServer().start()
        args.url = server.url
        print(f"started a private server at {server.url} (it is stopped at the end)")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="rqueue-spark-example-"))
    inbox, checkpoint = workdir / "inbox", workdir / "checkpoint"
    inbox.mkdir(parents=True, exist_ok=True)
    prefix = args.prefix
    spark = (
        # local[2,2]: two cores, and a failed task is tried twice, as on a cluster (plain local[2] never
        # retries a task, so a retry's exactly-once would never be exercised here).
        SparkSession.builder.master("local[2,2]")
        .appName("rqueue-spark-example")
        .config("spark.driver.memory", "512m")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    client = rqueue.connect(args.url, prefix=prefix)
    try:
        events = write_events(inbox, args.files, args.per_file)
        wanted = [e for e in events if e["status"] != "test"]
        print(f"key prefix {prefix!r}")
        print(f"wrote {len(events)} events in {args.files} files to {inbox} ({len(wanted)} not test orders)")

        # The consumer: a worker in this process (it could as well be `rqueue worker worker:handle ...`).
        w = rqueue.Worker(client.queue(QUEUE), GROUP, worker.handle, concurrency=4)
        w.start()

        # The producer: the streaming query, with the sink remembering what each batch stored for a day
        # (the window must outlast the time a failed query may take to be restarted), a bad row named by
        # its order_id.
        sink = rqueue.spark.sink(
            args.url,
            QUEUE,
            value_col="value",
            header_cols=["priority"],
            prefix=prefix,
            dedup_window=86400,
            batch_size=500,
            label_col="order_id",
        )
        started = time.monotonic()
        run_stream(spark, inbox, checkpoint, sink)
        print(
            f"streamed {len(wanted)} orders into {QUEUE} in {time.monotonic() - started:.1f} s; "
            f"last micro-batch: {sink.last}"
        )

        # Exactly once: forget that the last batch was committed (as if the driver had died right after the sink)
        # and run the query again: Spark replays that batch with the same batch_id, the sink adds nothing.
        last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
        for name in (str(last), f".{last}.crc"):
            (checkpoint / "commits" / name).unlink(missing_ok=True)
        run_stream(spark, inbox, checkpoint, sink)
        print(f"replayed micro-batch {last}: {sink.last.published} published, {sink.last.duplicates} duplicates")

        deadline = time.monotonic() + 60
        while worker.handled < len(wanted) and time.monotonic() < deadline:
            time.sleep(0.1)
        w.stop()
        w.join(30)
        print(
            f"worker handled {worker.handled} messages ({worker.high_priority} high priority), "
            f"acked {w.stats.acked}, dead-lettered {w.stats.dead_lettered}"
        )
        expected = {}
        for e in wanted:
            if e["status"] == "paid":
                expected[e["user"]] = expected.get(e["user"], 0) + round(e["amount"] * 100)
        print("top users by paid cents:", ", ".join(f"{u}={c}" for u, c in worker.totals.most_common(3)))

        # The refunds the worker rejected, back in Spark for analysis.
        dead = rqueue.spark.read_dead_letters(spark, args.url, QUEUE, prefix=prefix)
        print("dead letters by reason:")
        dead.groupBy("reason", "error").count().show(truncate=False)

        once = dict(worker.seen) == {e["order_id"]: 1 for e in wanted}
        ok = once and dict(worker.totals) == expected and sink.last.published == 0
        print("every order arrived exactly once" if ok else "MISMATCH: see the figures above")
        return 0 if ok else 1
    finally:
        client.close()
        spark.stop()
        if server is not None:
            server.stop()
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

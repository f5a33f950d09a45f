"""A Spark driver for tests/test_spark_e2e.py, run as its own process so that
the test can kill it (SIGKILL) mid-batch and start it again.

Two streaming queries, both through format("rqueue"), on local[2,4] (a
failed task is tried up to four times):

- files -> "raw" (partitioned in 2): JSON files of events, a Python UDF that fails once (the
  first time it meets event 7), to_json, the rqueue writer;
- "raw" (group "spark") -> "out": the rqueue source, a Python UDF that
  fails once (the first time it meets event 11) and shapes each message,
  the rqueue writer.

It runs until "out" holds ``expected`` messages and neither query has new
input, then exits 0. Markers of the one-time failures live in ``work``.

    python spark_pipeline_driver.py URL PREFIX WORK EXPECTED
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def fail_once(marker: Path, text: str, event: int, at: int) -> None:
    if event == at and not marker.exists():
        marker.touch()
        raise RuntimeError(f"injected failure ({text}), first attempt only")


def main() -> int:
    url, prefix, work, expected = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import rqueue
    import rqueue.spark as rs

    spark = (
        SparkSession.builder.master("local[2,4]")
        .appName("rqueue-e2e")
        .config("spark.driver.memory", "512m")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    rs.register(spark)
    sink_marker, source_marker = work / "sink-failed", work / "source-failed"
    with rqueue.connect(url, prefix=prefix) as admin:
        admin.queue("raw", partitions=2)

    def first_leg(event_id: int, user: str) -> str:
        fail_once(sink_marker, "before the sink", event_id, 7)
        return json.dumps({"id": event_id, "user": user}, separators=(",", ":"))

    def second_leg(value: bytes) -> str:
        event = json.loads(value)
        fail_once(source_marker, "after the source", event["id"], 11)
        return f"{event['id']}:{event['user'].upper()}"

    files = spark.readStream.schema("event_id long, user string").option("maxFilesPerTrigger", 1).json(str(work / "in"))
    to_raw = (
        files.select(F.udf(first_leg, "string")("event_id", "user").alias("value"))
        .writeStream.format("rqueue")
        .option("url", url)
        .option("prefix", prefix)
        .option("queue", "raw")
        .option("dedup_window", 86400)
        .option("checkpointLocation", str(work / "ck-raw"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    raw = (
        spark.readStream.format("rqueue")
        .option("url", url)
        .option("prefix", prefix)
        .option("queue", "raw")
        .option("group", "spark")
        .option("max_rows_per_batch", 10)
        .load()
    )
    to_out = (
        raw.select(F.udf(second_leg, "string")("value").alias("value"))
        .writeStream.format("rqueue")
        .option("url", url)
        .option("prefix", prefix)
        .option("queue", "out")
        .option("dedup_window", 86400)
        .option("checkpointLocation", str(work / "ck-out"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    client = rqueue.connect(url, prefix=prefix)
    out = client.queue("out")
    idle = 0
    while idle < 3:
        for query in (to_raw, to_out):
            if query.exception() is not None:
                print(query.exception(), file=sys.stderr)
                return 1
        busy = any(q.status["isDataAvailable"] or q.status["isTriggerActive"] for q in (to_raw, to_out))
        idle = idle + 1 if out.stats().last_seq >= expected and not busy else 0
        time.sleep(0.5)
    to_raw.stop()
    to_out.stop()
    client.close()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

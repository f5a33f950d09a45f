"""What a write did, kept in Redis for the driver that started it: Spark
runs a data source's commit in a Python worker of its own, so the figures
of the tasks reach :func:`rqueue.spark.publish_dataframe` and the
foreachBatch sink through a small expiring hash per run."""

from __future__ import annotations

from ..client import connect
from ..engine import commands
from ..engine.keys import QueueKeys, queue_base
from .options import WritePlan

REPORT_TTL_MS = 3_600_000  # a report is read right after its write: an hour is plenty


def report_key(plan: WritePlan, run: str) -> str:
    return QueueKeys(queue_base(plan.prefix, plan.queue, 0)).tracker(f"{run}:report")


def save_report(plan: WritePlan, run: str, rows: int, published: int, duplicates: int, tasks: int) -> None:
    with connect(plan.url, prefix=plan.prefix) as client:
        fields: dict[str, int | str] = {
            "rows": rows,
            "published": published,
            "duplicates": duplicates,
            "tasks": tasks,
        }
        commands.save_report(client.redis, report_key(plan, run), fields, REPORT_TTL_MS)


def load_report(plan: WritePlan, run: str) -> dict[str, int]:
    with connect(plan.url, prefix=plan.prefix) as client:
        return {k: int(v) for k, v in commands.load_report(client.redis, report_key(plan, run)).items()}

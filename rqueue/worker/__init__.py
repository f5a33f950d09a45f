"""The worker runtime: runs a handler for every message of a group."""

from .partitioned import PartitionedWorker
from .runtime import Worker, WorkerStats

__all__ = ["PartitionedWorker", "Worker", "WorkerStats"]

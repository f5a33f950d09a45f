"""The worker runtime: runs a handler for every message of a group.

:class:`Worker` is the control class; its dispatcher, handler threads and
heartbeat each have a module, and share what they hold through a
:class:`~rqueue.worker.ledger.Ledger`. docs/worker.md describes the design.
"""

from .batch import Acked, BatchHandler, batch_handler
from .control import PartitionedWorker, Worker, worker_for
from .outcome import Outcome
from .processes import InProcess
from .reconnect import TRANSIENT
from .stats import WorkerStats

__all__ = [
    "TRANSIENT",
    "Acked",
    "BatchHandler",
    "InProcess",
    "Outcome",
    "PartitionedWorker",
    "Worker",
    "WorkerStats",
    "batch_handler",
    "worker_for",
]

"""The worker of a partitioned queue: one worker per partition under one
consumer name."""

from __future__ import annotations

import dataclasses
import signal
import threading
from typing import Any

from .. import constants as C
from ..errors import InvalidInput
from ..ids import consumer_name
from ..partitions import PartitionedQueue
from .runtime import Worker, WorkerStats


class PartitionedWorker:
    """The worker of a partitioned queue: one :class:`rqueue.Worker` per
    partition, all under one consumer name, sharing the ``concurrency``
    handler threads between them (each partition gets at least one).
    ``rqueue.Worker(partitioned_queue, ...)`` makes one; it takes the same
    arguments and is run and stopped the same way. ``prefetch`` holds per
    partition, as a consumer's does (default: twice each partition's
    threads)."""

    def __init__(
        self,
        queue: PartitionedQueue,
        group: str,
        handler: Any,
        *,
        concurrency: int = C.DEFAULT_CONCURRENCY,
        name: str | None = None,
        **options: Any,
    ) -> None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise InvalidInput(f"concurrency must be a whole number >= 1, not {concurrency!r}")
        n = queue.partitions
        shares = [max(1, concurrency // n + (1 if i < concurrency % n else 0)) for i in range(n)]
        name = name if name is not None else consumer_name(queue.client.randomness)
        self.queue = queue
        self.group = group
        self.name = name
        self.concurrency = sum(shares)
        #: One worker per partition (``workers[i].queue.partition == i``).
        self.workers = [
            Worker(part, group, handler, concurrency=share, name=name, **options)
            for part, share in zip(queue.parts, shares)
        ]
        self._errors: list[BaseException] = []
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._background: threading.Thread | None = None

    @property
    def stats(self) -> Any:
        """The counters of every partition's worker, added up."""
        total = WorkerStats()
        for w in self.workers:
            for f in dataclasses.fields(WorkerStats):
                setattr(total, f.name, getattr(total, f.name) + getattr(w.stats, f.name))
        return total

    def run(self, install_signal_handlers: bool = True) -> Any:
        """Works until stopped (as :meth:`rqueue.Worker.run`); returns the
        added-up counters. When one partition's worker fails (Redis stayed
        unreachable), the others stop too and its error is raised."""
        if install_signal_handlers and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self._on_signal)
        threads = [
            threading.Thread(target=self._run_one, args=(w,), name=f"rqueue-worker-{w.queue.partition}")
            for w in self.workers
        ]
        try:
            for t in threads:
                t.start()
            while any(t.is_alive() for t in threads):
                for t in threads:
                    t.join(0.2)  # short joins keep the main thread responsive to signals
        finally:
            self._stopped.set()
        if self._errors:
            raise self._errors[0]
        return self.stats

    def _run_one(self, worker: Any) -> None:
        try:
            worker.run(install_signal_handlers=False)
        except BaseException as exc:
            self._errors.append(exc)
            self.stop()

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.stop(now=self._stopping.is_set())

    def start(self) -> None:
        """Runs the workers in the background (no signal handlers)."""
        self._background = threading.Thread(
            target=self.run, kwargs={"install_signal_handlers": False}, name="rqueue-partitioned-worker"
        )
        self._background.start()

    def stop(self, now: bool = False) -> None:
        """Stops every partition's worker (see :meth:`rqueue.Worker.stop`)."""
        self._stopping.set()
        for w in self.workers:
            w.stop(now=now)

    def join(self, timeout: float | None = None) -> bool:
        """Waits for a worker started with :meth:`start` to end; True if it did."""
        return self._stopped.wait(timeout)

"""What every figure uses: fresh queues and streams under the bench's
prefix, filling them, timing rqueue and Streams in turns, recording the
values, and deleting the keys afterwards; and the progress lines."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import click
import redis

import rqueue
from rqueue.cli.bench.spec import (
    FILL_BATCH,
    GROUP,
    INTERLEAVE_CHUNKS,
    STREAM_FIELD,
    BenchError,
    Config,
    Series,
    noop,
    payload,
)


class Progress:
    """One line per step on stderr; rewritten in place on a terminal."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.tty = enabled and sys.stderr.isatty()
        self.start = time.monotonic()
        self._width = 0

    def step(self, text: str) -> None:
        if not self.enabled:
            return
        line = f"[{time.monotonic() - self.start:6.1f}s] {text}"
        if self.tty:
            pad = max(0, self._width - len(line))
            sys.stderr.write("\r" + line + " " * pad)
            sys.stderr.flush()
            self._width = len(line)
        else:
            click.echo(line, err=True)

    def done(self, text: str) -> None:
        if not self.enabled:
            return
        if self.tty:
            sys.stderr.write("\r" + " " * self._width + "\r")
            self._width = 0
        click.echo(f"[{time.monotonic() - self.start:6.1f}s] {text}", err=True)


def fresh_queue(client: rqueue.Client, name: str) -> rqueue.Queue:
    """Queue ``name``, never used before, so never partitioned."""
    q = client.queue(name)
    if not isinstance(q, rqueue.Queue):
        raise BenchError(f"queue {name!r} is partitioned: the bench needs queues of its own")
    return q


class BenchBase:
    """The plumbing of :class:`rqueue.cli.bench.runner.Bench`, shared by the
    figure groups (one class each, mixed into Bench)."""

    def __init__(self, client: rqueue.Client, url: str, config: Config, progress: Progress) -> None:
        self.client = client
        self.url = url  # unmasked: handed to the consumer processes
        self.prefix = client.prefix
        self.config = config
        self.progress = progress
        self.r = redis.Redis.from_url(url, socket_connect_timeout=5)
        self.series: dict[str, Series] = {}
        self.notes: list[str] = []
        self.errors: list[str] = []
        self._counter = 0
        self._resetstat_ok: bool | None = None

    def _name(self, what: str) -> str:
        self._counter += 1
        return f"{what}.{self._counter}"

    def queue(self, what: str) -> rqueue.Queue:
        """A queue never used before."""
        return fresh_queue(self.client, self._name(what))

    def stream(self, what: str, group: bool = True) -> str:
        """A stream key never used before (with the consumer group created)."""
        key = f"{self.prefix}:stream:{self._name(what)}"
        if group:
            self.r.xgroup_create(key, GROUP, id="0", mkstream=True)
        return key

    def cleanup(self) -> int:
        """Deletes every key under the bench prefix."""
        deleted = 0
        batch: list[bytes] = []
        pattern = _glob_escape(self.prefix) + ":*"
        for key in self.r.scan_iter(match=pattern, count=1000):
            batch.append(key)
            if len(batch) >= 500:
                deleted += self.r.unlink(*batch)
                batch = []
        if batch:
            deleted += self.r.unlink(*batch)
        self.wait_lazyfree()
        return deleted

    def wait_lazyfree(self, limit: float = 60.0) -> dict[str, Any]:
        """Waits until the server has freed what UNLINK handed to its
        background thread (it would compete with the next figure for CPU and
        skew used_memory); returns INFO memory."""
        deadline = time.monotonic() + limit
        while True:
            info = self.r.info("memory")
            if not int(info.get("lazyfree_pending_objects", 0)) or time.monotonic() > deadline:
                return info
            time.sleep(0.01)

    def fill(self, q: rqueue.Queue, n: int, delay: float | None = None, batch: int = FILL_BATCH) -> None:
        for start in range(0, n, batch):
            q.publish_many([payload(i) for i in range(start, min(start + batch, n))], delay=delay)

    def fill_stream(self, key: str, n: int, batch: int = FILL_BATCH) -> None:
        pipe = self.r.pipeline(transaction=False)
        for i in range(n):
            pipe.xadd(key, {STREAM_FIELD: payload(i)})
            if len(pipe) >= batch:
                pipe.execute()
        if len(pipe):
            pipe.execute()

    def record(
        self,
        key: str,
        n: int,
        value: float | None = None,
        streams: float | None = None,
        extra: dict[str, float] | None = None,
    ) -> None:
        s = self.series.setdefault(key, Series())
        s.n = n
        if value is not None:
            s.runs.append(value)
        if streams is not None:
            s.streams.append(streams)
        if extra:
            s.add_extra(extra)

    def runs(self, group: str, text: str) -> Iterator[int]:
        for run in range(self.config.runs):
            self.progress.step(f"{group}: {text}, run {run + 1}/{self.config.runs}")
            yield run

    def child_timeout(self, n: int) -> float:
        return 60.0 + n / 500.0

    @staticmethod
    def interleaved(rq: Callable[[int], float], st: Callable[[int], float], n: int) -> tuple[float, float]:
        """Rates (calls/s) of ``rq`` and ``st``, each doing ``n`` calls in
        INTERLEAVE_CHUNKS turns that alternate, so that both meet the same
        background load: on a small shared machine the one-per-call figures
        of two back-to-back runs differ by more than the systems do. Each
        callable does k calls and returns the seconds they took."""
        sizes = [n // INTERLEAVE_CHUNKS + (1 if i < n % INTERLEAVE_CHUNKS else 0) for i in range(INTERLEAVE_CHUNKS)]
        rq_s = st_s = 0.0
        for k in sizes:
            if k:
                rq_s += rq(k)
                st_s += st(k)
        return n / rq_s, n / st_s

    def one_per_call(self, call: Callable[[int], Any], what: str, n: int) -> tuple[float, float]:
        """``call(i)`` and XADD, one per round trip, interleaved (see interleaved)."""
        key = self.stream(what, group=False)
        xadd = self.r.xadd
        done = [0, 0]

        def rq(k: int) -> float:
            t0 = time.perf_counter()
            for i in range(done[0], done[0] + k):
                call(i)
            done[0] += k
            return time.perf_counter() - t0

        def st(k: int) -> float:
            t0 = time.perf_counter()
            for i in range(done[1], done[1] + k):
                xadd(key, {STREAM_FIELD: payload(i)})
            done[1] += k
            return time.perf_counter() - t0

        return self.interleaved(rq, st, n)

    def drain_stream(self, key: str, n: int, per_call: int) -> tuple[float, float]:
        """XREADGROUP COUNT per_call + XACK until n entries are consumed;
        returns (wall seconds, client CPU seconds)."""
        r = self.r
        field_name = STREAM_FIELD.encode()
        done = 0
        cpu0, t0 = time.process_time(), time.perf_counter()
        while done < n:
            resp: Any = r.xreadgroup(GROUP, "c1", {key: ">"}, count=per_call)
            if not resp or not resp[0][1]:
                raise BenchError(f"XREADGROUP came back empty after {done} of {n}")
            ids = []
            for eid, fields in resp[0][1]:
                noop(fields[field_name])
                ids.append(eid)
            r.xack(key, GROUP, *ids)
            done += len(ids)
        return time.perf_counter() - t0, time.process_time() - cpu0


def _glob_escape(text: str) -> str:
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)

"""The figures with the consumer in another process: end to end and
latency."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rqueue.cli.bench.base import BenchBase
from rqueue.cli.bench.child import Child
from rqueue.cli.bench.spec import BATCH, STREAM_FIELD, WARMUP, payload


def paced(rate: float, total: int) -> Iterator[int]:
    """Yields 0..total-1 on an absolute schedule of ``rate`` per second."""
    start = time.perf_counter()
    for i in range(total):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        yield i


class EndToEndFigures(BenchBase):
    """The groups e2e and latency."""

    def _child_spec(self, kind: str, expect: int, latency: bool, queue: str = "", stream: str = "") -> dict[str, Any]:
        return {
            "kind": kind,
            "url": self.url,
            "prefix": self.prefix,
            "queue": queue,
            "stream": stream,
            "expect": expect,
            "latency": latency,
            "idle_timeout": 60,
        }

    @contextmanager
    def _consumer_process(self, spec: dict[str, Any], warm: Callable[[], Any]) -> Iterator[Child]:
        """A consumer process proven idle-ready: it handled a warm-up message."""
        child = Child(spec)
        try:
            child.read("ready", 60)
            warm()
            child.read("warm", 60)
            yield child
        finally:
            child.stop()

    def rq_e2e(self, n: int) -> tuple[float, dict[str, float]]:
        q = self.queue("e2e")
        with self._consumer_process(
            self._child_spec("rqueue", n, False, queue=q.name), lambda: q.publish(WARMUP)
        ) as child:
            t0 = time.time()
            for start in range(0, n, BATCH):
                q.publish_many([payload(i) for i in range(start, min(start + BATCH, n))])
            t1 = time.time()
            done = child.read("done", self.child_timeout(n))
        return n / (done["last"] - t0), {"producer_rate": n / (t1 - t0)}

    def st_e2e(self, n: int) -> tuple[float, dict[str, float]]:
        key = self.stream("e2e")
        spec = self._child_spec("streams", n, False, stream=key)
        with self._consumer_process(spec, lambda: self.r.xadd(key, {STREAM_FIELD: WARMUP})) as child:
            t0 = time.time()
            self.fill_stream(key, n, BATCH)
            t1 = time.time()
            done = child.read("done", self.child_timeout(n))
        return n / (done["last"] - t0), {"streams_producer_rate": n / (t1 - t0)}

    def run_e2e(self) -> None:
        n = self.config.messages
        for _ in self.runs("e2e", f"producer + consumer process, {n:,} messages each"):
            rate, extra = self.rq_e2e(n)
            srate, sextra = self.st_e2e(n)
            self.record("e2e", n, rate, srate, {**extra, **sextra})
            self.cleanup()

    def rq_latency(self, rate: int, total: int) -> tuple[dict[str, Any], float]:
        q = self.queue("latency")
        with self._consumer_process(
            self._child_spec("rqueue", total, True, queue=q.name), lambda: q.publish(WARMUP)
        ) as child:
            publish = q.publish
            t0 = time.perf_counter()
            for i in paced(rate, total):
                publish(payload(i))
            achieved = total / (time.perf_counter() - t0)
            done = child.read("done", self.child_timeout(total) + total / rate)
        return done, achieved

    def st_latency(self, rate: int, total: int) -> tuple[dict[str, Any], float]:
        key = self.stream("latency")
        spec = self._child_spec("streams", total, True, stream=key)
        with self._consumer_process(spec, lambda: self.r.xadd(key, {STREAM_FIELD: WARMUP})) as child:
            xadd = self.r.xadd
            t0 = time.perf_counter()
            for i in paced(rate, total):
                xadd(key, {STREAM_FIELD: payload(i)})
            achieved = total / (time.perf_counter() - t0)
            done = child.read("done", self.child_timeout(total) + total / rate)
        return done, achieved

    def run_latency(self) -> None:
        cfg = self.config
        total = max(10, int(cfg.latency_rate * cfg.latency_secs))
        for _ in self.runs("latency", f"{cfg.latency_rate:,} msg/s for {cfg.latency_secs:g} s"):
            rq, rq_rate = self.rq_latency(cfg.latency_rate, total)
            st, st_rate = self.st_latency(cfg.latency_rate, total)
            for q in ("p50", "p90", "p99", "max"):
                extra = {"achieved_rate": rq_rate, "streams_achieved_rate": st_rate} if q == "p50" else None
                self.record(f"latency_{q}", total, rq[f"{q}_ms"], st[f"{q}_ms"], extra)
            self.cleanup()

"""The figures with the consumer in another process: end to end and
latency."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import rqueue
from rqueue.cli.bench.base import BenchBase
from rqueue.cli.bench.child import Child, control
from rqueue.cli.bench.spec import BATCH, LATENCY_CALLS_PER_S, STREAM_FIELD, payload

QUANTILES = ("p50", "p90", "p99", "max")


def paced(rate: float, total: int, per_call: int = 1) -> Iterator[int]:
    """Yields the first index of each call of ``per_call`` messages out of
    0..total-1, on an absolute schedule of ``rate`` messages per second."""
    start = time.perf_counter()
    for i in range(0, total, per_call):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        yield i


def per_call_at(rate: float) -> int:
    """Messages per publish call at ``rate``: LATENCY_CALLS_PER_S calls a
    second, each of rate / LATENCY_CALLS_PER_S messages (at least 1, at most
    BATCH). One call per message tops out well below the end-to-end rate, so
    half of that needs batches; calls a millisecond apart keep the wait of a
    message for the rest of its batch small."""
    return max(1, min(BATCH, round(rate / LATENCY_CALLS_PER_S)))


@dataclass
class Pair:
    """A run's consumer processes: one on an rqueue queue, one on a stream,
    each consuming the queue (stream) named here."""

    rq: Child
    st: Child
    queue: rqueue.Queue
    stream: str


class EndToEndFigures(BenchBase):
    """The groups e2e and latency."""

    def _child_spec(self, kind: str, queue: str = "", stream: str = "") -> dict[str, Any]:
        return {
            "kind": kind,
            "url": self.url,
            "prefix": self.prefix,
            "queue": queue,
            "stream": stream,
            "idle_timeout": 60,
        }

    @contextmanager
    def _pair(self, what: str) -> Iterator[Pair]:
        """Both consumer processes, ready on a fresh queue and stream; they
        start at the same time, while nothing is measured."""
        q = self.queue(what)
        key = self.stream(what)
        with ExitStack() as stack:
            rq = Child(self._child_spec("rqueue", queue=q.name))
            stack.callback(rq.stop)
            st = Child(self._child_spec("streams", stream=key))
            stack.callback(st.stop)
            rq.read("ready", 60)
            st.read("ready", 60)
            yield Pair(rq, st, q, key)

    @staticmethod
    def _arm(child: Child, send: Callable[[bytes], Any], expect: int, latency: bool) -> None:
        """Opens a phase of ``expect`` messages; returns once the process has
        handled the control message, so it waits in its fetch, idle."""
        send(control(phase={"expect": expect, "latency": latency}))
        child.read("armed", 60)

    def _switch(self, p: Pair, what: str) -> None:
        """Moves both processes to a fresh queue and stream."""
        q = self.queue(what)
        key = self.stream(what)
        p.queue.publish(control(switch=q.name))
        p.rq.read("switched", 60)
        self.r.xadd(p.stream, {STREAM_FIELD: control(switch=key)})
        p.st.read("switched", 60)
        p.queue, p.stream = q, key

    def rq_e2e(self, p: Pair, n: int) -> tuple[float, dict[str, float]]:
        q = p.queue
        self._arm(p.rq, q.publish, n, False)
        t0 = time.time()
        for start in range(0, n, BATCH):
            q.publish_many([payload(i) for i in range(start, min(start + BATCH, n))])
        t1 = time.time()
        done = p.rq.read("done", self.child_timeout(n))
        return n / (done["last"] - t0), {"producer_rate": n / (t1 - t0)}

    def st_e2e(self, p: Pair, n: int) -> tuple[float, dict[str, float]]:
        key = p.stream
        self._arm(p.st, lambda data: self.r.xadd(key, {STREAM_FIELD: data}), n, False)
        t0 = time.time()
        self.fill_stream(key, n, BATCH)
        t1 = time.time()
        done = p.st.read("done", self.child_timeout(n))
        return n / (done["last"] - t0), {"streams_producer_rate": n / (t1 - t0)}

    def run_e2e(self) -> None:
        n = self.config.messages
        for _ in self.runs("e2e", f"producer + consumer process, {n:,} messages each"):
            with self._pair("e2e") as p:
                rate, extra = self.rq_e2e(p, n)
                srate, sextra = self.st_e2e(p, n)
            self.record("e2e", n, rate, srate, {**extra, **sextra})
            self.cleanup()

    def rq_latency(self, p: Pair, rate: float, total: int, per_call: int = 1) -> tuple[dict[str, Any], float]:
        """``total`` messages at ``rate``: publish() each, or publish_many of
        ``per_call``; returns the consumer's report and the rate reached."""
        q = p.queue
        self._arm(p.rq, q.publish, total, True)
        publish, publish_many = q.publish, q.publish_many
        t0 = time.perf_counter()
        if per_call == 1:
            for i in paced(rate, total):
                publish(payload(i))
        else:
            for s in paced(rate, total, per_call):
                publish_many([payload(i) for i in range(s, min(s + per_call, total))])
        achieved = total / (time.perf_counter() - t0)
        done = p.rq.read("done", self.child_timeout(total) + total / rate)
        return done, achieved

    def st_latency(self, p: Pair, rate: float, total: int, per_call: int = 1) -> tuple[dict[str, Any], float]:
        """As rq_latency with XADD, or pipelines of ``per_call`` XADDs."""
        key = p.stream
        self._arm(p.st, lambda data: self.r.xadd(key, {STREAM_FIELD: data}), total, True)
        xadd = self.r.xadd
        pipe = self.r.pipeline(transaction=False)
        t0 = time.perf_counter()
        if per_call == 1:
            for i in paced(rate, total):
                xadd(key, {STREAM_FIELD: payload(i)})
        else:
            for s in paced(rate, total, per_call):
                for i in range(s, min(s + per_call, total)):
                    pipe.xadd(key, {STREAM_FIELD: payload(i)})
                pipe.execute()
        achieved = total / (time.perf_counter() - t0)
        done = p.st.read("done", self.child_timeout(total) + total / rate)
        return done, achieved

    def run_latency(self) -> None:
        """Per run, in one pair of consumer processes: the latency at
        --latency-rate, then each system's end-to-end rate measured as e2e
        measures it, then the latency of each at half of its own rate."""
        cfg = self.config
        total = max(10, int(cfg.latency_rate * cfg.latency_secs))
        n, secs = cfg.messages, cfg.latency_half_secs
        # The queues the consumer moves to for the second figure wait in Redis
        # for their wake-up (docs/settings.md); set before any consumer reads
        # the settings.
        self.client.configure("latency-wait.*", wait_in_redis=True)
        for run in self.runs("latency", f"{cfg.latency_rate:,} msg/s for {cfg.latency_secs:g} s"):
            with self._pair("latency") as p:
                rq, rq_rate = self.rq_latency(p, cfg.latency_rate, total)
                st, st_rate = self.st_latency(p, cfg.latency_rate, total)
                self._switch(p, "latency-wait")
                self.progress.step(
                    f"latency: {cfg.latency_rate:,} msg/s, the consumer waiting in Redis, run {run + 1}/{cfg.runs}"
                )
                rqw, rqw_rate = self.rq_latency(p, cfg.latency_rate, total)
                self._switch(p, "latency-max")
                self.progress.step(f"latency: the max rate, e2e of {n:,} messages each, run {run + 1}/{cfg.runs}")
                rq_max = self.rq_e2e(p, n)[0]
                st_max = self.st_e2e(p, n)[0]
                self._switch(p, "latency-half")
                rq_half, st_half = rq_max / 2, st_max / 2
                self.progress.step(
                    f"latency: half the max rate, {rq_half:,.0f} msg/s (Streams {st_half:,.0f}) for "
                    f"{secs:g} s, run {run + 1}/{cfg.runs}"
                )
                rq_total, st_total = max(10, int(rq_half * secs)), max(10, int(st_half * secs))
                rq_k, st_k = per_call_at(rq_half), per_call_at(st_half)
                rq2, rq2_rate = self.rq_latency(p, rq_half, rq_total, rq_k)
                st2, st2_rate = self.st_latency(p, st_half, st_total, st_k)
            for q in QUANTILES:
                extra = {"achieved_rate": rq_rate, "streams_achieved_rate": st_rate} if q == "p50" else None
                self.record(f"latency_{q}", total, rq[f"{q}_ms"], st[f"{q}_ms"], extra)
            for q in QUANTILES:  # next to the same Streams run
                extra = {"achieved_rate": rqw_rate, "streams_achieved_rate": st_rate} if q == "p50" else None
                self.record(f"latency_wait_{q}", total, rqw[f"{q}_ms"], st[f"{q}_ms"], extra)
            for q in QUANTILES:
                extra = None
                if q == "p50":
                    extra = {
                        "max_rate": rq_max,
                        "rate": rq_half,
                        "achieved_rate": rq2_rate,
                        "per_call": rq_k,
                        "streams_max_rate": st_max,
                        "streams_rate": st_half,
                        "streams_achieved_rate": st2_rate,
                        "streams_per_call": st_k,
                        "streams_n": st_total,
                    }
                self.record(f"latency_half_{q}", rq_total, rq2[f"{q}_ms"], st2[f"{q}_ms"], extra)
            self.cleanup()

"""The throughput figures: publish, consume, the Worker and the size sweep."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from typing import Any

import rqueue
import rqueue.aio
from rqueue.cli.bench.base import BenchBase, fresh_queue
from rqueue.cli.bench.spec import BATCH, GROUP, HUGE_INFLIGHT, LONG_WAIT, BenchError, noop, payload
from rqueue.constants import MAX_FETCH


class ThroughputFigures(BenchBase):
    """The groups publish, consume, worker and sweep."""

    # -- publish ---------------------------------------------------------------

    def rq_publish_batch(self, n: int) -> float:
        q = self.queue("publish-batch")
        t0 = time.perf_counter()
        for start in range(0, n, BATCH):
            q.publish_many([payload(i) for i in range(start, min(start + BATCH, n))])
        return n / (time.perf_counter() - t0)

    def st_publish_batch(self, n: int) -> float:
        key = self.stream("publish-batch", group=False)
        t0 = time.perf_counter()
        self.fill_stream(key, n, BATCH)
        return n / (time.perf_counter() - t0)

    def publish_single(self, n: int) -> tuple[float, float]:
        """publish() and XADD, one per call, interleaved (see interleaved)."""
        publish = self.queue("publish-single").publish
        return self.one_per_call(lambda i: publish(payload(i)), "publish-single", n)

    def run_publish(self) -> None:
        cfg = self.config
        for _ in self.runs("publish", f"publish_many x100 and XADD pipelined, {cfg.messages:,} each"):
            self.record(
                "publish_batch", cfg.messages, self.rq_publish_batch(cfg.messages), self.st_publish_batch(cfg.messages)
            )
            self.cleanup()
        for _ in self.runs("publish", f"one publish / XADD per call, {cfg.single_messages:,} each"):
            n = cfg.single_messages
            self.record("publish_single", n, *self.publish_single(n))
            self.cleanup()

    # -- consume ---------------------------------------------------------------

    def rq_consume(self, n: int, per_call: int) -> tuple[float, dict[str, float]]:
        q = self.queue(f"consume-{per_call}")
        c = q.consumer(GROUP, name="c1")
        self.fill(q, n)
        fetch, ack = c.fetch, c.ack
        done = 0
        cpu0, t0 = time.process_time(), time.perf_counter()
        while done < n:
            ds = fetch(per_call)
            if not ds:
                raise BenchError(f"fetch({per_call}) came back empty after {done} of {n}")
            for d in ds:
                noop(d.data)
            ack(ds)
            done += len(ds)
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        c.close()
        return n / elapsed, {"client_cpu_us": cpu / n * 1e6, "wall_us": elapsed / n * 1e6}

    def filled_pair(self, what: str, n: int) -> tuple[rqueue.Consumer, str]:
        """A consumer of a new queue and a new stream (with its group), each
        holding n messages."""
        q = self.queue(what)
        c = q.consumer(GROUP, name="c1")
        self.fill(q, n)
        key = self.stream(what)
        self.fill_stream(key, n)
        return c, key

    def consume_single(self, n: int) -> tuple[float, float, dict[str, float]]:
        """fetch(1) + ack and XREADGROUP COUNT 1 + XACK, one message at a
        time, interleaved (see interleaved), from n messages stored in each."""
        c, key = self.filled_pair("consume-1", n)
        fetch = c.fetch
        cpu = [0.0, 0.0]

        def rq(k: int) -> float:
            cpu0, t0 = time.process_time(), time.perf_counter()
            for _ in range(k):
                ds = fetch(1)
                if not ds:
                    raise BenchError("fetch(1) came back empty")
                noop(ds[0].data)
                ds[0].ack()
            cpu[0] += time.process_time() - cpu0
            return time.perf_counter() - t0

        def st(k: int) -> float:
            elapsed, used = self.drain_stream(key, k, 1)
            cpu[1] += used
            return elapsed

        rate, srate = self.interleaved(rq, st, n)
        c.close()
        return (
            rate,
            srate,
            {
                "client_cpu_us": cpu[0] / n * 1e6,
                "wall_us": 1e6 / rate,
                "streams_client_cpu_us": cpu[1] / n * 1e6,
                "streams_wall_us": 1e6 / srate,
            },
        )

    def st_consume(self, n: int, per_call: int) -> tuple[float, dict[str, float]]:
        key = self.stream(f"consume-{per_call}")
        self.fill_stream(key, n)
        elapsed, cpu = self.drain_stream(key, n, per_call)
        return n / elapsed, {"streams_client_cpu_us": cpu / n * 1e6, "streams_wall_us": elapsed / n * 1e6}

    def run_consume(self) -> None:
        cfg = self.config
        for _ in self.runs("consume", f"fetch(100)+ack and XREADGROUP 100+XACK, {cfg.messages:,} each"):
            rate, extra = self.rq_consume(cfg.messages, BATCH)
            srate, sextra = self.st_consume(cfg.messages, BATCH)
            self.record("consume_batch", cfg.messages, rate, srate, {**extra, **sextra})
            self.cleanup()
        for _ in self.runs("consume", f"fetch(1)+ack and XREADGROUP 1+XACK, {cfg.single_messages:,} each"):
            n = cfg.single_messages
            rate, srate, extra = self.consume_single(n)
            self.record("consume_single", n, rate, srate, extra)
            self.cleanup()
            rate, srate = self.consume_single_next(n)
            self.record("consume_single_next", n, rate, srate)
            self.cleanup()

    def consume_single_next(self, n: int) -> tuple[float, float]:
        """One message at a time, each ack sent with the next fetch
        (ack_and_fetch: one round trip per message), and XREADGROUP COUNT 1
        + XACK, interleaved, from n messages stored in each."""
        c, key = self.filled_pair("consume-next", n)
        ack_and_fetch = c.ack_and_fetch
        held: list[rqueue.Delivery] = []

        def rq(k: int) -> float:
            t0 = time.perf_counter()
            for _ in range(k):
                statuses, ds, _ = ack_and_fetch(held, 1)
                if not ds or any(statuses):
                    raise BenchError(f"ack_and_fetch: {len(ds)} deliveries, statuses {statuses}")
                noop(ds[0].data)
                held[:] = ds
            return time.perf_counter() - t0

        rates = self.interleaved(rq, lambda k: self.drain_stream(key, k, 1)[0], n)
        c.ack(held)
        c.close()
        return rates

    # -- worker ------------------------------------------------------------------

    def rq_worker(self, n: int, kind: str = "msg") -> tuple[float, dict[str, float]]:
        """A worker on n queued messages: ``msg`` a no-op handler on 8
        threads, ``msg1`` on one, ``batch`` a batch handler of 100 on one thread, ``aio_batch``
        a coroutine batch handler of 100 on one asyncio task. The rate is
        (N-1) / (first handler start -> all acks confirmed)."""
        # A client of its own: the worker's wake-up subscription ends with it.
        with rqueue.connect(self.url, prefix=self.prefix) as client:
            q = fresh_queue(client, self._name("worker"))
            self.fill(q, n)
            lock = threading.Lock()
            state: dict[str, Any] = {"count": 0, "first": None, "last": None}
            finished = threading.Event()

            def seen(k: int) -> None:
                now = time.time()
                with lock:
                    if state["first"] is None:
                        state["first"] = now
                    state["count"] += k
                    if state["count"] >= n and state["last"] is None:
                        state["last"] = time.time()
                        finished.set()

            def handler(d: rqueue.Delivery) -> None:
                seen(1)

            @rqueue.batch_handler(size=BATCH)
            def batch(ds: list[rqueue.Delivery]) -> list[bool]:
                seen(len(ds))
                return [True] * len(ds)

            @rqueue.batch_handler(size=BATCH)
            async def aio_batch(ds: list[rqueue.Delivery]) -> list[bool]:
                seen(len(ds))
                return [True] * len(ds)

            if kind == "aio_batch":
                return self._aio_worker(q.name, n, aio_batch, state, finished)
            if kind == "batch":
                worker = rqueue.Worker(q, GROUP, batch, concurrency=1, scheduler=False)
            else:
                worker = rqueue.Worker(q, GROUP, handler, concurrency=1 if kind == "msg1" else 8)
            worker.start()
            try:
                if not finished.wait(self.child_timeout(n)):
                    raise BenchError(f"the worker handled {state['count']} of {n} messages in time")
                deadline = time.monotonic() + 30
                while worker.stats.acked < n:
                    if time.monotonic() > deadline:
                        raise BenchError(f"the worker confirmed {worker.stats.acked} of {n} acks in time")
                    time.sleep(0.0005)
                acked_at = time.time()
            finally:
                worker.stop()
                if not worker.join(60):
                    self.notes.append("worker: a Worker did not stop within 60 s")
            handled_rate = (n - 1) / (state["last"] - state["first"])
            return (n - 1) / (acked_at - state["first"]), {
                "handled_rate": handled_rate,
                "fetched": worker.stats.fetched,
            }

    def _aio_worker(
        self, queue: str, n: int, handler: Any, state: dict[str, Any], finished: threading.Event
    ) -> tuple[float, dict[str, float]]:
        """rq_worker's aio_batch case: an rqueue.aio.Worker on its own loop."""

        async def main() -> tuple[float, dict[str, float]]:
            client = await rqueue.aio.connect(self.url, prefix=self.prefix)
            try:
                worker = rqueue.aio.Worker(client.queue(queue), GROUP, handler, concurrency=1)
                task = asyncio.create_task(worker.run(install_signal_handlers=False))
                deadline = time.monotonic() + self.child_timeout(n)
                while worker.stats.acked < n:
                    if task.done() or time.monotonic() > deadline:
                        raise BenchError(f"the aio worker confirmed {worker.stats.acked} of {n} acks in time")
                    await asyncio.sleep(0.0005)
                acked_at = time.time()
                worker.stop()
                await task
            finally:
                await client.close()
            return (n - 1) / (acked_at - state["first"]), {"fetched": worker.stats.fetched}

        return asyncio.run(main())

    def run_worker(self) -> None:
        n = self.config.messages
        for _ in self.runs("worker", f"Worker, concurrency 8, no-op handler, {n:,} messages"):
            rate, extra = self.rq_worker(n)
            srate, _ = self.st_consume(n, BATCH)
            self.record("worker", n, rate, srate, extra)
            self.cleanup()
        # The worker modes and their reference, fetch(100)+ack(list), in turns:
        # each run meets the same background load.
        for _ in self.runs("worker", f"reference, Worker per message and batch, aio batch, {n:,} messages each"):
            ref, _ = self.rq_consume(n, BATCH)
            self.record("worker_ref", n, ref)
            modes = (
                ("worker_msg", "msg"),
                ("worker_msg1", "msg1"),
                ("worker_batch", "batch"),
                ("worker_aio_batch", "aio_batch"),
            )
            for key, kind in modes:
                rate, extra = self.rq_worker(n, kind)
                self.record(key, n, rate, None, extra)
            self.cleanup()

    # -- size sweep --------------------------------------------------------------

    def sweep_case(self, case: str) -> tuple[float, dict[str, float]]:
        """fetch(100)+ack throughput of one consumer while the queue holds
        ``depth`` ready messages (topped up between timed chunks) and, for
        "delayed"/"inflight", a mass of delayed or held messages ahead of them."""
        cfg = self.config
        q = self.queue(f"sweep-{case}")
        big: dict[str, Any] = {"max_inflight": HUGE_INFLIGHT, "ack_wait": LONG_WAIT}
        c = q.consumer(GROUP, name="measure", **big)
        extra: dict[str, float] = {}
        if case == "delayed":
            self.fill(q, cfg.sweep_delayed, delay=LONG_WAIT)
        elif case == "inflight":
            self.fill(q, cfg.sweep_inflight)
            self._hold(q, cfg.sweep_inflight, big)
        gc.collect()
        depth = cfg.sweep_queued if case == "queued" else cfg.sweep_small
        self.fill(q, depth)
        fetch, ack = c.fetch, c.ack
        # Warm-up (not timed): the first fetches pass over the delayed messages
        # once, moving them to the group's schedule, 1000 per call at most.
        t_warm = time.perf_counter()
        calls = 0
        while True:
            calls += 1
            ds = fetch(BATCH)
            if ds:
                ack(ds)
                break
            if calls > 10 + cfg.sweep_delayed:
                raise BenchError(f"sweep {case}: no message after {calls} fetches")
        extra["warmup_s"] = time.perf_counter() - t_warm
        extra["warmup_fetches"] = calls
        self.fill(q, len(ds), batch=BATCH)
        timed, elapsed = 0, 0.0
        while timed < cfg.sweep_timed:
            chunk = min(cfg.sweep_chunk, cfg.sweep_timed - timed)
            got = 0
            t0 = time.perf_counter()
            while got < chunk:
                ds = fetch(min(BATCH, chunk - got))
                if not ds:
                    raise BenchError(f"sweep {case}: fetch came back empty with {depth} queued")
                for d in ds:
                    noop(d.data)
                ack(ds)
                got += len(ds)
            elapsed += time.perf_counter() - t0
            timed += got
            self.fill(q, got, batch=BATCH)  # back to the same depth, not timed
        c.close()
        return timed / elapsed, extra

    @staticmethod
    def _hold(q: rqueue.Queue, n: int, settings: dict[str, Any]) -> None:
        """Another member of the group takes ``n`` messages and keeps them in
        flight. The Consumer object is dropped (not closed): the member and
        its leases stay in Redis, its n Delivery objects leave this process,
        as if the holder were another process."""
        holder = q.consumer(GROUP, name="holder", prefetch=n, **settings)
        held = 0
        while held < n:
            got = holder.fetch(min(MAX_FETCH, n - held))
            if not got:
                raise BenchError(f"the holder got only {held} of {n} messages")
            held += len(got)

    def run_sweep(self) -> None:
        cfg = self.config
        cases = [
            ("base", cfg.sweep_small),
            ("queued", cfg.sweep_queued),
            ("delayed", cfg.sweep_delayed),
            ("inflight", cfg.sweep_inflight),
        ]
        for run in range(cfg.runs):
            for case, size in cases:
                self.progress.step(
                    f"sweep: {case} ({size:,}), {cfg.sweep_timed:,} timed fetch+ack, run {run + 1}/{cfg.runs}"
                )
                rate, extra = self.sweep_case(case)
                extra["size"] = size
                self.record(f"sweep_{case}", cfg.sweep_timed, rate, None, extra)
                self.cleanup()

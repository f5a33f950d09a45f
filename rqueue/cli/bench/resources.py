"""What the server spends: memory per queued message and CPU per message."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis

import rqueue
from rqueue.cli.bench.base import BenchBase
from rqueue.cli.bench.spec import BATCH, GROUP, HUGE_INFLIGHT, LONG_WAIT, BenchError, noop


class ResourceFigures(BenchBase):
    """The groups memory and cpu."""

    # -- memory ------------------------------------------------------------------

    def used_memory(self) -> int:
        """used_memory once the server has no lazy frees pending (UNLINK of an
        earlier figure's keys frees in the background and would be counted)."""
        gc.collect()
        return int(self.wait_lazyfree()["used_memory"])

    def key_usage(self, keys: Sequence[str]) -> int | None:
        total = 0
        try:
            for key in keys:
                total += int(self.r.memory_usage(key, samples=0) or 0)
        except redis.ResponseError:
            return None
        return total

    def rq_memory(self, n: int) -> tuple[float, dict[str, float]]:
        q = self.queue("memory")
        c = q.consumer(GROUP, name="c1")
        before = self.used_memory()
        self.fill(q, n, batch=BATCH)
        after = self.used_memory()
        extra: dict[str, float] = {}
        usage = self.key_usage(q.keys.all_static())
        if usage is not None:
            extra["memory_usage_keys_per_msg"] = usage / n
        c.close()
        return (after - before) / n, extra

    def st_memory(self, n: int) -> tuple[float, dict[str, float]]:
        key = self.stream("memory")
        before = self.used_memory()
        self.fill_stream(key, n, batch=BATCH)
        after = self.used_memory()
        usage = self.key_usage([key])
        return (after - before) / n, ({"streams_memory_usage_keys_per_msg": usage / n} if usage is not None else {})

    def run_memory(self) -> None:
        n = self.config.memory_messages
        for _ in self.runs("memory", f"used_memory for {n:,} queued messages and stream entries"):
            rq, extra = self.rq_memory(n)
            self.cleanup()
            st, sextra = self.st_memory(n)
            self.cleanup()
            self.record("memory_per_msg", n, rq, st, {**extra, **sextra})

    # -- Redis CPU -----------------------------------------------------------------

    def commandstats(self) -> dict[str, tuple[int, int]]:
        """command -> (calls, usec) from INFO commandstats."""
        out = {}
        for name, stat in self.r.info("commandstats").items():
            if name.startswith("cmdstat_") and isinstance(stat, dict):
                out[name[len("cmdstat_") :]] = (int(stat.get("calls", 0)), int(stat.get("usec", 0)))
        return out

    @staticmethod
    def usec(stats: dict[str, tuple[int, int]], *commands: str) -> int:
        return sum(stats.get(c, (0, 0))[1] for c in commands)

    SCRIPT_COMMANDS = ("evalsha", "eval", "evalsha_ro", "eval_ro")

    def reset_stats(self) -> None:
        if self._resetstat_ok is False:
            return
        try:
            self.r.config_resetstat()
            self._resetstat_ok = True
        except redis.ResponseError as exc:
            self._resetstat_ok = False
            self.notes.append(f"cpu: CONFIG RESETSTAT refused ({exc}); figures use INFO commandstats deltas only")

    def rq_cpu(self, n: int) -> dict[str, float]:
        s = self.SCRIPT_COMMANDS
        # A fetch's Redis time includes the XRANGE by which the client reads
        # the records a large fetch claimed (rqueue.engine.commands.fill_claimed).
        # An XRANGE inside a script is counted by Redis under both names, so
        # a fetch that reads records in the script is overcounted: the
        # figure errs against rqueue.
        f = (*s, "xrange")
        q = self.queue("cpu")
        c = q.consumer(GROUP, name="c1")
        self.reset_stats()
        a = self.commandstats()
        self.fill(q, n, batch=BATCH)
        b = self.commandstats()
        out = {"publish": (self.usec(b, *s) - self.usec(a, *s)) / n}
        # fetch and ack are both EVALSHA: read the counters between the calls
        fetch_us = ack_us = 0
        done = 0
        while done < n:
            before = self.commandstats()
            ds = c.fetch(BATCH)
            mid = self.commandstats()
            if not ds:
                raise BenchError(f"cpu: fetch came back empty after {done} of {n}")
            c.ack(ds)
            after = self.commandstats()
            fetch_us += self.usec(mid, *f) - self.usec(before, *f)
            ack_us += self.usec(after, *s) - self.usec(mid, *s)
            done += len(ds)
        out["fetch"], out["ack"] = fetch_us / n, ack_us / n
        # client CPU of the plain loop (no INFO calls in it)
        self.fill(q, n)
        done = 0
        a = self.commandstats()
        cpu0, t0 = time.process_time(), time.perf_counter()
        while done < n:
            ds = c.fetch(BATCH)
            if not ds:
                raise BenchError(f"cpu: fetch came back empty after {done} of {n}")
            for d in ds:
                noop(d.data)
            c.ack(ds)
            done += len(ds)
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        b = self.commandstats()
        out["client"] = cpu / n * 1e6
        out["wall"] = elapsed / n * 1e6
        out["fetch_ack_redis"] = (self.usec(b, *f) - self.usec(a, *f)) / n
        c.close()
        return out

    def server_cpu(self) -> float:
        """Seconds of CPU the server process has used, user and system: a
        command's whole cost, the reading of its request and the writing of
        its reply included, which commandstats leave out."""
        info = self.r.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    def phases_cpu(
        self, n: int, publish: Callable[[], None], fetch: Callable[[], None], ack: Callable[[], None]
    ) -> dict[str, float]:
        """The server's CPU per message in each phase: all n published, then
        all fetched and held, then all acked."""
        out = {}
        for name, phase in (("publish", publish), ("fetch", fetch), ("ack", ack)):
            before = self.server_cpu()
            phase()
            out[name] = (self.server_cpu() - before) / n * 1e6
        return out

    def rq_proc_cpu(self, n: int) -> dict[str, float]:
        q = self.queue("proc-cpu")
        # It holds all n before it acks (as the Streams side does): no cap
        # or lease of the defaults may end the fetch phase early.
        c = q.consumer(GROUP, name="c1", prefetch=n, max_inflight=HUGE_INFLIGHT, ack_wait=LONG_WAIT)
        held: list[list[rqueue.Delivery]] = []

        def fetch() -> None:
            got = 0
            while got < n:
                ds = c.fetch(BATCH)
                if not ds:
                    raise BenchError(f"cpu: fetch came back empty after {got} of {n}")
                held.append(ds)
                got += len(ds)

        def ack() -> None:
            for ds in held:
                c.ack(ds)

        out = self.phases_cpu(n, lambda: self.fill(q, n, batch=BATCH), fetch, ack)
        c.close()
        return out

    def st_proc_cpu(self, n: int) -> dict[str, float]:
        key = self.stream("proc-cpu")
        held: list[list[Any]] = []

        def fetch() -> None:
            got = 0
            while got < n:
                resp: Any = self.r.xreadgroup(GROUP, "c1", {key: ">"}, count=BATCH)
                if not resp or not resp[0][1]:
                    raise BenchError(f"cpu: XREADGROUP came back empty after {got} of {n}")
                held.append([eid for eid, _ in resp[0][1]])
                got += len(held[-1])

        def ack() -> None:
            for ids in held:
                self.r.xack(key, GROUP, *ids)

        return self.phases_cpu(n, lambda: self.fill_stream(key, n, batch=BATCH), fetch, ack)

    def st_cpu(self, n: int) -> dict[str, float]:
        key = self.stream("cpu")
        a = self.commandstats()
        self.fill_stream(key, n, batch=BATCH)
        b = self.commandstats()
        out = {"publish": (self.usec(b, "xadd") - self.usec(a, "xadd")) / n}
        elapsed, cpu = self.drain_stream(key, n, BATCH)
        c = self.commandstats()
        out["fetch"] = (self.usec(c, "xreadgroup") - self.usec(b, "xreadgroup")) / n
        out["ack"] = (self.usec(c, "xack") - self.usec(b, "xack")) / n
        out["client"] = cpu / n * 1e6
        out["wall"] = elapsed / n * 1e6
        return out

    def run_cpu(self) -> None:
        n = self.config.messages
        try:
            self.commandstats()
        except redis.ResponseError as exc:
            self.notes.append(f"cpu: INFO commandstats refused ({exc}); no Redis CPU figures")
            return
        try:
            self.server_cpu()
            proc = True
        except (KeyError, ValueError, redis.ResponseError) as exc:
            self.notes.append(f"cpu: INFO cpu gives no used_cpu_user/used_cpu_sys ({exc!r}); no cpu_proc figures")
            proc = False
        for _ in self.runs("cpu", f"INFO commandstats and INFO cpu around publish, fetch and ack, {n:,} messages"):
            rq = self.rq_cpu(n)
            self.cleanup()
            st = self.st_cpu(n)
            self.cleanup()
            if proc:
                rq_proc = self.rq_proc_cpu(n)
                self.cleanup()
                st_proc = self.st_proc_cpu(n)
                self.cleanup()
                for name in ("publish", "fetch", "ack"):
                    self.record(f"cpu_proc_{name}_us", n, rq_proc[name], st_proc[name])
            self.record("cpu_publish_us", n, rq["publish"], st["publish"])
            self.record("cpu_fetch_us", n, rq["fetch"], st["fetch"])
            self.record("cpu_ack_us", n, rq["ack"], st["ack"])
            self.record(
                "cpu_client_us",
                n,
                rq["client"],
                st["client"],
                {
                    "wall_us": rq["wall"],
                    "streams_wall_us": st["wall"],
                    "fetch_ack_redis_us": rq["fetch_ack_redis"],
                    "streams_fetch_ack_redis_us": st["fetch"] + st["ack"],
                },
            )

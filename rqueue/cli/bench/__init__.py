"""``rqueue bench``: what rqueue costs on the Redis server it is given, next
to the same work done with raw redis-py Streams on the same server in the same
run (the ceiling named by issue 7).

Every figure uses 100-byte payloads whose first bytes carry ``time.time()``
of the publish, one fresh queue (and one fresh stream) per figure and run,
under a key prefix of its own (``<prefix>-bench-<random>``); every key under
that prefix is deleted after each figure. Each figure runs ``--runs`` times,
rqueue and Streams alternating, and reports the median with min and max.

Figures (``--only`` takes the group names in the first column):

=========  ====================  ==============================================
group      key                   what is measured
=========  ====================  ==============================================
publish    publish_batch         publish_many of 100 per call (msg/s);
                                 Streams: XADD pipelined 100
           publish_single        publish() of one message per call (msg/s);
                                 Streams: one XADD per round trip; the two
                                 take turns, 10 each (INTERLEAVE_CHUNKS)
consume    consume_batch         fetch(100) then consumer.ack(list), queue
                                 preloaded (msg/s); Streams: XREADGROUP
                                 COUNT 100 + one XACK of the 100 ids
           consume_single        fetch(1) then ack, one at a time (msg/s);
                                 Streams: XREADGROUP COUNT 1 + XACK; the
                                 two take turns, as publish_single
           consume_single_next   one message at a time, the ack of each sent
                                 with the fetch of the next (ack_and_fetch:
                                 one round trip per message, as the Worker
                                 does); Streams as consume_single. Not the
                                 issue's one-per-call figure: a second way
e2e        e2e                   one producer process (publish_many 100) and
                                 one consumer process (fetch(100, timeout) +
                                 ack(list)), N / (first publish -> last ack)
                                 (msg/s); Streams: XADD pipelined 100 and
                                 XREADGROUP COUNT 100 BLOCK + XACK
worker     worker                rqueue.Worker, no-op handler, concurrency 8,
                                 one process: (N-1) / (first handler start ->
                                 all acks confirmed) (msg/s); Streams:
                                 XREADGROUP COUNT 100 + XACK in-process
latency    latency_p50, _p90,    publish (one per call) at a fixed rate to a
           latency_p99,          consumer process using fetch(100, timeout);
           latency_max           handler start - timestamp in the payload
                                 (ms); Streams: XADD at the same rate,
                                 XREADGROUP BLOCK in a consumer process
sweep      sweep_base            fetch(100)+ack with 10^3 messages queued
                                 (msg/s); the queue is topped up between
                                 timed chunks so its depth stays put
           sweep_queued          the same with 10^5 queued (10^6 with --full)
           sweep_delayed         10^3 queued behind 10^4 delayed messages
                                 (10^5 with --full)
           sweep_inflight        10^3 queued while another consumer holds
                                 10^4 in flight (10^5 with --full)
floor      floor_eval            EVALSHA of an empty script with a queue's
                                 publish keys, one per call (calls/s);
                                 Streams: one XADD per round trip
           floor_publish         the least a scripted publish of a
                                 seq-numbered message does (TIME, HINCRBY,
                                 HSET), one per call; Streams: XADD
           floor_fetch_ack       the least a scripted leased claim and its
                                 ack do (TIME, HINCRBY, HGET, ZADD; then
                                 ZREM), one message at a time; Streams:
                                 XREADGROUP COUNT 1 + XACK. No rqueue code
                                 runs in this group: it bounds what any
                                 script-based queue can reach here
memory     memory_per_msg        INFO memory used_memory delta / N for N
                                 queued messages (bytes); Streams: XADD
                                 entries with the same payload
cpu        cpu_publish_us        Redis CPU per message from INFO
                                 commandstats: usec of EVALSHA per message
                                 for publish_many 100; Streams: XADD
           cpu_fetch_us          ... for fetch(100); Streams: XREADGROUP
           cpu_ack_us            ... for ack(list of 100); Streams: XACK
           cpu_client_us         CPU of this Python process per message in
                                 the fetch(100)+ack loop (time.process_time);
                                 Streams: the XREADGROUP+XACK loop
=========  ====================  ==============================================

``--json`` prints one object (schema ``rqueue-bench/1``)::

    {"schema": "rqueue-bench/1",
     "server": {"url", "name", "version"},
     "config": {"messages", "single_messages", "runs", "payload_bytes",
                "latency_rate", "latency_secs", "sweep": {...},
                "memory_messages", "quick", "full", "groups"},
     "environment": {"python", "redis_py", "hiredis", "nproc", "loadavg",
                     "cpu_steal_pct", "started_at"},
     "figures": {KEY: {"group", "label", "unit", "better", "median", "min",
                       "max", "runs", "n", "extra",
                       "streams": {"label", "median", "min", "max", "runs"}
                                  or null,
                       "ratio", "ratio_to", "target": {"text", "kind",
                       "value", "met"} or null}},
     "notes": [...], "errors": [...], "elapsed_s"}

``ratio`` is rqueue's median / the counterpart's median (``ratio_to`` says
which: "streams", or "sweep_base" for the size sweep). For msg/s higher is
better; for ms, bytes and usec lower is better (``better``). A figure that
could not be measured has median null and its reason in notes or errors.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import selectors
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import click
import redis

import rqueue
from rqueue.constants import MAX_FETCH
from rqueue.engine.scripts import Script, no_retry

SCHEMA = "rqueue-bench/1"
PAYLOAD_BYTES = 100
BATCH = 100  # messages per publish_many / fetch / XADD pipeline / XREADGROUP
FILL_BATCH = 1000  # messages per call when preloading a queue (not timed)
GROUP = "bench"
WARMUP = b"WARMUP"
STREAM_FIELD = "p"
FILLER = b"x" * PAYLOAD_BYTES
INTERLEAVE_CHUNKS = 10  # one-per-call figures: rqueue and Streams take turns, this many each
LONG_WAIT = 3600.0  # seconds: delay of "delayed" messages, lease of held ones
HUGE_INFLIGHT = 10**9  # max_inflight of the sweep's consumers: never the limit
CHILD_ENV = "RQUEUE_BENCH_CHILD"
GROUPS = ("publish", "consume", "e2e", "worker", "latency", "sweep", "floor", "memory", "cpu")


class BenchError(rqueue.RQueueError):
    """A figure could not be measured."""


# -- figures -------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """An issue-7 target: ``kind`` is ratio_min, ratio_max, value_min or value_max."""

    text: str
    kind: str
    value: float

    def met(self, median: float | None, ratio: float | None) -> bool | None:
        x = ratio if self.kind.startswith("ratio") else median
        if x is None:
            return None
        return x >= self.value if self.kind.endswith("min") else x <= self.value


@dataclass(frozen=True)
class Spec:
    key: str
    group: str
    label: str
    unit: str
    streams: str | None = None  # label of the Streams counterpart
    target: Target | None = None
    ratio_to: str | None = None  # "streams", "sweep_base" or None

    @property
    def better(self) -> str:
        return "higher" if self.unit == "msg/s" else "lower"


SPECS: tuple[Spec, ...] = (
    Spec(
        "publish_batch",
        "publish",
        "publish_many, 100 per call",
        "msg/s",
        "XADD pipelined 100",
        Target(">= 1.0x Streams", "ratio_min", 1.0),
        "streams",
    ),
    Spec(
        "publish_single",
        "publish",
        "publish(), one per call",
        "msg/s",
        "XADD, one per round trip",
        Target(">= 0.9x Streams", "ratio_min", 0.9),
        "streams",
    ),
    Spec(
        "consume_batch",
        "consume",
        "fetch(100) + ack(list)",
        "msg/s",
        "XREADGROUP COUNT 100 + XACK",
        Target(">= 0.5x Streams", "ratio_min", 0.5),
        "streams",
    ),
    Spec(
        "consume_single",
        "consume",
        "fetch(1) + ack, one at a time",
        "msg/s",
        "XREADGROUP COUNT 1 + XACK",
        Target(">= 0.9x Streams", "ratio_min", 0.9),
        "streams",
    ),
    Spec(
        "consume_single_next",
        "consume",
        "one at a time, ack sent with the next fetch",
        "msg/s",
        "XREADGROUP COUNT 1 + XACK",
        None,
        "streams",
    ),
    Spec(
        "e2e",
        "e2e",
        "end to end, producer + consumer process",
        "msg/s",
        "XADD pipelined 100 -> XREADGROUP 100 BLOCK + XACK",
        Target(">= 0.8x Streams", "ratio_min", 0.8),
        "streams",
    ),
    Spec(
        "worker",
        "worker",
        "Worker, no-op handler, concurrency 8",
        "msg/s",
        "XREADGROUP COUNT 100 + XACK",
        Target(">= 20,000 msg/s", "value_min", 20_000),
        "streams",
    ),
    Spec(
        "latency_p50",
        "latency",
        "publish -> handler start, p50",
        "ms",
        "XADD -> XREADGROUP BLOCK, p50",
        Target("<= 0.5 ms", "value_max", 0.5),
        "streams",
    ),
    Spec(
        "latency_p90",
        "latency",
        "publish -> handler start, p90",
        "ms",
        "XADD -> XREADGROUP BLOCK, p90",
        None,
        "streams",
    ),
    Spec(
        "latency_p99",
        "latency",
        "publish -> handler start, p99",
        "ms",
        "XADD -> XREADGROUP BLOCK, p99",
        Target("<= 2 ms", "value_max", 2.0),
        "streams",
    ),
    Spec(
        "latency_max",
        "latency",
        "publish -> handler start, max",
        "ms",
        "XADD -> XREADGROUP BLOCK, max",
        None,
        "streams",
    ),
    Spec("sweep_base", "sweep", "fetch(100)+ack, small queue", "msg/s"),
    Spec(
        "sweep_queued",
        "sweep",
        "fetch(100)+ack, large queue",
        "msg/s",
        None,
        Target(">= 0.8x small queue", "ratio_min", 0.8),
        "sweep_base",
    ),
    Spec(
        "sweep_delayed",
        "sweep",
        "fetch(100)+ack behind delayed messages",
        "msg/s",
        None,
        Target(">= 0.8x small queue", "ratio_min", 0.8),
        "sweep_base",
    ),
    Spec(
        "sweep_inflight",
        "sweep",
        "fetch(100)+ack with many held in flight",
        "msg/s",
        None,
        Target(">= 0.8x small queue", "ratio_min", 0.8),
        "sweep_base",
    ),
    Spec(
        "floor_eval",
        "floor",
        "EVALSHA of an empty script, one per call",
        "msg/s",
        "XADD, one per round trip",
        None,
        "streams",
    ),
    Spec(
        "floor_publish",
        "floor",
        "least scripted publish (TIME, HINCRBY, HSET)",
        "msg/s",
        "XADD, one per round trip",
        None,
        "streams",
    ),
    Spec(
        "floor_fetch_ack",
        "floor",
        "least scripted claim + ack (4 commands; ZREM)",
        "msg/s",
        "XREADGROUP COUNT 1 + XACK",
        None,
        "streams",
    ),
    Spec(
        "memory_per_msg",
        "memory",
        "Redis memory per queued message",
        "bytes",
        "per XADD entry",
        Target("<= 1.5x Streams", "ratio_max", 1.5),
        "streams",
    ),
    Spec(
        "cpu_publish_us",
        "cpu",
        "Redis CPU per message, publish_many 100",
        "usec",
        "XADD (pipelined 100)",
        None,
        "streams",
    ),
    Spec("cpu_fetch_us", "cpu", "Redis CPU per message, fetch(100)", "usec", "XREADGROUP COUNT 100", None, "streams"),
    Spec("cpu_ack_us", "cpu", "Redis CPU per message, ack(list of 100)", "usec", "XACK of 100 ids", None, "streams"),
    Spec(
        "cpu_client_us",
        "cpu",
        "client CPU per message, fetch(100)+ack",
        "usec",
        "XREADGROUP 100 + XACK loop",
        None,
        "streams",
    ),
)
SPEC_BY_KEY = {s.key: s for s in SPECS}
FIGURE_KEYS: tuple[str, ...] = tuple(s.key for s in SPECS)  # the documented keys of "figures"


@dataclass
class Config:
    messages: int
    single_messages: int
    runs: int
    latency_rate: int
    latency_secs: float
    sweep_small: int
    sweep_queued: int
    sweep_delayed: int
    sweep_inflight: int
    sweep_timed: int
    sweep_chunk: int
    memory_messages: int
    quick: bool
    full: bool
    groups: tuple[str, ...]

    @classmethod
    def make(
        cls,
        messages: int | None,
        runs: int | None,
        quick: bool,
        full: bool,
        only: Sequence[str],
        latency_rate: int,
        latency_secs: float | None,
    ) -> Config:
        n = messages or (1000 if quick else 20_000)
        if quick:
            small, queued, delayed, inflight = 200, 2000, 500, 500
        elif full:
            small, queued, delayed, inflight = 1000, 1_000_000, 100_000, 100_000
        else:
            small, queued, delayed, inflight = 1000, 100_000, 10_000, 10_000
        return cls(
            messages=n,
            single_messages=max(100, n // 4),
            runs=runs or (1 if quick else 3),
            latency_rate=latency_rate,
            latency_secs=latency_secs if latency_secs is not None else (0.5 if quick else 3.0),
            sweep_small=small,
            sweep_queued=queued,
            sweep_delayed=delayed,
            sweep_inflight=inflight,
            sweep_timed=500 if quick else max(2 * BATCH, n),
            sweep_chunk=min(500, small // 2),
            memory_messages=n if quick else max(n, 100_000),
            quick=quick,
            full=full,
            groups=tuple(g for g in GROUPS if g in only) if only else GROUPS,
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "messages": self.messages,
            "single_messages": self.single_messages,
            "runs": self.runs,
            "payload_bytes": PAYLOAD_BYTES,
            "latency_rate": self.latency_rate,
            "latency_secs": self.latency_secs,
            "sweep": {
                "small": self.sweep_small,
                "queued": self.sweep_queued,
                "delayed": self.sweep_delayed,
                "inflight": self.sweep_inflight,
                "timed": self.sweep_timed,
                "chunk": self.sweep_chunk,
            },
            "memory_messages": self.memory_messages,
            "quick": self.quick,
            "full": self.full,
            "groups": list(self.groups),
        }


@dataclass
class Series:
    """Runs of one figure: rqueue's values, the counterpart's, extras."""

    n: int = 0
    runs: list[float] = field(default_factory=list)
    streams: list[float] = field(default_factory=list)
    extra: dict[str, list[float]] = field(default_factory=dict)

    def add_extra(self, values: dict[str, float]) -> None:
        for k, v in values.items():
            self.extra.setdefault(k, []).append(v)


# -- helpers -------------------------------------------------------------------


def payload(i: int) -> bytes:
    """A 100-byte payload whose first bytes are the publish time."""
    head = b"%.6f|%d|" % (time.time(), i)
    return head + FILLER[: PAYLOAD_BYTES - len(head)]


def sent_at(data: bytes) -> float:
    return float(data.split(b"|", 1)[0])


def _noop(data: bytes) -> None:
    """The handler of the in-process figures."""


# The floor probes: not rqueue's scripts, but the fewest commands a script
# must send to publish a seq-numbered message on the server's clock, and to
# claim one under a lease and ack it (no de-duplication, caps, counts, ack
# floor or dead letters). What a script call costs on top of one command per
# round trip bounds the one-per-call ratios of any script-based design.
FLOOR_EMPTY_LUA = "return 1"
# KEYS[1] meta hash, KEYS[2] msgs hash; ARGV[1] the record. Returns the seq.
FLOOR_PUBLISH_LUA = """local now = redis.call('TIME')
local seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
redis.call('HSET', KEYS[2], seq, ARGV[1])
return seq"""
# KEYS[1] meta hash (cursor), KEYS[2] msgs hash, KEYS[3] lease zset. Returns
# { seq, record }, the lease due ack_wait (30 s) from the server's clock.
FLOOR_FETCH_LUA = """local now = redis.call('TIME')
local seq = redis.call('HINCRBY', KEYS[1], 'cursor', 1)
local rec = redis.call('HGET', KEYS[2], seq)
redis.call('ZADD', KEYS[3], now[1] * 1000 + 30000, seq)
return {seq, rec}"""
# KEYS[1] lease zset; ARGV[1] seq. Returns 1 when the lease was held.
FLOOR_ACK_LUA = "return redis.call('ZREM', KEYS[1], ARGV[1])"


def percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    k = (len(sorted_values) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def summary(values: Sequence[float]) -> dict[str, Any] | None:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "runs": list(values)}


def paced(rate: float, total: int) -> Iterator[int]:
    """Yields 0..total-1 on an absolute schedule of ``rate`` per second."""
    start = time.perf_counter()
    for i in range(total):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        yield i


def _cpu_jiffies() -> tuple[int, int] | None:
    """(total, steal) jiffies of all CPUs from /proc/stat, or None."""
    try:
        with open("/proc/stat") as f:
            parts = f.readline().split()
        values = [int(v) for v in parts[1:9]]
        return sum(values), values[7]
    except (OSError, ValueError, IndexError):
        return None


def versions() -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {}
    for dist in ("redis", "hiredis"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


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


# -- child processes (e2e and latency consumers) ---------------------------------


class Child:
    """A consumer process: ``python -c 'from rqueue.cli.bench import child_main'``,
    configured by one JSON document in the environment (the URL never shows in
    ``ps``), answering with one JSON object per line on stdout."""

    def __init__(self, spec: dict[str, Any]) -> None:
        env = dict(os.environ)
        env[CHILD_ENV] = json.dumps(spec)
        self._err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from rqueue.cli.bench import child_main; child_main()"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._err,
            env=env,
        )
        assert self.proc.stdout is not None
        self._fd = self.proc.stdout.fileno()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._fd, selectors.EVENT_READ)
        self._buf = b""

    def _stderr_tail(self) -> str:
        try:
            self._err.seek(0)
            return self._err.read()[-1500:].decode("utf-8", "replace").strip()
        except (OSError, ValueError):
            return ""

    def read(self, event: str, timeout: float) -> dict[str, Any]:
        """Waits for the line with ``"event": event``; raises BenchError on an
        error line, on the child's exit or after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                if not line.strip():
                    continue
                msg = json.loads(line)
                if msg.get("event") == "error":
                    raise BenchError(f"consumer process failed: {msg.get('error')}")
                if msg.get("event") == event:
                    return msg
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BenchError(
                    f"consumer process sent no {event!r} within {timeout:.0f} s; stderr: {self._stderr_tail()}"
                )
            if not self._selector.select(min(remaining, 1.0)):
                continue
            chunk = os.read(self._fd, 65536)
            if not chunk:
                rc = self.proc.wait()
                raise BenchError(f"consumer process exited (rc={rc}) before {event!r}; stderr: {self._stderr_tail()}")
            self._buf += chunk

    def stop(self) -> None:
        """Ends the process (by its own handle) and frees its pipes."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._selector.close()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._err.close()


def _say(**msg: Any) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


class _Tally:
    """Handler-side bookkeeping of a consumer process."""

    def __init__(self, expect: int, latency: bool) -> None:
        self.expect = expect
        self.latency = latency
        self.count = 0
        self.first: float | None = None
        self.lat: list[float] = []

    def hit(self, data: bytes, now: float) -> bool:
        """Counts one message; True for the warm-up message."""
        if data.startswith(WARMUP):
            return True
        if self.first is None:
            self.first = now
        self.count += 1
        if self.latency:
            self.lat.append(now - sent_at(data))
        return False

    def result(self, last: float) -> dict[str, Any]:
        out: dict[str, Any] = {"first": self.first, "last": last, "count": self.count}
        if self.latency:
            s = sorted(self.lat)
            out.update(
                p50_ms=percentile(s, 0.50) * 1000,
                p90_ms=percentile(s, 0.90) * 1000,
                p99_ms=percentile(s, 0.99) * 1000,
                max_ms=s[-1] * 1000 if s else float("nan"),
            )
        return out


def child_main() -> None:
    """Entry point of a consumer process (see :class:`Child`)."""
    spec = json.loads(os.environ[CHILD_ENV])
    try:
        if spec["kind"] == "rqueue":
            _child_rqueue(spec)
        else:
            _child_streams(spec)
    except BaseException as exc:  # reported to the parent, which decides
        _say(event="error", error=f"{type(exc).__name__}: {exc}")
        sys.exit(1)


def _child_rqueue(spec: dict[str, Any]) -> None:
    tally = _Tally(spec["expect"], spec["latency"])
    idle_limit = float(spec["idle_timeout"])
    with rqueue.connect(spec["url"], prefix=spec["prefix"]) as client:
        consumer = client.queue(spec["queue"]).consumer(GROUP, name="bench-child")
        consumer.fetch(BATCH, timeout=0.05)  # subscribes to the wake-up channel; the queue is empty
        _say(event="ready")
        idle_since = time.monotonic()
        while tally.count < tally.expect:
            deliveries = consumer.fetch(BATCH, timeout=1.0)
            if not deliveries:
                if time.monotonic() - idle_since > idle_limit:
                    raise BenchError(f"no message for {idle_limit:.0f} s after {tally.count} of {tally.expect}")
                continue
            warm = False
            for d in deliveries:
                warm |= tally.hit(d.data, time.time())
            consumer.ack(deliveries)
            if warm:
                _say(event="warm")
            idle_since = time.monotonic()
        _say(event="done", **tally.result(time.time()))
        consumer.close()


def _child_streams(spec: dict[str, Any]) -> None:
    tally = _Tally(spec["expect"], spec["latency"])
    idle_limit = float(spec["idle_timeout"])
    r = redis.Redis.from_url(spec["url"])
    stream = spec["stream"]
    _say(event="ready")
    idle_since = time.monotonic()
    while tally.count < tally.expect:
        resp = r.xreadgroup(GROUP, "bench-child", {stream: ">"}, count=BATCH, block=1000)
        if not resp or not resp[0][1]:
            if time.monotonic() - idle_since > idle_limit:
                raise BenchError(f"no message for {idle_limit:.0f} s after {tally.count} of {tally.expect}")
            continue
        warm = False
        ids = []
        for eid, fields in resp[0][1]:
            warm |= tally.hit(fields[STREAM_FIELD.encode()], time.time())
            ids.append(eid)
        r.xack(stream, GROUP, *ids)
        if warm:
            _say(event="warm")
        idle_since = time.monotonic()
    _say(event="done", **tally.result(time.time()))
    r.close()


# -- the benchmark -------------------------------------------------------------------


class Bench:
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

    # -- plumbing --------------------------------------------------------------

    def _name(self, what: str) -> str:
        self._counter += 1
        return f"{what}.{self._counter}"

    def queue(self, what: str) -> rqueue.Queue:
        """A queue never used before."""
        return self.client.queue(self._name(what))

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
                _noop(d.data)
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
                _noop(ds[0].data)
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

    def drain_stream(self, key: str, n: int, per_call: int) -> tuple[float, float]:
        """XREADGROUP COUNT per_call + XACK until n entries are consumed;
        returns (wall seconds, client CPU seconds)."""
        r = self.r
        field_name = STREAM_FIELD.encode()
        done = 0
        cpu0, t0 = time.process_time(), time.perf_counter()
        while done < n:
            resp = r.xreadgroup(GROUP, "c1", {key: ">"}, count=per_call)
            if not resp or not resp[0][1]:
                raise BenchError(f"XREADGROUP came back empty after {done} of {n}")
            ids = []
            for eid, fields in resp[0][1]:
                _noop(fields[field_name])
                ids.append(eid)
            r.xack(key, GROUP, *ids)
            done += len(ids)
        return time.perf_counter() - t0, time.process_time() - cpu0

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
                _noop(ds[0].data)
                held[:] = ds
            return time.perf_counter() - t0

        rates = self.interleaved(rq, lambda k: self.drain_stream(key, k, 1)[0], n)
        c.ack(held)
        c.close()
        return rates

    # -- floor: the least any script-based queue pays ------------------------------------

    def floor_script(self, name: str, text: str) -> Script:
        """A probe driven as rqueue drives its own scripts (the client's
        connection pool, EVALSHA, loaded on NOSCRIPT)."""
        return Script(self.client.redis, f"floor-{name}", text, no_retry, self.client.scripts.connections)

    def floor_keys(self, what: str, *names: str) -> list[str]:
        tag = "{" + self._name(what) + "}"
        return [f"{self.prefix}:floor:{tag}:{name}" for name in names]

    def floor_eval(self, n: int) -> tuple[float, float]:
        """An empty script with a queue's publish keys and arguments, and
        XADD, one per call, interleaved."""
        empty = self.floor_script("empty", FLOOR_EMPTY_LUA)
        q = self.queue("floor-eval")
        keys = q.keys
        key_list = [keys.meta, keys.msgs, keys.floors, keys.sched]
        return self.one_per_call(
            lambda i: empty(key_list, ["", "0", "0", keys.wake_channel, "0", "0", payload(i)]), "floor-eval", n
        )

    def floor_publish(self, n: int) -> tuple[float, float]:
        """FLOOR_PUBLISH_LUA and XADD, one per call, interleaved; the probe's
        records are counted afterwards, so a probe that stored nothing fails."""
        publish = self.floor_script("publish", FLOOR_PUBLISH_LUA)
        keys = self.floor_keys("floor-publish", "meta", "msgs")
        rates = self.one_per_call(lambda i: publish(keys, [payload(i)]), "floor-publish", n)
        if self.r.hlen(keys[1]) != n:
            raise BenchError(f"the floor publish probe stored {self.r.hlen(keys[1])} of {n} records")
        return rates

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

    def floor_fetch_ack(self, n: int) -> tuple[float, float]:
        """FLOOR_FETCH_LUA then FLOOR_ACK_LUA, and XREADGROUP COUNT 1 + XACK,
        one message at a time, interleaved, from n messages stored in each.
        Every claim must hand out the next record and every ack end a lease."""
        fetch = self.floor_script("fetch", FLOOR_FETCH_LUA)
        ack = self.floor_script("ack", FLOOR_ACK_LUA)
        keys = self.floor_keys("floor-consume", "meta", "msgs", "lease")
        records = {str(i + 1): payload(i) for i in range(n)}
        items = list(records.items())
        for start in range(0, n, FILL_BATCH):
            self.r.hset(keys[1], mapping=dict(items[start : start + FILL_BATCH]))
        stream = self.stream("floor-consume")
        self.fill_stream(stream, n)
        lease_key = [keys[2]]
        wrong = [0]

        def rq(k: int) -> float:
            t0 = time.perf_counter()
            for _ in range(k):
                seq, rec = fetch(keys, [])
                if ack(lease_key, [seq]) != 1 or rec != records.get(str(seq)):
                    wrong[0] += 1
            return time.perf_counter() - t0

        rates = self.interleaved(rq, lambda k: self.drain_stream(stream, k, 1)[0], n)
        if wrong[0] or self.r.zcard(keys[2]) or int(self.r.hget(keys[0], "cursor") or 0) != n:
            raise BenchError(f"the floor claim probe went wrong: {wrong[0]} bad claims or acks of {n}")
        return rates

    def run_floor(self) -> None:
        n = self.config.single_messages
        for _ in self.runs("floor", f"the least a script call does, one per call, {n:,} calls each"):
            self.record("floor_eval", n, *self.floor_eval(n))
            self.record("floor_publish", n, *self.floor_publish(n))
            self.record("floor_fetch_ack", n, *self.floor_fetch_ack(n))
            self.cleanup()

    # -- end to end and latency (consumer in another process) -------------------------

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

    # -- worker ------------------------------------------------------------------

    def rq_worker(self, n: int) -> tuple[float, dict[str, float]]:
        # A client of its own: the worker's wake-up subscription ends with it.
        with rqueue.connect(self.url, prefix=self.prefix) as client:
            q = client.queue(self._name("worker"))
            self.fill(q, n)
            lock = threading.Lock()
            state: dict[str, Any] = {"count": 0, "first": None, "last": None}
            finished = threading.Event()

            def handler(d: rqueue.Delivery) -> None:
                now = time.time()
                with lock:
                    if state["first"] is None:
                        state["first"] = now
                    state["count"] += 1
                    if state["count"] == n:
                        state["last"] = time.time()
                        finished.set()

            worker = rqueue.Worker(q, GROUP, handler, concurrency=8)
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

    def run_worker(self) -> None:
        n = self.config.messages
        for _ in self.runs("worker", f"Worker, concurrency 8, no-op handler, {n:,} messages"):
            rate, extra = self.rq_worker(n)
            srate, _ = self.st_consume(n, BATCH)
            self.record("worker", n, rate, srate, extra)
            self.cleanup()

    # -- size sweep --------------------------------------------------------------

    def sweep_case(self, case: str) -> tuple[float, dict[str, float]]:
        """fetch(100)+ack throughput of one consumer while the queue holds
        ``depth`` ready messages (topped up between timed chunks) and, for
        "delayed"/"inflight", a mass of delayed or held messages ahead of them."""
        cfg = self.config
        q = self.queue(f"sweep-{case}")
        big = {"max_inflight": HUGE_INFLIGHT, "ack_wait": LONG_WAIT}
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
                    _noop(d.data)
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
            fetch_us += self.usec(mid, *s) - self.usec(before, *s)
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
                _noop(d.data)
            c.ack(ds)
            done += len(ds)
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        b = self.commandstats()
        out["client"] = cpu / n * 1e6
        out["wall"] = elapsed / n * 1e6
        out["fetch_ack_redis"] = (self.usec(b, *s) - self.usec(a, *s)) / n
        c.close()
        return out

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
        for _ in self.runs("cpu", f"INFO commandstats around publish, fetch and ack, {n:,} messages"):
            rq = self.rq_cpu(n)
            self.cleanup()
            st = self.st_cpu(n)
            self.cleanup()
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

    # -- the whole run -----------------------------------------------------------

    def run(self) -> None:
        steps = {
            "publish": self.run_publish,
            "consume": self.run_consume,
            "e2e": self.run_e2e,
            "worker": self.run_worker,
            "latency": self.run_latency,
            "sweep": self.run_sweep,
            "floor": self.run_floor,
            "memory": self.run_memory,
            "cpu": self.run_cpu,
        }
        for group in self.config.groups:
            t0 = time.monotonic()
            try:
                steps[group]()
            except Exception as exc:  # one group failing must not lose the others' figures
                self.errors.append(f"{group}: {type(exc).__name__}: {exc}")
                self.progress.done(f"{group}: FAILED: {type(exc).__name__}: {exc}")
            else:
                self.progress.done(f"{group}: done in {time.monotonic() - t0:.1f} s")
            finally:
                try:
                    self.cleanup()
                except redis.RedisError:
                    pass

    def figures(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        medians = {k: (summary(s.runs) or {}).get("median") for k, s in self.series.items()}
        for spec in SPECS:
            if spec.group not in self.config.groups:
                continue
            s = self.series.get(spec.key, Series())
            mine = summary(s.runs)
            theirs = summary(s.streams) if spec.streams else None
            median = mine["median"] if mine else None
            ratio = None
            if median is not None:
                if spec.ratio_to == "streams" and theirs and theirs["median"]:
                    ratio = median / theirs["median"]
                elif spec.ratio_to == "sweep_base" and medians.get("sweep_base"):
                    ratio = median / medians["sweep_base"]
            out[spec.key] = {
                "group": spec.group,
                "label": spec.label,
                "unit": spec.unit,
                "better": spec.better,
                "median": median,
                "min": mine["min"] if mine else None,
                "max": mine["max"] if mine else None,
                "runs": s.runs,
                "n": s.n,
                "extra": {k: statistics.median(v) for k, v in s.extra.items() if v},
                "streams": ({"label": spec.streams, **theirs} if theirs else None),
                "ratio": ratio,
                "ratio_to": spec.ratio_to,
                "target": (
                    {
                        "text": spec.target.text,
                        "kind": spec.target.kind,
                        "value": spec.target.value,
                        "met": spec.target.met(median, ratio),
                    }
                    if spec.target
                    else None
                ),
            }
        return out


def _glob_escape(text: str) -> str:
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)


# -- output ----------------------------------------------------------------------


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "msg/s":
        return f"{value:,.0f}"
    if unit == "bytes":
        return f"{value:,.1f}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _cell(d: dict[str, Any] | None, unit: str) -> str:
    if not d or d.get("median") is None:
        return "-"
    s = _fmt(d["median"], unit)
    if len(d.get("runs") or []) > 1:
        s += f" [{_fmt(d['min'], unit)}-{_fmt(d['max'], unit)}]"
    return s


def render_text(report: dict[str, Any]) -> str:
    from rqueue.cli import table

    cfg, srv = report["config"], report["server"]
    head = (
        f"rqueue bench on {srv['name']} {srv['version']} at {srv['url']}: {cfg['payload_bytes']}-byte payloads, "
        f"N={cfg['messages']:,} (one per call: {cfg['single_messages']:,}), median of {cfg['runs']} run(s) [min-max]"
    )
    rows = []
    for key, f in report["figures"].items():
        unit = f["unit"]
        ratio = f"{f['ratio']:.2f}x" if f["ratio"] is not None else "-"
        if f["ratio_to"] == "sweep_base" and f["ratio"] is not None:
            ratio += " base"
        target = f["target"]
        met = "-" if not target or target["met"] is None else ("yes" if target["met"] else "NO")
        rows.append(
            [key, unit, _cell(f, unit), _cell(f["streams"], unit), ratio, target["text"] if target else "-", met]
        )
    lines = [
        head,
        "",
        table(["figure", "unit", "rqueue", "Redis Streams (redis-py)", "ratio", "issue-7 target", "met"], rows),
    ]
    figs = report["figures"]
    sweep = cfg["sweep"]
    if "sweep_base" in figs:
        lines.append(
            f"\nsweep: base = {sweep['small']:,} queued; queued = {sweep['queued']:,}; delayed = {sweep['delayed']:,} "
            f"delayed ahead of {sweep['small']:,} queued; inflight = {sweep['inflight']:,} held by another "
            f"consumer; {sweep['timed']:,} timed fetch+ack each"
        )
    if "latency_p50" in figs:
        ex = figs["latency_p50"]["extra"]
        lines.append(
            f"latency: target {cfg['latency_rate']:,} msg/s for {cfg['latency_secs']:g} s; producer reached "
            f"{ex.get('achieved_rate', 0):,.0f}/s (Streams {ex.get('streams_achieved_rate', 0):,.0f}/s)"
        )
    if "cpu_client_us" in figs and figs["cpu_client_us"]["median"] is not None:
        ex = figs["cpu_client_us"]["extra"]
        wall, client, redis_us = ex.get("wall_us"), figs["cpu_client_us"]["median"], ex.get("fetch_ack_redis_us")
        if wall and redis_us is not None:
            lines.append(
                f"fetch(100)+ack per message: {wall:.1f} us wall = {client:.1f} us client CPU + {redis_us:.1f} us "
                f"Redis (EVALSHA) + {max(0.0, wall - client - redis_us):.1f} us other (network, scheduling); "
                f"Streams: {ex.get('streams_wall_us', 0):.1f} us wall, "
                f"{figs['cpu_client_us']['streams']['median']:.1f} us client, "
                f"{ex.get('streams_fetch_ack_redis_us', 0):.1f} us Redis"
            )
    if "memory_per_msg" in figs:
        ex = figs["memory_per_msg"]["extra"]
        if "memory_usage_keys_per_msg" in ex:
            lines.append(
                f"memory: MEMORY USAGE of the queue's keys {ex['memory_usage_keys_per_msg']:.1f} B/msg, "
                f"of the stream {ex.get('streams_memory_usage_keys_per_msg', 0):.1f} B/msg"
            )
    env = report["environment"]
    if env.get("cpu_steal_pct") is not None:
        lines.append(f"CPU steal during the run: {env['cpu_steal_pct']:.0f}%; load average at start {env['loadavg']}")
    for note in report["notes"]:
        lines.append(f"note: {note}")
    for err in report["errors"]:
        lines.append(f"error: {err}")
    lines.append(f"elapsed: {report['elapsed_s']:.0f} s")
    return "\n".join(lines)


# -- the command -------------------------------------------------------------------


def _parse_only(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[str, ...]:
    if not value:
        return ()
    names = tuple(v.strip() for v in value.split(",") if v.strip())
    bad = [n for n in names if n not in GROUPS]
    if bad or not names:
        raise click.BadParameter(f"unknown figure {', '.join(bad) or repr(value)}; choose from {', '.join(GROUPS)}")
    return names


@click.command("bench")
@click.option(
    "--messages",
    "-n",
    type=click.IntRange(100, 10_000_000),
    default=None,
    help="Messages per throughput figure [default: 20000; --quick: 1000]; one-per-call figures use a quarter.",
)
@click.option(
    "--runs",
    "-r",
    type=click.IntRange(1, 100),
    default=None,
    help="Runs per figure; the median and min-max are reported [default: 3; --quick: 1].",
)
@click.option("--quick", is_flag=True, help="Small sizes and one run (for tests and a first look).")
@click.option("--full", is_flag=True, help="The issue's sweep sizes: 10^6 queued, 10^5 delayed, 10^5 in flight.")
@click.option(
    "--only",
    callback=_parse_only,
    default=None,
    metavar="NAME[,NAME]",
    help=f"Only these figures: {', '.join(GROUPS)}.",
)
@click.option(
    "--latency-rate",
    type=click.IntRange(1, 100_000),
    default=1000,
    show_default=True,
    help="Messages per second of the latency figure.",
)
@click.option(
    "--latency-secs",
    type=click.FloatRange(0.1, 600),
    default=None,
    help="Seconds of the latency figure [default: 3; --quick: 0.5].",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (keys in rqueue/bench.py's docstring).")
@click.pass_context
def bench_command(
    ctx: click.Context,
    messages: int | None,
    runs: int | None,
    quick: bool,
    full: bool,
    only: tuple[str, ...],
    latency_rate: int,
    latency_secs: float | None,
    as_json: bool,
) -> None:
    """Measure rqueue against this server: publish, consume, end to end,
    Worker, latency, the size sweep, memory and Redis CPU per message, each
    next to raw redis-py Streams on the same server.

    Uses a key prefix of its own (<prefix>-bench-<random>) and deletes its
    keys afterwards. Progress goes to stderr, the table (or --json) to stdout.
    Benchmark on a server of its own: other traffic skews every figure, and
    the CPU figures run CONFIG RESETSTAT.
    """
    from rqueue.cli import connection  # here: rqueue.cli imports this module

    if quick and full:
        raise click.UsageError("--quick and --full do not go together")
    obj = ctx.obj or {}
    url = obj.get("url")
    if url and url.split("://", 1)[0] == "memory":
        raise rqueue.InvalidInput("rqueue bench needs a Redis server: memory:// runs inside this process")
    config = Config.make(messages, runs, quick, full, only, latency_rate, latency_secs)
    bench_prefix = f"{obj.get('prefix') or 'rq'}-bench-{uuid.uuid4().hex[:8]}"
    progress = Progress()
    started = time.time()
    jiffies0 = _cpu_jiffies()
    loadavg = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    with connection(url, bench_prefix) as client:
        raw_url = url or client.url
        b = Bench(client, raw_url, config, progress)
        try:
            info = b.r.info("server")
            name = "valkey" if info.get("valkey_version") or info.get("server_name") == "valkey" else "redis"
            version = str(info.get("valkey_version") or info.get("redis_version") or "?")
            b.run()
        finally:
            try:
                b.cleanup()
            finally:
                b.r.close()
    jiffies1 = _cpu_jiffies()
    steal = None
    if jiffies0 and jiffies1 and jiffies1[0] > jiffies0[0]:
        steal = (jiffies1[1] - jiffies0[1]) / (jiffies1[0] - jiffies0[0]) * 100
    report = {
        "schema": SCHEMA,
        "server": {"url": client.url, "name": name, "version": version},
        "config": config.as_dict(),
        "environment": {
            "python": platform.python_version(),
            "redis_py": versions()["redis"],
            "hiredis": versions()["hiredis"],
            "nproc": os.cpu_count(),
            "loadavg": round(loadavg, 2) if loadavg is not None else None,
            "cpu_steal_pct": steal,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        },
        "figures": b.figures(),
        "notes": b.notes,
        "errors": b.errors,
        "elapsed_s": time.time() - started,
    }
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo(render_text(report))
    if b.errors:
        click.echo(f"error: {len(b.errors)} figure group(s) failed: " + "; ".join(b.errors), err=True)
        ctx.exit(1)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m rqueue.cli.bench [--url URL] [--prefix P] bench [OPTIONS]``:
    the ``rqueue`` command line, with ``bench`` added when it is not
    registered there yet."""
    from rqueue.cli import cli

    if "bench" not in cli.commands:
        cli.add_command(bench_command)
    cli.main(args=list(argv) if argv is not None else None, prog_name="rqueue")


if __name__ == "__main__":
    main()

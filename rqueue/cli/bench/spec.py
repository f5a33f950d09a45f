"""What the bench measures: the figures (key, group, unit, issue-7 target),
the sizes of a run, the series of measured values, and the payload every
figure publishes. docs/bench.md describes each figure."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import rqueue

SCHEMA = "rqueue-bench/1"
PAYLOAD_BYTES = 100
BATCH = 100  # messages per publish_many / fetch / XADD pipeline / XREADGROUP
FILL_BATCH = 1000  # messages per call when preloading a queue (not timed)
GROUP = "bench"
CONTROL = b"BENCH-CONTROL "  # a message to the consumer process, not a measured one (see child.py)
STREAM_FIELD = "p"
FILLER = b"x" * PAYLOAD_BYTES
INTERLEAVE_CHUNKS = 10  # one-per-call figures: rqueue and Streams take turns, this many each
LATENCY_CALLS_PER_S = 1000  # publish calls per second of the half-rate latency figure (batches above this rate)
LONG_WAIT = 3600.0  # seconds: delay of "delayed" messages, lease of held ones
HUGE_INFLIGHT = 10**9  # max_inflight of the sweep's consumers: never the limit
GROUPS = ("publish", "consume", "e2e", "worker", "latency", "sweep", "floor", "memory", "cpu")


class BenchError(rqueue.RQueueError):
    """A figure could not be measured."""


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
    """One figure: its key in the report, its group (what --only names), how
    it is shown, its Streams counterpart, its target, and what its ratio
    compares with."""

    key: str
    group: str
    label: str
    unit: str
    streams: str | None = None  # label of the Streams counterpart
    target: Target | None = None
    ratio_to: str | None = None  # "streams", another figure's key ("sweep_base", "worker_ref") or None

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
        "worker_ref",
        "worker",
        "fetch(100) + ack(list): the worker figures' reference",
        "msg/s",
    ),
    Spec(
        "worker_msg",
        "worker",
        "Worker, no-op handler, concurrency 8 (vs reference)",
        "msg/s",
        None,
        None,
        "worker_ref",
    ),
    Spec(
        "worker_msg1",
        "worker",
        "Worker, no-op handler, one thread (vs reference)",
        "msg/s",
        None,
        None,
        "worker_ref",
    ),
    Spec(
        "worker_batch",
        "worker",
        "Worker, batch handler of 100, one thread",
        "msg/s",
        None,
        Target(">= 100,000 msg/s", "value_min", 100_000),
        "worker_ref",
    ),
    Spec(
        "worker_aio_batch",
        "worker",
        "aio.Worker, coroutine batch handler of 100, one task",
        "msg/s",
        None,
        Target(">= 100,000 msg/s", "value_min", 100_000),
        "worker_ref",
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
    Spec(
        "latency_wait_p50",
        "latency",
        "the same, the consumer waiting in Redis (wait_in_redis), p50",
        "ms",
        "XADD -> XREADGROUP BLOCK, p50",
        Target("<= 0.5 ms", "value_max", 0.5),
        "streams",
    ),
    Spec(
        "latency_wait_p90",
        "latency",
        "the same, the consumer waiting in Redis (wait_in_redis), p90",
        "ms",
        "XADD -> XREADGROUP BLOCK, p90",
        None,
        "streams",
    ),
    Spec(
        "latency_wait_p99",
        "latency",
        "the same, the consumer waiting in Redis (wait_in_redis), p99",
        "ms",
        "XADD -> XREADGROUP BLOCK, p99",
        Target("<= 0.5 ms", "value_max", 0.5),
        "streams",
    ),
    Spec(
        "latency_wait_max",
        "latency",
        "the same, the consumer waiting in Redis (wait_in_redis), max",
        "ms",
        "XADD -> XREADGROUP BLOCK, max",
        None,
        "streams",
    ),
    Spec(
        "latency_half_p50",
        "latency",
        "publish -> handler start at half the max (e2e) rate, p50",
        "ms",
        "XADD -> XREADGROUP BLOCK at half its own max rate, p50",
        None,
        "streams",
    ),
    Spec(
        "latency_half_p90",
        "latency",
        "publish -> handler start at half the max (e2e) rate, p90",
        "ms",
        "XADD -> XREADGROUP BLOCK at half its own max rate, p90",
        None,
        "streams",
    ),
    Spec(
        "latency_half_p99",
        "latency",
        "publish -> handler start at half the max (e2e) rate, p99",
        "ms",
        "XADD -> XREADGROUP BLOCK at half its own max rate, p99",
        None,
        "streams",
    ),
    Spec(
        "latency_half_max",
        "latency",
        "publish -> handler start at half the max (e2e) rate, max",
        "ms",
        "XADD -> XREADGROUP BLOCK at half its own max rate, max",
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
    # The server process's CPU (INFO cpu) per message in each phase: the
    # whole of each command, where commandstats time its run alone.
    Spec("cpu_proc_publish_us", "cpu", "Redis process CPU/msg, publish_many 100", "usec", "XADD", None, "streams"),
    Spec("cpu_proc_fetch_us", "cpu", "Redis process CPU/msg, fetch(100)", "usec", "XREADGROUP", None, "streams"),
    Spec("cpu_proc_ack_us", "cpu", "Redis process CPU/msg, ack(list of 100)", "usec", "XACK", None, "streams"),
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
    latency_half_secs: float
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
        secs = latency_secs if latency_secs is not None else (0.5 if quick else 3.0)
        return cls(
            messages=n,
            single_messages=max(100, n // 4),
            runs=runs or (1 if quick else 3),
            latency_rate=latency_rate,
            latency_secs=secs,
            # quick: half the max rate is many times --latency-rate, so half the time still gives more samples
            latency_half_secs=secs / 2 if quick else secs,
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
            "latency_half_secs": self.latency_half_secs,
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


def payload(i: int) -> bytes:
    """A 100-byte payload whose first bytes are the publish time (read back
    by consumer_process.sent_at)."""
    head = b"%.6f|%d|" % (time.time(), i)
    return head + FILLER[: PAYLOAD_BYTES - len(head)]


def noop(data: bytes) -> None:
    """The handler of the in-process figures."""
